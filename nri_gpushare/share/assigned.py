"""The ``gpushare.io/assigned`` annotation: what a container was given, written
into it at CreateContainer and read back after a plugin restart.

Compact JSON, keys sorted::

    {"gpus": [{"core": 30, "index": 0, "memory": 2147483648, "uuid": "GPU-..."}],
     "isolation": "full", "priority": "normal", "version": 1}

Recovery (`recover`) prefers the annotation; a container without a usable one
is recovered from the kernel module's registration of it, if any.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..kmod.client import Registration
from .model import ASSIGNED, ISOLATIONS, PRIORITIES, Allocation, ContainerInfo, Gpu, GpuShare

log = logging.getLogger(__name__)

VERSION = 1


def share_json(s: GpuShare) -> dict[str, Any]:
    """One GPU share as the annotation and the status document write it."""
    return {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}


def assigned_annotation(alloc: Allocation) -> str:
    """The gpushare.io/assigned value for an allocation."""
    data: Mapping[str, Any] = {
        "version": VERSION,
        "gpus": [share_json(s) for s in alloc.shares],
        "priority": alloc.priority,
        "isolation": alloc.isolation,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def decode(c: ContainerInfo, text: str, by_uuid: Mapping[str, Gpu]) -> Allocation:
    """The allocation an annotation describes; ValueError, KeyError or
    TypeError when it is unusable here."""
    data = json.loads(text)
    shares = []
    for entry in data["gpus"]:
        gpu = by_uuid.get(entry["uuid"])
        if gpu is None:
            raise ValueError(f"GPU {entry['uuid']} is not on this node")
        memory, core = int(entry["memory"]), int(entry.get("core", 0))
        if memory <= 0 or not 0 <= core <= 100:
            raise ValueError("quota out of range")
        shares.append(GpuShare(gpu.index, gpu.uuid, memory, core))
    priority, isolation = data.get("priority", "normal"), data.get("isolation", "full")
    if priority not in PRIORITIES or isolation not in ISOLATIONS or not shares:
        raise ValueError("bad priority, isolation or GPU list")
    return Allocation(c.id, c.name, c.pod, tuple(shares), priority, isolation)


def recover(
    c: ContainerInfo, registration: Registration | None, gpus: Sequence[Gpu]
) -> Allocation | None:
    """A live container's allocation: from its annotation, else from the
    module's registration of it; None when it holds no share."""
    text = c.annotations.get(ASSIGNED)
    if text is not None:
        try:
            return decode(c, text, {g.uuid: g for g in gpus})
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s: unusable %s annotation (%s): %s", c.describe(), ASSIGNED, e, text)
    if registration is None:
        return None
    by_index = {g.index: g for g in gpus}
    quotas = registration.quotas
    if unknown := [q.gpu_index for q in quotas if q.gpu_index not in by_index]:
        log.warning("%s: registered on unknown GPUs %s; ignored", c.describe(), unknown)
        return None
    shares = tuple(
        GpuShare(q.gpu_index, by_index[q.gpu_index].uuid, q.memory_bytes, q.core_percent)
        for q in quotas
    )
    high = any(q.high_priority for q in quotas)
    return Allocation(c.id, c.name, c.pod, shares, "high" if high else "normal", "full")
