"""The NRI plugin API: subclass `Plugin`, run it with `Stub`."""

from nri_gpushare.nri.stub.plugin import CreateResult, Event, EventMask, Plugin, PluginError
from nri_gpushare.nri.stub.runtime import Stub
from nri_gpushare.nri.stub.service import PluginService

__all__ = ["CreateResult", "Event", "EventMask", "Plugin", "PluginError", "PluginService", "Stub"]
