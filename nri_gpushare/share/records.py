"""The daemon's own record of allocations, and recovery from it.

After a restart the plugin rebuilds its table only from what it or the kernel
module wrote: the module's registry when the module is loaded, else the
records the daemon saved (a state file it alone can write, see
`nri_gpushare.host.statefile`), each cross-checked against the runtime's live
containers.  Nothing a container carries is ever taken as a grant; its
``gpushare.io/assigned`` annotation is only compared: a live container that
does not carry exactly what the plugin gave it was created without the
plugin's adjustment (containerd gave up waiting and failed open), so it holds
no share, whatever was recorded (a check that can only take a share away).

The records are a journal of JSON lines, keys sorted: a header, then one
line per change, applied in order; a snapshot is a header and one ``add`` per
allocation, rewritten at Synchronize and every `COMPACT_AFTER` changes (an
appended line is all a create or release costs).  A line that does not parse (the torn end of a
write cut short) is logged and skipped::

    {"version":1}
    {"add":{"container_id":"...","gpus":[{"core":30,"index":0,"memory":2147483648,
     "uuid":"GPU-..."}],"interposer":true,"isolation":"full","name":"main","pod":"ns/name",
     "priority":"normal"}}
    {"del":"..."}

``interposer`` (whether libgpushare.so was injected) is left out when false.
A container asked for outside NRI (`Allocation.local`) also has ``origin``
("cdi" or "runc") and its containerd ``namespace``.  A pod that asked with
``resources.limits`` has ``kubelet``, the device IDs the kubelet gave it per
resource (``{"gpu-memory": "0-7"}``), read as empty when garbled (logged;
recovery takes them from the container's annotations); where the module's
registration wins over a record, the record's IDs stay.  A container holding
a DRA claim's share has ``claim``, its UID.  Absent keys read as empty.

A resize (`nri-gpushare resize`) appends the allocation's new ``add`` line
(the replay keeps the last), with ``assigned``: the ``gpushare.io/assigned``
annotation the container was created with, which recovery compares instead.

This module is pure: text in, text out; the store does the I/O.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from nri_gpushare.names import ASSIGNED, RESOURCES
from nri_gpushare.share.ids import format_ids, parse_ids
from nri_gpushare.share.kernel import Registration
from nri_gpushare.share.kmod_link import registered_as
from nri_gpushare.share.model import (
    ISOLATIONS,
    ORIGINS,
    PRIORITIES,
    Allocation,
    ContainerInfo,
    Gpu,
    GpuShare,
    Priority,
)
from nri_gpushare.share.plan import assigned_annotation, share_json

log = logging.getLogger(__name__)

VERSION = 1
MAX_MEMORY = 1 << 60  # more than any GPU: a bound, so a record is never absurd
MAX_ASSIGNED = 64 << 10  # an annotation of 64 GPUs is a few KiB
COMPACT_AFTER = 1000
"""Changes appended before the journal is rewritten as a snapshot."""


class AllocationStore(Protocol):
    """Where the records live between runs."""

    def load(self) -> str | None:
        """Everything written; None when there is none (or it cannot be trusted)."""

    def replace(self, text: str) -> None:
        """Replace the records atomically with `text`; raises OSError."""

    def append(self, text: str) -> None:
        """Add whole lines at the end; raises OSError."""


class MemoryStore:
    """Records kept in memory only (tests; a daemon without a state directory)."""

    def __init__(self, text: str | None = None) -> None:
        self.text = text

    def load(self) -> str | None:
        return self.text

    def replace(self, text: str) -> None:
        self.text = text

    def append(self, text: str) -> None:
        self.text = (self.text or "") + text


class Journal:
    """The records kept as a journal: each change appended to `store`, the
    whole table (`current`) rewritten every `COMPACT_AFTER` changes."""

    def __init__(self, store: AllocationStore, current: Callable[[], Iterable[Allocation]]) -> None:
        self.store = store
        self.current = current
        self.changes = 0  # lines appended since the last snapshot

    def append(self, line: str) -> None:
        """Append a change, compacting now and then; raises OSError."""
        if self.changes >= COMPACT_AFTER:
            self.rewrite()
        self.store.append(line)
        self.changes += 1

    def rewrite(self) -> None:
        """Rewrite the records as the table; raises OSError."""
        self.store.replace(snapshot(self.current()))
        self.changes = 0

    def or_log(self, write: Callable[[], None]) -> None:
        """`write`, its OSError logged: stale records are harmless, since
        recovery checks them against live containers."""
        try:
            write()
        except OSError as e:
            log.error("cannot record allocations: %s", e)


def _line(data: object) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


_HEADER = _line({"version": VERSION})


def added(a: Allocation) -> str:
    """The journal line recording a new allocation."""
    entry: dict[str, Any] = {
        "container_id": a.container_id,
        "name": a.name,
        "pod": a.pod,
        "priority": a.priority,
        "isolation": a.isolation,
        "gpus": [share_json(s) for s in a.shares],
    }
    if a.interposer:
        entry["interposer"] = True
    if a.origin:
        entry["origin"] = a.origin
        entry["namespace"] = a.namespace
    if a.kubelet:
        entry["kubelet"] = dict(a.kubelet)
    if a.assigned:
        entry["assigned"] = a.assigned
    if a.claim:
        entry["claim"] = a.claim
    return _line({"add": entry})


def removed(container_id: str) -> str:
    """The journal line recording a release."""
    return _line({"del": container_id})


def snapshot(allocations: Iterable[Allocation]) -> str:
    """A whole journal holding exactly `allocations`."""
    return _HEADER + "".join(added(a) for a in sorted(allocations, key=lambda a: a.container_id))


def decode(text: str, gpus: Sequence[Gpu]) -> dict[str, Allocation]:
    """Container ID -> allocation, the journal replayed; a bad line is logged
    and skipped, a journal of another version gives nothing.  Never raises."""
    by_uuid = {g.uuid: g for g in gpus}
    out: dict[str, Allocation] = {}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError("not one operation")
            if "version" in entry:
                if entry["version"] != VERSION:
                    log.error("allocation records of version %.20r: not read", entry["version"])
                    return {}
            elif "del" in entry:
                if not isinstance(entry["del"], str):
                    raise TypeError("del is not a container ID")
                out.pop(entry["del"], None)
            else:
                alloc = _allocation(entry["add"], by_uuid)
                out[alloc.container_id] = alloc
        except Exception as e:  # the line may hold anything
            log.error("allocation record on line %d left out (%s): %.200r", number, e, line)
    return out


def _allocation(entry: Any, by_uuid: Mapping[str, Gpu]) -> Allocation:
    def text(key: str) -> str:
        value = entry[key]
        if not isinstance(value, str):
            raise TypeError(f"{key} is not a string")
        return value

    def number(share: Any, key: str, low: int, high: int) -> int:
        value = share[key]
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"{key} out of range")
        return value

    shares = []
    for share in entry["gpus"]:
        uuid = share["uuid"]
        gpu = by_uuid.get(uuid)
        if gpu is None:
            raise ValueError(f"GPU {uuid!r:.60} is not on this node")
        memory = number(share, "memory", 1, MAX_MEMORY)
        shares.append(GpuShare(gpu.index, gpu.uuid, memory, number(share, "core", 0, 100)))
    priority, isolation = text("priority"), text("isolation")
    if priority not in PRIORITIES or isolation not in ISOLATIONS or not shares:
        raise ValueError("bad priority, isolation or GPU list")
    cid = text("container_id")
    if not cid:
        raise ValueError("no container ID")
    interposer = entry.get("interposer", False)
    if type(interposer) is not bool:
        raise TypeError("interposer is not true or false")
    origin = entry.get("origin", "")
    if origin not in ORIGINS:
        raise ValueError("bad origin")
    namespace = text("namespace") if origin else ""
    assigned = text("assigned") if "assigned" in entry else ""
    claim = text("claim") if "claim" in entry else ""
    if len(assigned) > MAX_ASSIGNED or len(claim) > 128:
        raise ValueError("assigned or claim is too long")
    return Allocation(
        cid,
        text("name"),
        text("pod"),
        tuple(shares),
        priority,
        isolation,
        interposer,
        origin,
        namespace,
        _kubelet_ids(entry.get("kubelet", {}), cid),
        assigned,
        claim,
    )


def _kubelet_ids(kubelet: Any, cid: str) -> dict[str, str]:
    """A record's device IDs, canonical; {} (logged) when they are garbled.

    The IDs are only what the device plugin reads back, so a bad value costs
    them, not the share: dropping the whole record would forget a share the
    container still holds (nothing else keeps it without the kernel module),
    and recovery takes the IDs from the container's annotations instead."""
    try:
        if not isinstance(kubelet, dict) or not all(
            short in RESOURCES and isinstance(ids, str) for short, ids in kubelet.items()
        ):
            raise ValueError("not resource names and ID ranges")
        return {short: format_ids(parse_ids(ids)) for short, ids in sorted(kubelet.items())}
    except ValueError as e:
        log.error(
            "allocation record of container %.80r: its kubelet device IDs are left out (%s): "
            "%.200r",
            cid,
            e,
            kubelet,
        )
        return {}


