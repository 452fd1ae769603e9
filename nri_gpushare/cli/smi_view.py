"""gpushare-smi's document (`--json`, schema ``gpushare-smi/1``, described in
docs/monitoring.md): the daemon's status document seen per GPU and per
container share, with what NVML says where the kernel module cannot say,
and "unknown" and why where neither can.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from nri_gpushare.host.nvml_usage import NvmlUse
from nri_gpushare.share.report import POLICIES

SCHEMA = "gpushare-smi/1"
POLICY_NAMES = POLICIES  # the module's scheduling policies by number


def _sum_known(values: Sequence[Any]) -> Any:
    """The sum when every value is known (not None); None otherwise."""
    if any(v is None for v in values):
        return None
    return round(sum(values), 1) if any(isinstance(v, float) for v in values) else sum(values)


def _first_why(shares: Sequence[Mapping[str, Any]], value: str, why: str) -> str | None:
    return next((str(s.get(why) or "unknown") for s in shares if s.get(value) is None), None)


def _policy_why(status: Mapping[str, Any]) -> str:
    kmod = status.get("kmod", {})
    if kmod.get("mode") == "off":
        return "unknown: kmod: off"
    if not kmod.get("loaded"):
        return f"unknown: the kernel module {kmod.get('problem') or 'is not loaded'}"
    return "unknown: read once a container on this GPU is registered with the kernel module"


def view(
    status: Mapping[str, Any],
    now: float | None = None,
    nvml: Mapping[tuple[int, str], NvmlUse] | None = None,
) -> dict[str, Any]:
    """The --json document for a status document (`now`: time.time());
    `nvml`: what NVML says containers use, by (GPU index, container ID),
    filling in what the kernel module does not say (`..._source` "nvml")."""
    now = time.time() if now is None else now
    nvml = nvml or {}
    allocations = status.get("allocations", [])
    containers = []
    by_gpu: dict[int, list[Mapping[str, Any]]] = {}
    for alloc in allocations:
        shares = [_share(s, nvml.get((s["index"], alloc["container_id"]))) for s in alloc["gpus"]]
        for share in shares:
            by_gpu.setdefault(share["index"], []).append(share)
        containers.append(
            {
                "container_id": alloc["container_id"],
                "pod": alloc.get("pod") or "",
                "name": alloc.get("name") or "",
                "origin": alloc.get("origin") or "nri",
                "priority": alloc.get("priority", "normal"),
                "isolation": alloc.get("isolation", ""),
                "gpus": shares,
            }
        )
    gpus = []
    for gpu in status.get("gpus", []):
        held = by_gpu.get(gpu["index"], [])
        policy = gpu.get("policy")
        gpus.append(
            {
                "index": gpu["index"],
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "memory_total": gpu["memory_total"],
                "memory_allocated": gpu["memory_allocated"],
                "memory_used": _sum_known([s["memory_used"] for s in held]),
                "memory_used_why": _first_why(held, "memory_used", "memory_used_why"),
                "core_allocated": gpu["core_allocated"],
                "core_used": _sum_known([s["core_used"] for s in held]),
                "core_used_why": _first_why(held, "core_used", "core_used_why"),
                "policy": policy if isinstance(policy, int) else None,
                "policy_name": POLICY_NAMES.get(policy) if isinstance(policy, int) else None,
                "policy_why": None if isinstance(policy, int) else _policy_why(status),
                "containers": len(gpu.get("containers", [])),
            }
        )
    kmod = status.get("kmod", {})
    return {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "plugin": {
            "version": status.get("version") or "unknown",
            "kmod": {
                "mode": kmod.get("mode"),
                "loaded": bool(kmod.get("loaded")),
                "problem": kmod.get("problem") or "",
            },
            "nri_connected": bool(status.get("nri", {}).get("connected")),
        },
        "gpus": gpus,
        "containers": containers,
        "unserved": list(status.get("unserved", [])),
        "claims": list(status.get("claims", [])),
    }


def _share(s: Mapping[str, Any], use: NvmlUse | None) -> dict[str, Any]:
    """A container's share of one GPU; what the status leaves unknown is
    taken from NVML's `use` where it says."""
    memory, pids = s.get("memory_used"), s.get("pids")
    memory_source = "kmod" if memory is not None else None
    if memory is None and use is not None:
        memory, pids, memory_source = use.memory_used, list(use.pids), "nvml"
    core = s.get("compute_used_pct")
    core_source = "kmod" if core is not None else None
    if core is None and use is not None and use.core_used_pct is not None:
        core, core_source = use.core_used_pct, "nvml"
    return {
        "index": s["index"],
        "uuid": s["uuid"],
        "memory_quota": s["memory"],
        "memory_used": memory,
        "memory_used_why": None if memory is not None else s.get("memory_used_why"),
        "memory_used_source": memory_source,
        "core_target": s.get("compute_target"),
        "core_used": core,
        "core_used_why": None if core is not None else s.get("compute_used_why"),
        "core_used_source": core_source,
        "pids": pids,
        "pids_why": (
            None
            if pids is not None
            else (s.get("memory_used_why") or "unknown: this daemon does not say")
        ),
    }


def unknown_shares(status: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """(GPU index, UUID, container ID) of every share whose memory or compute
    used the status leaves unknown: what NVML may be asked about."""
    return [
        (s["index"], s["uuid"], alloc["container_id"])
        for alloc in status.get("allocations", [])
        for s in alloc["gpus"]
        if s.get("memory_used") is None or s.get("compute_used_pct") is None
    ]
