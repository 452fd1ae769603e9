"""What a ResourceClaim's allocation asks of this node (pure, no I/O).

`claim_shares` reads a resource.k8s.io/v1 ResourceClaim as the API server
returns it and answers one `ClaimShare` per device of this driver and this
node's pool.  Input is untrusted: anything malformed, of the wrong type or
too large is a `ClaimError` whose message says what is wrong, never another
exception.

A result without ``consumedCapacity`` comes from a scheduler without the
DRAConsumableCapacity feature: the device was allocated whole.  Its share
has ``memory_bytes == -1`` and ``core_percent == 100`` (`ClaimShare.whole`):
the whole GPU, whose size this module does not know.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nri_gpushare.k8s.dra import (
    CAPACITY_COMPUTE,
    CAPACITY_MEMORY,
    DRIVER,
    ClaimError,
    device_name,
)
from nri_gpushare.k8s.dra.slices import QuantityError, quantity
from nri_gpushare.units import quote

MAX_RESULTS: Final = 32
"""The API's limit on allocated devices per claim."""
MAX_RESERVED: Final = 256
"""The API's limit on status.reservedFor."""
_REQUEST = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class ClaimShare:
    """One device of this node a claim was allocated, with what it consumes."""

    requests: tuple[str, ...]
    device: str
    gpu_index: int
    memory_bytes: int
    """Bytes; -1: the whole GPU (`whole`)."""
    core_percent: int
    share_id: str
    """The first result's shareID ("" without DRAConsumableCapacity)."""

    @property
    def whole(self) -> bool:
        """The device was allocated whole (no consumedCapacity)."""
        return self.memory_bytes < 0


def _get(obj: object, key: str, kind: type, where: str, required: bool = True) -> Any:
    """obj[key], checked to be a `kind`; absent: None unless `required`."""
    if not isinstance(obj, dict):
        raise ClaimError(f"{where} is not an object")
    value = obj.get(key)
    if value is None:
        if required:
            raise ClaimError(f"{where} has no {key}")
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ClaimError(f"{where}.{key} is not a {kind.__name__}")
    return value


def claim_name(claim: object) -> str:
    """``namespace/name`` of a claim, for messages."""
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(meta, dict):
        return "(unnamed)"
    parts = [meta.get("namespace"), meta.get("name")]
    return "/".join(quote(p) if isinstance(p, str) else "?" for p in parts)


def _results(claim: object) -> list[Any]:
    who = f"claim {claim_name(claim)}"
    status = _get(claim, "status", dict, who, required=False)
    allocation = None
    if status is not None:
        allocation = _get(status, "allocation", dict, f"{who} status", required=False)
    if allocation is None:
        raise ClaimError(f"{who} is not allocated yet")
    devices = _get(allocation, "devices", dict, f"{who} allocation")
    results: list[Any] = _get(devices, "results", list, f"{who} allocation.devices")
    if len(results) > MAX_RESULTS:
        raise ClaimError(f"{who} has {len(results)} allocated devices: at most {MAX_RESULTS}")
    return results


def _consumed(result: Mapping[str, Any], where: str, device: str) -> tuple[int, int]:
    """(memory bytes, compute percent) of one result; (-1, 100): whole."""
    consumed = _get(result, "consumedCapacity", dict, where, required=False)
    if consumed is None:
        return -1, 100
    if len(consumed) > 32:
        raise ClaimError(f"{where}.consumedCapacity has {len(consumed)} entries")
    values: dict[str, int] = {}
    for key in (CAPACITY_MEMORY, CAPACITY_COMPUTE):
        if key not in consumed:
            raise ClaimError(
                f"{where}.consumedCapacity has no {key}: was {device} allocated from a "
                "slice this driver published?"
            )
        try:
            unit = "bytes" if key == CAPACITY_MEMORY else "percent"
            values[key] = quantity(consumed[key], f"consumedCapacity {key}", unit)
        except QuantityError as exc:
            raise ClaimError(f"{where}: {exc}") from None
    memory, core = values[CAPACITY_MEMORY], values[CAPACITY_COMPUTE]
    if memory < 1:
        raise ClaimError(f"{where}: consumedCapacity memory is 0 bytes")
    if not 0 <= core <= 100:
        raise ClaimError(f"{where}: consumedCapacity compute {core} is not 0..100 percent")
    return memory, core


def claim_shares(claim: object, pool: str, published: Collection[int]) -> list[ClaimShare]:
    """This node's devices in `claim` (pool `pool`, GPUs `published`), one
    share per device, results on the same device summed."""
    who = f"claim {claim_name(claim)}"
    names = {device_name(i): i for i in published}
    merged: dict[str, ClaimShare] = {}
    for n, result in enumerate(_results(claim)):
        where = f"{who} result {n}"
        if _get(result, "driver", str, where) != DRIVER:
            continue
        request = _get(result, "request", str, where)
        result_pool = _get(result, "pool", str, where)
        device = _get(result, "device", str, where)
        if not _REQUEST.fullmatch(request):
            raise ClaimError(f"{where}: request {quote(request)!r} is not a request name")
        if result_pool != pool:
            raise ClaimError(
                f"{who} is allocated to pool {quote(result_pool)!r}, not this node's {pool!r}"
            )
        if device not in names:
            raise ClaimError(
                f"{who}: device {quote(device)!r} is not one this node publishes "
                f"({', '.join(sorted(names)) or 'none'})"
            )
        share_id = _get(result, "shareID", str, where, required=False) or ""
        if share_id and not _ID.fullmatch(share_id):
            raise ClaimError(f"{where}: shareID {quote(share_id)!r} is not an ID")
        memory, core = _consumed(result, where, device)
        before = merged.get(device)
        if before is not None:
            whole = before.whole or memory < 0
            memory = -1 if whole else before.memory_bytes + memory
            core = 100 if whole else before.core_percent + core
            if core > 100:
                raise ClaimError(f"{who} asks for {core} % compute of {device}: more than 100")
            request_names = before.requests + (request,)
            share_id = before.share_id
        else:
            request_names = (request,)
        merged[device] = ClaimShare(request_names, device, names[device], memory, core, share_id)
    return list(merged.values())


def reserved_pods(claim: object) -> tuple[str, ...]:
    """The UIDs of the pods `claim` is reserved for (status.reservedFor)."""
    who = f"claim {claim_name(claim)}"
    status = _get(claim, "status", dict, who, required=False)
    entries = None if status is None else _get(status, "reservedFor", list, who, required=False)
    if entries is None:
        return ()
    if len(entries) > MAX_RESERVED:
        raise ClaimError(f"{who} is reserved for {len(entries)} consumers: at most {MAX_RESERVED}")
    uids: list[str] = []
    for n, entry in enumerate(entries):
        where = f"{who} reservedFor[{n}]"
        if _get(entry, "resource", str, where) != "pods":
            continue
        if _get(entry, "apiGroup", str, where, required=False):
            continue
        uid = _get(entry, "uid", str, where)
        if not _ID.fullmatch(uid):
            raise ClaimError(f"{where}: uid {quote(uid)!r} is not a Kubernetes UID")
        uids.append(uid)
    return tuple(uids)