def from_registration(
    c: ContainerInfo, registration: Registration, gpus: Sequence[Gpu]
) -> Allocation | None:
    """The allocation the module's registration describes; None when it names
    GPUs this node does not have.  GPUs that disagree on high priority (a
    priority change cut short) give "normal": resync writes it back."""
    by_index = {g.index: g for g in gpus}
    regs = registration.quotas
    if unknown := [q.gpu_index for q in regs if q.gpu_index not in by_index]:
        log.warning("%s: registered on unknown GPUs %s; ignored", c.describe(), unknown)
        return None
    shares = tuple(
        GpuShare(q.gpu_index, by_index[q.gpu_index].uuid, q.memory_bytes, q.core_percent)
        for q in regs
    )
    return Allocation(c.id, c.name, c.pod, shares, _priority(registration, "normal"), "full")


def _priority(registration: Registration, mixed: Priority) -> Priority:
    """The registration's priority; `mixed` when its GPUs disagree."""
    high = {q.high_priority for q in registration.quotas}
    if len(high) != 1:
        return mixed
    return "high" if high == {True} else "normal"


def recover(
    c: ContainerInfo,
    record: Allocation | None,
    registration: Registration | None,
    gpus: Sequence[Gpu],
) -> Allocation | None:
    """A live container's allocation, from what the plugin or the module wrote.

    The module's registration wins when it is there; the record supplies what
    the module does not keep (isolation, GPU order) when the two agree, and
    stands alone for shares the module never held (isolation none, module
    not loaded) or lost (reloaded: registered again by resync).
    """
    if not c.running:
        return None  # stopped: it holds nothing any more
    if record is not None and (record.name != c.name or record.pod != c.pod):
        log.warning(
            "%s: the record of container %s names %.64r in pod %.64r; not this container, ignored",
            c.describe(),
            c.id,
            record.name,
            record.pod,
        )
        record = None
    given = c.annotations.get(ASSIGNED)
    if given is None and (record is not None or registration is not None):
        log.warning(
            "%s: recorded with a share but created without the plugin's adjustment "
            "(the runtime failed open): it holds no share",
            c.describe(),
        )
        return None
    if record is not None and given != created_with(record):
        log.warning(
            "%s: does not carry the share recorded for it; the record is ignored", c.describe()
        )
        record = None
    if record is None:
        return None if registration is None else from_registration(c, registration, gpus)
    return module_wins(c, record, registration, gpus)


