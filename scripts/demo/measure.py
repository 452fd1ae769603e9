"""Shares of the simulated GPU's time, measured from the fake driver's own
record: the file every process naming FAKECUDA_GPU_STATE shares, where each
process's driver notes the kernel time the simulated GPU ran for it
(libgpushare/tests/fake/fake_gpu.h, read by scripts/demo/gpu_state.c).
That is the GPU's count, not the interposer's: what a container got is the
kernel time the GPU executed for its processes over a window of wall time.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from scripts.demo.checks import Window


@dataclass(frozen=True)
class Snapshot:
    """The simulated GPU at one moment: CLOCK_MONOTONIC ns, and per
    (pid, device) the bytes allocated and the kernel time executed."""

    now_ns: int
    procs: dict[tuple[int, int], tuple[int, int]]


def parse_snapshot(text: str) -> Snapshot:
    now = 0
    procs: dict[tuple[int, int], tuple[int, int]] = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["now"]:
            now = int(words[1])
        elif words[:1] == ["proc"] and len(words) == 5:
            pid, dev, mem, executed = (int(w) for w in words[1:])
            procs[pid, dev] = (mem, executed)
    if not now:
        raise ValueError(f"not a gpu_state snapshot: {text[:200]!r}")
    return Snapshot(now, procs)


def owner(pid: int, container_ids: Collection[str], proc: Path = Path("/proc")) -> str | None:
    """The container (of `container_ids`) whose cgroup process `pid` is in."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    paths = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    last = paths[0].rsplit("/", 1)[-1] if paths else ""
    return next((cid for cid in container_ids if cid in last), None)


def cpu_wait_ns(pid: int, proc: Path = Path("/proc")) -> int:
    """The time process `pid`'s threads have waited runnable for a CPU, in
    all (the second field of each /proc/PID/task/TID/schedstat); 0 when it
    cannot be read."""
    total = 0
    try:
        for task in (proc / str(pid) / "task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        return 0
    return total


def window_of(
    s0: Snapshot,
    s1: Snapshot,
    device: int,
    owners: dict[int, str | None],
    waited_ns: dict[int, int] | None = None,
) -> Window:
    """Each container's share of `device`'s time between two snapshots, and
    every process's together (percent); `waited_ns`: how long each load's
    threads waited for a CPU meanwhile (the window keeps the most)."""
    span = s1.now_ns - s0.now_ns
    shares: dict[str, float] = {}
    total = 0.0
    for (pid, dev), (_, executed) in s1.procs.items():
        if dev != device:
            continue
        before = s0.procs.get((pid, dev), (0, 0))[1]
        pct = 100.0 * max(0, executed - before) / span
        total += pct
        cid = owners.get(pid)
        if cid is not None:
            shares[cid] = shares.get(cid, 0.0) + pct
    wait = None
    if waited_ns:
        wait = round(100.0 * max(waited_ns.values()) / span, 1)
    return Window(span / 1e9, {k: round(v, 1) for k, v in shares.items()}, round(total, 1), wait)


class SimulatedGpu:
    """The simulated GPU's file, read with the compiled gpu_state reader."""

    def __init__(self, reader: Path, state: Path) -> None:
        self.reader = reader
        self.state = state

    def snapshot(self) -> Snapshot:
        out = subprocess.run(
            [str(self.reader), str(self.state)], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"gpu_state: {out.stderr.strip()}")
        return parse_snapshot(out.stdout)

    def window(self, device: int, seconds: float, container_ids: Collection[str]) -> Window:
        """Measure `seconds` of `device`'s time, shared out by container."""
        s0 = self.snapshot()
        loads = [pid for pid, _ in s0.procs if owner(pid, container_ids) is not None]
        waits = {pid: cpu_wait_ns(pid) for pid in loads}
        time.sleep(seconds)
        s1 = self.snapshot()
        waited = {pid: cpu_wait_ns(pid) - before for pid, before in waits.items()}
        owners = {pid: owner(pid, container_ids) for pid, _ in s1.procs}
        return window_of(s0, s1, device, owners, waited)
