"""What the device plugin advertises: per resource, every device and whether
it is healthy, so that the kubelet's allocatable is what the allocator can
still place.

The kubelet admits a container when it has enough devices that are healthy
and not in use; which devices a container holds is its own business, so the
IDs carry no GPU.  For each resource this reports as healthy

- the IDs live containers hold (``kubelet`` in the daemon's status), and the
  IDs recent ``Allocate`` calls handed out whose containers do not exist yet
  (`Grant`, kept by the plugin): the kubelet counts them as in use anyway;
- plus as many other IDs, lowest first, as the allocator can still place
  (`free_units`),

and every other ID unhealthy.  The kubelet's allocatable for new containers
is then exactly the free amount, and the scheduler, which subtracts the
requests of the pods already on the node from the allocatable, sees the same
(or less, for a pod whose container is restarting: its share is released
while it is down, but the scheduler still counts it).

Free amounts come from the daemon's view of every GPU (`status_document`),
so shares asked for any other way (containers started by hand, pod
annotations where allowed), ``memory_reserve`` and ``max_inst`` all come off
them.  Per GPU, whole GiB: ``floor(free memory / 1 GiB)``, and a GPU counts
only when it is healthy, has a free container slot and at least 1 GiB free.
On a node with one GPU these numbers are exact.  With several they are sums,
and a request that fits the sum need not fit one GPU: the fragmentation cases
docs/kubernetes.md lists.

When the daemon cannot be reached nothing is free: every device is listed
(from the node's inventory) as unhealthy, and running containers keep
theirs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from nri_gpushare.names import CORE, COUNT, MEMORY, RESOURCES
from nri_gpushare.share.ids import MAX_ID, BadIds, device_id, parse_ids
from nri_gpushare.share.model import Gpu

GIB = 1 << 30
CORE_PER_GPU = 100


class Device(NamedTuple):
    id: str
    healthy: bool


@dataclass(frozen=True)
class Grant:
    """One container's IDs of one resource, from one Allocate call."""

    short: str  # MEMORY, CORE or COUNT
    ids: frozenset[int]
    slot: bool = True
    """Whether it needs a container slot (max_inst) too: not when it is the
    IDs of a container that stopped (see `nri_gpushare.k8s.state`)."""


@dataclass(frozen=True)
class GpuRoom:
    """One GPU as the device plugin counts it."""

    index: int
    units: int  # whole GiB it can ever share: floor((total - reserve) / GiB)
    free_gib: int  # whole GiB free now
    core_free: int  # percent
    slots: int  # containers it can still take (max_inst)


def memory_units(memory_bytes: int, reserve_bytes: int) -> int:
    """Whole GiB a GPU of `memory_bytes` shares after `reserve_bytes`."""
    return max(0, memory_bytes - reserve_bytes) // GIB


def live_ids(status: Mapping[str, Any]) -> dict[str, frozenset[int]]:
    """Resource -> the IDs live allocations hold, from the status document.
    Text that does not parse is skipped (the daemon wrote it; an old daemon
    writes none)."""
    held: dict[str, set[int]] = {short: set() for short in RESOURCES}
    for alloc in status.get("allocations", ()):
        kubelet = alloc.get("kubelet") if isinstance(alloc, Mapping) else None
        if not isinstance(kubelet, Mapping):
            continue
        for short, text in kubelet.items():
            if short in held and isinstance(text, str):
                try:
                    held[short] |= parse_ids(text)
                except BadIds:
                    continue
    return {short: frozenset(ids) for short, ids in held.items()}


