"""The status document: a JSON-able picture of GPUs, allocations, the policy
and the kernel module, as `nri-gpushare status` shows it.

Each allocation says which mechanisms guard its memory (`guards`):

- ``interposer``: libgpushare.so was injected (every dynamically linked
  process loads it and reserves before it allocates);
- ``kernel-ledger``: and it is registered with gpushare.ko, so those
  reservations are counted by the kernel for the whole container (without
  it the interposer counts per process);
- ``nvml-limit``: the driver caps the container's cgroup on at least one of
  its GPUs (each GPU entry says whether its own is capped);
- ``none``: nothing does.

`unguarded` says, per mechanism that is missing, why (key ``none`` when
nothing is meant to guard it: isolation none).  Each GPU entry gives
the memory in use next to the quota (`memory_used`, null when unknown, and
then `memory_used_why`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .assigned import share_json
from .limits import LimitLink
from .model import Allocation, Gpu, NodePolicy
from .placement import Ledger
from .usage import MemoryUse

NOT_READ = MemoryUse(None, why="unknown: not read")


def guards(
    alloc: Allocation,
    policy: NodePolicy,
    registered: bool,
    kmod_problem: str,
    limits: LimitLink,
) -> tuple[list[str], dict[str, str]]:
    """The mechanisms guarding `alloc`'s memory, and why each missing one is."""
    if alloc.isolation == "none":
        return ["none"], {"none": "isolation none: the share is accounted, not enforced"}
    on: list[str] = []
    why: dict[str, str] = {}
    if alloc.interposer:
        on.append("interposer")
    elif policy.interposer is None:
        why["interposer"] = "this node has no interposer configured"
    else:
        why["interposer"] = (
            f"not injected at create: {policy.interposer.library} was missing on the node "
            f"and interposer.missing is warn (or the share's record was lost)"
        )
    if alloc.interposer and registered:
        on.append("kernel-ledger")
    elif not registered:
        why["kernel-ledger"] = f"not registered with the kernel module ({kmod_problem})" + (
            "; the interposer counts per process" if alloc.interposer else ""
        )
    else:
        why["kernel-ledger"] = "registered, but without the interposer nothing reserves in it"
    limited = limits.limited(alloc.container_id)
    if limited:
        on.append("nvml-limit")
    if len(limited) < len(alloc.shares):
        why["nvml-limit"] = limits.why_not(alloc) or "not set"
    return (on or ["none"]), why


def status_document(
    gpus: Sequence[Gpu],
    policy: NodePolicy,
    ledger: Ledger,
    allocations: Mapping[str, Allocation],
    registered: Collection[str],
    kmod: Mapping[str, Any],
    limits: LimitLink,
    usage: Mapping[tuple[int, str], MemoryUse],
) -> dict[str, Any]:
    """`kmod`: the module's state ({"mode", "loaded", "problem"}); `usage`:
    memory in use by (GPU index, container ID)."""
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
    if kmod.get("mode") == "off":
        kmod_problem = "kmod: off"
    else:
        kmod_problem = f"the module {kmod.get('problem') or 'did not register it'}"
    allocation_entries = []
    for a in sorted(allocations.values(), key=lambda a: a.container_id):
        is_registered = a.container_id in registered
        on, why = guards(a, policy, is_registered, kmod_problem, limits)
        limited = limits.limited(a.container_id)
        shares = []
        for s in a.shares:
            use = usage.get((s.index, a.container_id), NOT_READ)
            shares.append(
                {
                    **share_json(s),
                    "memory_used": use.used,
                    "memory_used_why": use.why,
                    "processes": len(use.processes),
                    "nvml_limit": s.index in limited,
                }
            )
        allocation_entries.append(
            {
                "container_id": a.container_id,
                "name": a.name,
                "pod": a.pod,
                "priority": a.priority,
                "isolation": a.isolation,
                "registered": is_registered,
                "interposer": a.interposer,
                "origin": a.where,
                "guards": on,
                "unguarded": why,
                "gpus": shares,
            }
        )
    interposer = policy.interposer
    return {
        "kmod": dict(kmod),
        "nvml_memory_limits": limits.state(),
        "interposer": (
            {
                "library": interposer.library,
                "container_path": interposer.container_path,
                "preload": interposer.preload,
                "missing": interposer.missing,
                "allow_managed": interposer.allow_managed,
            }
            if interposer is not None
            else None
        ),
        "policy": {
            "memory_reserve_bytes": policy.memory_reserve_bytes,
            "max_inst": policy.max_inst,
            "default_placement": policy.default_placement,
            "max_high_priority_per_gpu": policy.max_high_priority_per_gpu,
        },
        "gpus": gpu_entries,
        "allocations": allocation_entries,
    }
