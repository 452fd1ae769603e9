"""The NRI events, once: which `Plugin` method handles each, which RPC of the
plugin service delivers it, and what the handler is given.

Both the plugin's subscription (which handlers a plugin overrides, hence which
event bits it sets) and the stub's RPC map are built from `EVENTS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias

from nri_gpushare.nri.api import nri

Event: TypeAlias = nri.Event
"""NRI's event numbers (the generated enum); a subscription sets 1 << (event - 1)."""


class Delivery(Enum):
    NOTIFY = "notify"
    """No reply data: a per-event RPC from NRI v0.12 (answered Unimplemented
    when the plugin has no handler, so the runtime falls back), StateChange before."""
    RPC = "rpc"
    """Always the event's own RPC, never StateChange; its reply may carry the
    plugin's answer."""


@dataclass(frozen=True, slots=True)
class EventSpec:
    event: Event
    handler: str
    """The `Plugin` method that handles it."""
    rpc: str
    """The plugin-service method that delivers it."""
    delivery: Delivery
    pod_only: bool = False
    """The handler takes (pod) rather than (pod, container, ...)."""
    since: str = ""
    """The first NRI release that has it (empty: every release containerd 1.7 ships)."""

    @property
    def bit(self) -> int:
        return event_bit(self.event)


def event_bit(event: Event) -> int:
    return 1 << (int(event) - 1)


_N, _R = Delivery.NOTIFY, Delivery.RPC

EVENTS: tuple[EventSpec, ...] = (
    EventSpec(Event.RUN_POD_SANDBOX, "run_pod_sandbox", "RunPodSandbox", _N, pod_only=True),
    EventSpec(Event.STOP_POD_SANDBOX, "stop_pod_sandbox", "StopPodSandbox", _N, pod_only=True),
    EventSpec(
        Event.REMOVE_POD_SANDBOX, "remove_pod_sandbox", "RemovePodSandbox", _N, pod_only=True
    ),
    EventSpec(Event.CREATE_CONTAINER, "create_container", "CreateContainer", _R),
    EventSpec(Event.POST_CREATE_CONTAINER, "post_create_container", "PostCreateContainer", _N),
    EventSpec(Event.START_CONTAINER, "start_container", "StartContainer", _N),
    EventSpec(Event.POST_START_CONTAINER, "post_start_container", "PostStartContainer", _N),
    EventSpec(Event.UPDATE_CONTAINER, "update_container", "UpdateContainer", _R),
    EventSpec(Event.POST_UPDATE_CONTAINER, "post_update_container", "PostUpdateContainer", _N),
    EventSpec(Event.STOP_CONTAINER, "stop_container", "StopContainer", _R),
    EventSpec(Event.REMOVE_CONTAINER, "remove_container", "RemoveContainer", _N),
    EventSpec(
        Event.UPDATE_POD_SANDBOX,
        "update_pod_sandbox",
        "UpdatePodSandbox",
        _R,
        pod_only=True,
        since="v0.10",
    ),
    EventSpec(
        Event.POST_UPDATE_POD_SANDBOX,
        "post_update_pod_sandbox",
        "PostUpdatePodSandbox",
        _N,
        pod_only=True,
        since="v0.10",
    ),
    EventSpec(
        Event.VALIDATE_CONTAINER_ADJUSTMENT,
        "validate_container_adjustment",
        "ValidateContainerAdjustment",
        _R,
        since="v0.10",
    ),
)

BY_EVENT: dict[int, EventSpec] = {int(spec.event): spec for spec in EVENTS}
BY_RPC: dict[str, EventSpec] = {spec.rpc: spec for spec in EVENTS}

LEGACY_MASK = sum(spec.bit for spec in EVENTS if not spec.since)
"""Events 1..11: what runtimes up to NRI v0.8 accept (0x7FF)."""
ALL_MASK = sum(spec.bit for spec in EVENTS)
"""Events 1..14: NRI v0.10 and later (0x3FFF)."""


def describe_mask(mask: int) -> str:
    """The event names in a mask, for messages ("CREATE_CONTAINER|STOP_CONTAINER")."""
    names = [spec.event.name for spec in EVENTS if mask & spec.bit]
    unknown = mask & ~ALL_MASK
    if unknown:
        names.append(f"{unknown:#x}")
    return "|".join(names) or "none"
