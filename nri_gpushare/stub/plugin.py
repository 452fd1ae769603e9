"""The plugin API: a handler class that implements only the events it needs.

Shaped like the NRI Go stub: subclass `Plugin`, override the event methods you
care about, hand an instance to `nri_gpushare.stub.Stub`.  The event
subscription sent to the runtime follows from which methods are overridden,
so a plugin never receives (or pays for) an event it does not handle.

Handlers get light views of the pod and container (`nri_gpushare.api.lite`:
ids, names, labels, annotations, env, cgroup path), decoded by hand in tens of
microseconds; `view.message()` parses the full NRI message with betterproto
when a handler needs more (it costs milliseconds).  CreateContainer may answer
with a `lite.Adjustment` (fast) or an `nri.ContainerAdjustment`.  Raising
`PluginError` fails the request with that message; for CreateContainer the
message reaches the CRI caller (`kubectl describe`), so write it for a human.
"""

from __future__ import annotations

import re

from nri_gpushare.api import nri
from nri_gpushare.api.lite import Adjustment
from nri_gpushare.api.lite import ContainerView as Container
from nri_gpushare.api.lite import PodSandboxView as Pod

# NRI's event numbers (the generated enum); a subscription sets 1 << (event - 1).
Event = nri.Event


def event_bit(event: Event) -> int:
    return 1 << (event - 1)


class PluginError(Exception):
    """A refusal to report to the runtime with this message."""


class Plugin:
    """Base class for NRI plugins.  Every method is optional."""

    # -- lifecycle (always delivered) --------------------------------------

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        """Called once per connection, before Synchronize."""

    async def synchronize(
        self, pods: list[Pod], containers: list[Container]
    ) -> list[nri.ContainerUpdate]:
        """The runtime's current pods and containers, after every (re)connect."""
        return []

    async def shutdown(self) -> None:
        """The runtime is shutting down (the connection will close)."""

    # -- pod events ---------------------------------------------------------

    async def run_pod_sandbox(self, pod: Pod) -> None: ...

    async def stop_pod_sandbox(self, pod: Pod) -> None: ...

    async def remove_pod_sandbox(self, pod: Pod) -> None: ...

    # -- container events ---------------------------------------------------

    async def create_container(
        self, pod: Pod, container: Container
    ) -> Adjustment | nri.ContainerAdjustment | None: ...

    async def post_create_container(self, pod: Pod, container: Container) -> None: ...

    async def start_container(self, pod: Pod, container: Container) -> None: ...

    async def post_start_container(self, pod: Pod, container: Container) -> None: ...

    async def update_container(
        self, pod: Pod, container: Container, resources: nri.LinuxResources
    ) -> list[nri.ContainerUpdate]: ...

    async def post_update_container(self, pod: Pod, container: Container) -> None: ...

    async def stop_container(self, pod: Pod, container: Container) -> list[nri.ContainerUpdate]: ...

    async def remove_container(self, pod: Pod, container: Container) -> None: ...


# Which handler method serves which event.
HANDLERS: dict[Event, str] = {
    Event.RUN_POD_SANDBOX: "run_pod_sandbox",
    Event.STOP_POD_SANDBOX: "stop_pod_sandbox",
    Event.REMOVE_POD_SANDBOX: "remove_pod_sandbox",
    Event.CREATE_CONTAINER: "create_container",
    Event.POST_CREATE_CONTAINER: "post_create_container",
    Event.START_CONTAINER: "start_container",
    Event.POST_START_CONTAINER: "post_start_container",
    Event.UPDATE_CONTAINER: "update_container",
    Event.POST_UPDATE_CONTAINER: "post_update_container",
    Event.STOP_CONTAINER: "stop_container",
    Event.REMOVE_CONTAINER: "remove_container",
}


def implemented_events(plugin: Plugin) -> set[Event]:
    """The events whose handler the plugin's class overrides."""
    cls = type(plugin)
    return {
        event
        for event, method in HANDLERS.items()
        if getattr(cls, method) is not getattr(Plugin, method)
    }


def _major_minor(version: str) -> tuple[int, int]:
    match = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def valid_event_mask(runtime_name: str, runtime_version: str, nri_version: str = "") -> int:
    """The events this runtime accepts in a subscription.

    Bits outside the runtime's set make Configure fail, so be conservative:
    the validation-era events (12-14) only where the runtime is known to
    speak NRI v0.10 or later (containerd 2.2+, or any runtime that reports
    an NRI version, which only v0.12+ does).
    """
    legacy = (1 << 11) - 1  # events 1..11: NRI up to v0.8
    modern = (1 << 14) - 1  # events 1..14: NRI v0.10+
    if nri_version:
        return modern
    if runtime_name == "containerd" and _major_minor(runtime_version) >= (2, 2):
        return modern
    return legacy


def subscription_mask(plugin: Plugin, valid_mask: int) -> int:
    """The mask sent in ConfigureResponse; never 0, which would mean "all"."""
    mask = 0
    for event in implemented_events(plugin):
        mask |= event_bit(event)
    mask &= valid_mask
    if mask == 0:
        raise PluginError("plugin handles no event this runtime can deliver")
    return mask
