"""What gpushare.ko's files under /proc/gpushare say: a GPU's state and a
container's meminfo, as plain values."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuState:
    """One GPU as /proc/gpushare/<index>/ shows it now."""

    index: int
    total_memory: int
    free_memory: int
    free_weight: int
    containers: int
    max_inst: int
    policy: int
    prio_ratio: int


@dataclass(frozen=True)
class MemInfo:
    """One container's memory on one GPU, from /proc/gpushare/<gpu>/<id>/meminfo
    (cGPU's format): `free` bytes of its memsize that no process holds, and
    the bytes each of its processes holds (pid -> bytes; pids as this
    process's pid namespace sees them, processes it cannot see left out).
    `memsize` was the container's quota when `free` was read."""

    free: int
    processes: dict[int, int]
    memsize: int = 0

    @property
    def used(self) -> int:
        """Bytes its processes hold on this GPU (memsize - free)."""
        return self.memsize - self.free


_FREE_LINE = re.compile(r"Free: (0|[1-9][0-9]*)")
_PID_LINE = re.compile(r"PID: ([1-9][0-9]*) Mem: ([1-9][0-9]*)")


def parse_meminfo(text: str, memsize: int = 0) -> MemInfo:
    """meminfo's text, strictly: `Free: <bytes>` then one `PID: <pid> Mem:
    <bytes>` line per process (each pid once, bytes > 0), every line ending
    in a newline.  ValueError for anything else."""
    if not text.endswith("\n"):
        raise ValueError("meminfo does not end in a newline")
    lines = text[:-1].split("\n")
    free = _FREE_LINE.fullmatch(lines[0])
    if free is None:
        raise ValueError(f"meminfo's first line is not 'Free: <bytes>': {lines[0]!r}")
    processes: dict[int, int] = {}
    for line in lines[1:]:
        m = _PID_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"not a 'PID: <pid> Mem: <bytes>' line: {line!r}")
        pid = int(m[1])
        if pid in processes:
            raise ValueError(f"PID {pid} listed twice")
        processes[pid] = int(m[2])
    return MemInfo(int(free[1]), processes, memsize)
