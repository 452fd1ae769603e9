"""What the driver says each container uses, for gpushare-smi where the
kernel module cannot say (standalone mode, no module): the GPU memory its
processes hold and their share of the GPU's time, from NVML's per-process
figures (`nvmlDeviceGetComputeRunningProcesses`,
`nvmlDeviceGetProcessUtilization`), each process put with its container by
its cgroup (`/proc/PID/cgroup`: NVML numbers processes as the host does,
whatever PID namespace they run in).

These are the driver's figures for the processes, not a quota's ledger:
memory the driver counts per process (contexts included), and utilisation
samples (integer percents of each sampling period, over the driver's last
second or two).  On a node without NVML there is nothing, and the cells stay
unknown.  Pointed at another `libnvidia-ml.so.1` by the loader's own
LD_LIBRARY_PATH (the demo points it at the tests' fake NVML).
"""

from __future__ import annotations

import importlib
import logging
import statistics
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_gpushare.host.devices import cgroup_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlUse:
    """A container's processes on one GPU: bytes held, their PIDs (host),
    and the percent of the GPU's time they used over `window_s` seconds
    (None: NVML's samples do not say)."""

    memory_used: int
    pids: tuple[int, ...]
    core_used_pct: float | None
    window_s: float | None


def utilisation(samples: Iterable[tuple[int, int, int]]) -> tuple[dict[int, float], float]:
    """Per PID, the percent of the GPU's time over the samples' span, and the
    span in seconds, from (pid, time stamp in µs, SM percent of the sampling
    period ending then).  The period is the usual gap between time stamps;
    fewer than two time stamps say nothing ({}, 0)."""
    rows = list(samples)
    stamps = sorted({ts for _, ts, _ in rows})
    if len(stamps) < 2:
        return {}, 0.0
    period = statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    span = stamps[-1] - stamps[0] + period
    used: dict[int, float] = {}
    for pid, _, pct in rows:
        used[pid] = used.get(pid, 0.0) + pct * period / span
    return {pid: round(v, 1) for pid, v in used.items()}, round(span / 1e6, 1)


def owner(pid: int, container_ids: Collection[str], proc: Path) -> str | None:
    """The container of `container_ids` whose own cgroup process `pid` is in."""
    for cid in container_ids:
        try:
            cgroup_of(cid, pid, proc)
            return cid
        except ValueError:
            continue
    return None


def nvml_use(
    shares: Sequence[tuple[int, str, str]],
    nvml: Any | None = None,
    proc: Path = Path("/proc"),
) -> dict[tuple[int, str], NvmlUse]:
    """For each (GPU index, GPU UUID, container ID): what NVML says the
    container's processes use there; {} when NVML cannot be asked, and a GPU
    NVML does not answer for is left out.  `nvml` replaces `pynvml` (tests)."""
    if not shares:
        return {}
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no NVML: nothing to add
        log.debug("NVML unavailable: %s", e)
        return {}
    out: dict[tuple[int, str], NvmlUse] = {}
    try:
        by_gpu: dict[tuple[int, str], list[str]] = {}
        for index, uuid, cid in shares:
            by_gpu.setdefault((index, uuid), []).append(cid)
        for (index, uuid), cids in by_gpu.items():
            try:
                out.update(_one_gpu(nvml, index, uuid, cids, proc))
            except Exception as e:  # noqa: BLE001 - one GPU NVML cannot answer for
                log.debug("NVML on GPU %s: %s", uuid, e)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - nothing to do about it
            pass
    return out


def _one_gpu(
    nvml: Any, index: int, uuid: str, cids: Sequence[str], proc: Path
) -> dict[tuple[int, str], NvmlUse]:
    handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    try:
        raw = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
        samples = [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in raw]
    except nvml.NVMLError as e:
        if getattr(e, "value", None) != nvml.NVML_ERROR_NOT_FOUND:
            raise
        samples = []  # no process used the GPU over the driver's buffer
    shares, window = utilisation(samples)
    idle = not samples
    whose: dict[int, str | None] = {}
    for pid in {int(p.pid) for p in running} | set(shares):
        whose[pid] = owner(pid, cids, proc)
    out = {}
    for cid in cids:
        mine = [p for p in running if whose.get(int(p.pid)) == cid]
        memory = sum(int(p.usedGpuMemory or 0) for p in mine)
        core: float | None = None
        if idle:
            core = 0.0
        elif window:
            core = round(sum(v for pid, v in shares.items() if whose.get(pid) == cid), 1)
        out[index, cid] = NvmlUse(
            memory, tuple(sorted(int(p.pid) for p in mine)), core, window or None
        )
    return out
