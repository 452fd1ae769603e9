"""The NRI plugin API: subclass `Plugin`, run it with `Stub`."""

from nri_gpushare.stub.plugin import Event, Plugin, PluginError
from nri_gpushare.stub.runtime import Stub

__all__ = ["Event", "Plugin", "PluginError", "Stub"]
