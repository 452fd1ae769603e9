"""The NRI plugin API: subclass `Plugin`, run it with `Stub`."""

from nri_gpushare.stub.plugin import CreateResult, Event, EventMask, Plugin, PluginError
from nri_gpushare.stub.runtime import Stub
from nri_gpushare.stub.service import PluginService

__all__ = ["CreateResult", "Event", "EventMask", "Plugin", "PluginError", "PluginService", "Stub"]
