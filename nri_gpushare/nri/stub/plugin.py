"""The plugin API: a handler class that implements only the events it needs.

Shaped like the NRI Go stub: subclass `Plugin`, override the event methods you
care about, hand an instance to `nri_gpushare.nri.stub.Stub`.  The event
subscription sent to the runtime follows from which methods are overridden,
so a plugin never receives (or pays for) an event it does not handle;
`configure()` may narrow it by returning its own mask.

Handlers get light views of the pod and container (`nri_gpushare.nri.api.lite`:
ids, names, labels, annotations, env, cgroup path), decoded by hand in tens of
microseconds; `view.message()` parses the full NRI message with betterproto
when a handler needs more (it costs milliseconds).  CreateContainer may answer
with a `lite.Adjustment` (fast) or an `nri.ContainerAdjustment`, optionally
paired with updates to other containers.  Raising `PluginError` fails the
request with that message; for CreateContainer the message reaches the CRI
caller (`kubectl describe`), so write it for a human.  In
ValidateContainerAdjustment a `PluginError` rejects the adjustment instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TypeAlias

from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import Adjustment, ValidateAdjustmentRequestView
from nri_gpushare.nri.api.lite import ContainerView as Container
from nri_gpushare.nri.api.lite import PodSandboxView as Pod
from nri_gpushare.nri.stub.events import (
    ALL_MASK,
    EVENTS,
    LEGACY_MASK,
    Event,
    describe_mask,
    event_bit,
)

__all__ = [
    "CreateResult",
    "Event",
    "EventMask",
    "Plugin",
    "PluginError",
    "event_bit",
    "event_mask",
    "implemented_events",
    "subscription_mask",
    "valid_event_mask",
]

AnyAdjustment: TypeAlias = Adjustment | nri.ContainerAdjustment
CreateResult: TypeAlias = (
    AnyAdjustment | tuple[AnyAdjustment | None, Sequence[nri.ContainerUpdate]] | None
)
"""What create_container returns: an adjustment, or (adjustment or None,
updates of other containers), or None for no change."""
EventMask: TypeAlias = int | Iterable[Event]
"""A subscription: a bit mask (bit event - 1) or the events themselves."""


class PluginError(Exception):
    """A refusal to report to the runtime with this message."""


class Plugin:
    """Base class for NRI plugins.  Every method is optional."""

    # -- lifecycle (always delivered) --------------------------------------

    async def configure(
        self, config: str, runtime_name: str, runtime_version: str
    ) -> EventMask | None:
        """Called once per connection, before Synchronize.

        Return None to subscribe to every event this class handles (that the
        runtime offers), or a mask / events to subscribe to fewer; a returned
        subscription may name only handled events the runtime offers.  The
        runtime's timeouts are on the stub (`Stub.request_timeout`).
        """
        return None

    async def synchronize(
        self, pods: list[Pod], containers: list[Container]
    ) -> list[nri.ContainerUpdate]:
        """The runtime's current pods and containers, after every (re)connect."""
        return []

    def synchronize_part(self, pods: list[Pod], containers: list[Container]) -> bool:
        """A Synchronize request with `more` set (the runtime splits a big one),
        before the last.  Return True when the plugin has kept what it needs of
        these views: `synchronize` then gets only the last request's pods and
        containers, and these views (with the request's bytes they hold) are
        freed at once.  By default False: `synchronize` gets every pod and
        container.  Synchronous: it runs inside the runtime's deadline."""
        return False

    async def shutdown(self) -> None:
        """The runtime is shutting down (the connection will close)."""

    # -- pod events ---------------------------------------------------------

    async def run_pod_sandbox(self, pod: Pod) -> None:
        return None

    async def update_pod_sandbox(
        self,
        pod: Pod,
        overhead: nri.LinuxResources | None,
        resources: nri.LinuxResources | None,
    ) -> None:
        """The pod's resources change (NRI v0.10+); `pod` has the old ones."""
        return None

    async def post_update_pod_sandbox(self, pod: Pod) -> None:
        """NRI v0.10+."""
        return None

    async def stop_pod_sandbox(self, pod: Pod) -> None:
        return None

    async def remove_pod_sandbox(self, pod: Pod) -> None:
        return None

    # -- container events ---------------------------------------------------

    async def create_container(self, pod: Pod, container: Container) -> CreateResult:
        return None

    async def post_create_container(self, pod: Pod, container: Container) -> None:
        return None

    async def start_container(self, pod: Pod, container: Container) -> None:
        return None

    async def post_start_container(self, pod: Pod, container: Container) -> None:
        return None

    async def update_container(
        self, pod: Pod, container: Container, resources: nri.LinuxResources
    ) -> list[nri.ContainerUpdate]:
        return []

    async def post_update_container(self, pod: Pod, container: Container) -> None:
        return None

    async def stop_container(self, pod: Pod, container: Container) -> list[nri.ContainerUpdate]:
        return []

    async def remove_container(self, pod: Pod, container: Container) -> None:
        return None

    # -- validation ---------------------------------------------------------

    async def validate_container_adjustment(
        self, pod: Pod, container: Container, request: ValidateAdjustmentRequestView
    ) -> None:
        """Judge the combined adjustment of all plugins (NRI v0.10+): raise
        `PluginError` to reject it, with the reason.  `request.message()` has
        the adjustment, the updates, which plugin set what, and the plugins."""
        return None


def implemented_events(plugin: Plugin) -> set[Event]:
    """The events whose handler the plugin's class overrides."""
    cls = type(plugin)
    return {
        spec.event
        for spec in EVENTS
        if getattr(cls, spec.handler) is not getattr(Plugin, spec.handler)
    }


def event_mask(events: EventMask) -> int:
    """A subscription as a bit mask."""
    if isinstance(events, int):
        return events
    mask = 0
    for event in events:
        mask |= event_bit(event)
    return mask


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
    if nri_version:
        return ALL_MASK
    if runtime_name == "containerd" and _major_minor(runtime_version) >= (2, 2):
        return ALL_MASK
    return LEGACY_MASK


def subscription_mask(plugin: Plugin, valid_mask: int, requested: EventMask | None = None) -> int:
    """The mask sent in ConfigureResponse; never 0, which would mean "all".

    Without `requested` (what `configure()` returned), the events the plugin
    handles that the runtime offers.  A requested mask must name only events
    the plugin handles and the runtime offers.
    """
    handled = event_mask(implemented_events(plugin))
    if requested is None:
        mask = handled & valid_mask
        if mask == 0:
            raise PluginError("plugin handles no event this runtime can deliver")
        return mask
    mask = event_mask(requested)
    if mask == 0:
        raise PluginError("configure() subscribed to no event")
    if mask & ~handled:
        raise PluginError(
            f"configure() subscribed to events without a handler: {describe_mask(mask & ~handled)}"
        )
    if mask & ~valid_mask:
        raise PluginError(
            "configure() subscribed to events this runtime does not offer:"
            f" {describe_mask(mask & ~valid_mask)}"
        )
    return mask
