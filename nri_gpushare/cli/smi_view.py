"""gpushare-smi's document (`--json`, schema ``gpushare-smi/1``, described in
docs/monitoring.md): the daemon's status document seen per GPU and per
container share, with "unknown" and why where the kernel module cannot say.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

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


def view(status: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """The --json document for a status document (`now`: time.time())."""
    now = time.time() if now is None else now
    allocations = status.get("allocations", [])
    by_gpu: dict[int, list[Mapping[str, Any]]] = {}
    for alloc in allocations:
        for share in alloc["gpus"]:
            by_gpu.setdefault(share["index"], []).append(share)
    gpus = []
    for gpu in status.get("gpus", []):
        shares = by_gpu.get(gpu["index"], [])
        policy = gpu.get("policy")
        gpus.append(
            {
                "index": gpu["index"],
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "memory_total": gpu["memory_total"],
                "memory_allocated": gpu["memory_allocated"],
                "memory_used": _sum_known([s.get("memory_used") for s in shares]),
                "memory_used_why": _first_why(shares, "memory_used", "memory_used_why"),
                "core_allocated": gpu["core_allocated"],
                "core_used": _sum_known([s.get("compute_used_pct") for s in shares]),
                "core_used_why": _first_why(shares, "compute_used_pct", "compute_used_why"),
                "policy": policy if isinstance(policy, int) else None,
                "policy_name": POLICY_NAMES.get(policy) if isinstance(policy, int) else None,
                "policy_why": None if isinstance(policy, int) else _policy_why(status),
                "containers": len(gpu.get("containers", [])),
            }
        )
    containers = []
    for alloc in allocations:
        shares = []
        for s in alloc["gpus"]:
            pids = s.get("pids")
            shares.append(
                {
                    "index": s["index"],
                    "uuid": s["uuid"],
                    "memory_quota": s["memory"],
                    "memory_used": s.get("memory_used"),
                    "memory_used_why": (
                        None if s.get("memory_used") is not None else s.get("memory_used_why")
                    ),
                    "core_target": s.get("compute_target"),
                    "core_used": s.get("compute_used_pct"),
                    "core_used_why": (
                        None if s.get("compute_used_pct") is not None else s.get("compute_used_why")
                    ),
                    "pids": pids,
                    "pids_why": (
                        None
                        if pids is not None
                        else (s.get("memory_used_why") or "unknown: this daemon does not say")
                    ),
                }
            )
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
    }
