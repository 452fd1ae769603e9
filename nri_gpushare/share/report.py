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
then `memory_used_why`), the processes holding GPU memory there (`pids`, from
the module's meminfo: process IDs as the kernel module sees them, i.e. in the
host's (initial) PID namespace, not the container's; null when unknown), and
the compute target next to what the container got over the last minute:

- ``compute_target``: the gpu-core percent, null for no limit (no gpu-core, or
  isolation memory|none);
- ``compute_policy``: the GPU's scheduling policy (null when not scheduled by
  the module or not read yet), and ``compute_rule`` what the target means under
  it (under policies 1, 2 and 4 it is relative to the containers using the GPU
  at the time, so only policy 3 makes it a fixed percent of the GPU);
- ``compute_used_pct``: the percent of the GPU's time charged to it by the
  module over the last ``compute_window_s`` seconds (at most a minute: less
  just after it started), null when unknown and then ``compute_used_why``.

Each GPU entry gives its scheduler's settings as the module shows them
(``policy``, ``prio_ratio``, ``slice_us``, ``drain_us``; null when unknown)
and ``forced_ends``, the module's count of the GPU's slices ended by force
(a holder that neither released nor sent heartbeats in time; null when
unknown).

Each allocation's ``kubelet`` is, for a pod that asked with
``resources.limits``, the device IDs the kubelet gave it per resource, as
ranges (``{"gpu-memory": "0-7", "gpu-core": "0-59", "gpu-count": "0-1"}``),
and ``{}`` for any other share.  The device plugin reads them here to know
which IDs live containers hold (`nri_gpushare.k8s`).  ``resized`` is true
once `nri-gpushare resize` has changed the share the container was created
with (its ``gpushare.io/assigned`` annotation still says the first one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from nri_gpushare.share.limits import LimitLink
from nri_gpushare.share.model import Allocation, Gpu, NodePolicy
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.plan import share_json
from nri_gpushare.share.usage import ComputeUse, MemoryUse, SchedState

NOT_READ = MemoryUse(None, why="unknown: not read")
NOT_SAMPLED = ComputeUse(None, None, "unknown: no sample yet")

POLICIES = {
    0: "fair share",
    1: "preemptive",
    2: "weighted",
    3: "fixed share",
    4: "weak",
    5: "native",
}


def compute_rule(
    alloc: Allocation, core: int, registered: bool, sched: SchedState | None
) -> tuple[int | None, str]:
    """The share's scheduling policy (None when the module does not schedule
    it, or its policy is not known yet) and what its target means there."""
    if alloc.isolation == "none":
        return None, "no limit: isolation none does not schedule compute"
    if alloc.isolation == "memory":
        core = 0  # registered without a compute share: best effort
    if not registered:
        if alloc.interposer and core:
            return None, (
                f"standalone: the interposer holds each process to {core}% of the GPU "
                "(a fixed share per process, not per container)"
            )
        return None, "not enforced: not registered with the kernel module"
    policy = sched.policy if sched is not None else None
    if policy is None:
        return None, "scheduled by the kernel module; its policy is not read yet"
    name = f"policy {policy} ({POLICIES.get(policy, 'unknown')})"
    if policy == 5:
        return policy, f"{name}: not scheduled, every launch goes at once"
    if policy == 0:
        rule = "1/max_inst of the GPU, used or not; gpu-core is not used"
    elif policy in (1, 4):
        rule = "an equal share among the containers using the GPU; gpu-core is not used"
        if policy == 4:
            rule += "; time nobody due wants goes to any container waiting"
    elif not core:
        rule = (
            "no compute share (no gpu-core, or isolation memory): best effort, "
            "served when no container with a share waits"
        )
    elif policy == 2:
        rule = f"weight {core} against the other containers using the GPU; alone, the whole GPU"
    else:
        rule = f"{core}% of the GPU, never more"
    if alloc.high_priority:
        ratio = sched.prio_ratio if sched is not None and sched.prio_ratio is not None else "?"
        rule += f"; high priority: served first, at most {ratio}% while others wait"
    return policy, f"{name}: {rule}"


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
    compute: Mapping[tuple[int, str], ComputeUse] | None = None,
    sched: Mapping[int, SchedState] | None = None,
) -> dict[str, Any]:
    """`kmod`: the module's state ({"mode", "loaded", "problem"}); `usage`:
    memory in use by (GPU index, container ID); `compute`: the share of the
    GPU it got; `sched`: the GPUs' scheduler settings."""
    compute = compute or {}
    sched = sched or {}
    gpu_entries = []
    for g in gpus:
        u = ledger.usage[g.index]
        settings = sched.get(g.index, SchedState())
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
                "policy": settings.policy,
                "prio_ratio": settings.prio_ratio,
                "slice_us": settings.slice_us,
                "drain_us": settings.drain_us,
                "forced_ends": settings.forced_ends,
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
            got = compute.get((s.index, a.container_id), NOT_SAMPLED)
            scheduled, rule = compute_rule(a, s.core_percent, is_registered, sched.get(s.index))
            full = a.isolation == "full" and s.core_percent > 0
            shares.append(
                {
                    **share_json(s),
                    "memory_used": use.used,
                    "memory_used_why": use.why,
                    "processes": len(use.processes),
                    "pids": sorted(use.processes) if use.used is not None else None,
                    "nvml_limit": s.index in limited,
                    "compute_target": s.core_percent if full else None,
                    "compute_policy": scheduled,
                    "compute_rule": rule,
                    "compute_used_pct": got.used_pct,
                    "compute_window_s": got.window_s,
                    "compute_used_why": got.why,
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
                "kubelet": dict(a.kubelet),
                "claim": a.claim,
                "resized": bool(a.assigned),
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