def module_wins(
    c: ContainerInfo, record: Allocation, registration: Registration | None, gpus: Sequence[Gpu]
) -> Allocation:
    """`record` checked against the module's registration of container `c`.

    The module is right about the numbers it holds, per GPU (memory, compute
    weight, high priority): a resize writes the module before its journal
    line, so a kill between the two leaves the module newer.  The record is
    right about the rest (isolation, interposer, origin, namespace, device
    IDs, GPU order; the compute of a share without a compute limit: 0 in the
    module).  GPUs that disagree on high priority are a priority change cut
    short (never answered): the recorded priority wins; resync writes it back.
    A registration of other GPUs gives its GPUs (ignored when this node lacks
    one); one of a share with isolation none is stale (resync removes it)."""
    if registration is None or record.isolation == "none" or registered_as(record, registration):
        return record
    module = from_registration(c, registration, gpus)
    if module is None:
        return record
    held = {q.gpu_index: q for q in registration.quotas}
    full = record.isolation == "full"
    shares = module.shares
    if sorted(held) == sorted(s.index for s in record.shares):
        shares = tuple(
            dataclasses.replace(
                s,
                memory_bytes=held[s.index].memory_bytes,
                core_percent=held[s.index].core_percent if full else s.core_percent,
            )
            for s in record.shares
        )
    won = dataclasses.replace(
        record, shares=shares, priority=_priority(registration, record.priority)
    )
    log.warning(
        "%s: the daemon's record (%s) differs from the kernel module's registration (%s); "
        "the module's wins: %s",
        c.describe(),
        record.describe_shares(),
        module.describe_shares(),
        won.describe_shares(),
    )
    return keeping_creation(record, won)


def created_with(record: Allocation) -> str:
    """The gpushare.io/assigned annotation the container was created with."""
    return record.assigned or assigned_annotation(record)


def keeping_creation(old: Allocation, new: Allocation) -> Allocation:
    """`new`, a changed `old`, remembering the annotation the container was
    created with ("" when `new` is that share again)."""
    given = created_with(old)
    return dataclasses.replace(new, assigned="" if given == assigned_annotation(new) else given)
