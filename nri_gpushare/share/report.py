"""The status document: a JSON-able picture of GPUs, allocations, the policy
and the kernel module, as `nri-gpushare status` shows it."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .assigned import share_json
from .model import Allocation, Gpu, NodePolicy
from .placement import Ledger


def status_document(
    gpus: Sequence[Gpu],
    policy: NodePolicy,
    ledger: Ledger,
    allocations: Mapping[str, Allocation],
    registered: Collection[str],
    kmod: Mapping[str, Any],
) -> dict[str, Any]:
    """`kmod`: the module's state ({"mode", "loaded", "problem"})."""
    gpu_entries = []
    for g in gpus:
        u = ledger.usage[g.index]
        gpu_entries.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "minor": g.minor,
                "memory_total": g.memory_bytes,
                "memory_reserved": policy.memory_reserve_bytes,
                "memory_allocated": u.memory_bytes,
                "memory_free": ledger.free_memory(g.index),
                "core_allocated": u.core_percent,
                "core_free": max(0, 100 - u.core_percent),
                "containers": sorted(u.containers),
                "high_priority": sorted(u.high_priority),
            }
        )
    allocation_entries = [
        {
            "container_id": a.container_id,
            "name": a.name,
            "pod": a.pod,
            "priority": a.priority,
            "isolation": a.isolation,
            "registered": a.container_id in registered,
            "gpus": [share_json(s) for s in a.shares],
        }
        for a in sorted(allocations.values(), key=lambda a: a.container_id)
    ]
    return {
        "kmod": dict(kmod),
        "policy": {
            "memory_reserve_bytes": policy.memory_reserve_bytes,
            "max_inst": policy.max_inst,
            "default_placement": policy.default_placement,
            "max_high_priority_per_gpu": policy.max_high_priority_per_gpu,
        },
        "gpus": gpu_entries,
        "allocations": allocation_entries,
    }