def rooms(
    status: Mapping[str, Any], max_inst: int, unhealthy: Collection[int] = ()
) -> list[GpuRoom]:
    """Every GPU of the status document; an unhealthy one has no room.
    `max_inst` counts where the document does not say (an older daemon)."""
    max_inst = int(status.get("policy", {}).get("max_inst", max_inst))
    out = []
    for g in status.get("gpus", ()):
        index = int(g["index"])
        units = memory_units(int(g["memory_total"]), int(g.get("memory_reserved", 0)))
        ok = index not in unhealthy
        out.append(
            GpuRoom(
                index=index,
                units=units,
                free_gib=min(units, int(g["memory_free"]) // GIB) if ok else 0,
                core_free=max(0, CORE_PER_GPU - int(g.get("core_allocated", 0))) if ok else 0,
                slots=max(0, max_inst - len(g.get("containers", ()))) if ok else 0,
            )
        )
    return out


def free_units(room: Sequence[GpuRoom], pending: Iterable[Grant] = ()) -> dict[str, int]:
    """Resource -> how much more the node can place, after `pending` grants
    (whose containers do not hold their share yet)."""
    return _room(room, pending)[0]


def _room(
    room: Sequence[GpuRoom], pending: Iterable[Grant]
) -> tuple[dict[str, int], dict[str, int]]:
    """(free after the pending grants, how much of the pending grants the
    node still has room for) per resource."""
    usable = [r for r in room if r.slots > 0 and r.free_gib >= 1]
    free = {
        MEMORY: sum(r.free_gib for r in usable),
        CORE: sum(r.core_free for r in usable),
        COUNT: len(usable),
    }
    waiting = {short: 0 for short in RESOURCES}
    containers = 0
    for grant in pending:
        waiting[grant.short] += len(grant.ids)
        containers += grant.short == MEMORY and grant.slot  # a container asks memory once
    # gpu-count is held for as long as the pod lives, not used up per GPU.
    backed = {
        short: (min(n, free[short]) if short != COUNT else n) if usable else 0
        for short, n in waiting.items()
    }
    if containers >= sum(r.slots for r in usable):
        return {short: 0 for short in RESOURCES}, backed
    left = {
        short: max(0, n - (waiting[short] if short != COUNT else 0)) for short, n in free.items()
    }
    return left, backed


def totals(room: Sequence[GpuRoom]) -> dict[str, int]:
    """Resource -> how many devices the node lists (its capacity); ValueError
    past the IDs there are (a garbled document must not make a list of 10^20)."""
    count = {
        MEMORY: sum(r.units for r in room),
        CORE: CORE_PER_GPU * len(room),
        COUNT: len(room),
    }
    for short, n in count.items():
        if n > MAX_ID + 1:
            raise ValueError(f"{n} {short} devices are more than the {MAX_ID + 1} IDs there are")
    return count


def advertise(
    status: Mapping[str, Any] | None,
    inventory: Sequence[Gpu],
    memory_reserve_bytes: int,
    max_inst: int,
    pending: Iterable[Grant] = (),
    unhealthy: Collection[int] = (),
) -> dict[str, tuple[Device, ...]]:
    """Resource -> the full device list for ListAndWatch.

    `status`: the daemon's status document (None: it cannot be reached);
    `inventory` and `memory_reserve_bytes` list the devices when it is None,
    `max_inst` is used when the document does not give it; `pending`: grants
    from recent Allocate calls (those already live in `status` count once);
    `unhealthy`: GPU indexes NVML reports bad."""
    if status is None:
        count = totals(
            [
                GpuRoom(g.index, memory_units(g.memory_bytes, memory_reserve_bytes), 0, 0, 0)
                for g in inventory
            ]
        )
        return {short: _devices(n, frozenset(), frozenset(), 0, 0) for short, n in count.items()}
    held = live_ids(status)
    # A grant whose container is live already counts in the status's figures.
    pending = [g for g in pending if g.short in held and not g.ids & held[g.short]]
    room = rooms(status, max_inst, unhealthy)
    count = totals(room)
    free, backed = _room(room, pending)
    out = {}
    for short, n in count.items():
        waiting = frozenset().union(*(g.ids for g in pending if g.short == short)) - held[short]
        out[short] = _devices(n, held[short], waiting, backed[short], free[short])
    return out


def _devices(
    total: int, live: frozenset[int], waiting: frozenset[int], backed: int, free: int
) -> tuple[Device, ...]:
    """IDs 0..total-1: healthy are those live containers hold, the lowest
    `backed` of those pending grants hold, and the lowest `free` others.

    A pending grant whose pod the kubelet deleted leaves IDs the kubelet may
    hand out again: they are healthy only as far as the node has room for
    them (`backed`), or a share taken meanwhile another way would be
    admitted twice."""
    devices = []
    for n in range(total):
        if n in live:
            healthy = True
        elif n in waiting:
            healthy = backed > 0
            backed -= healthy
        else:
            healthy = free > 0
            free -= healthy
        devices.append(Device(device_id(n), healthy))
    return tuple(devices)
