"""What containers use, for status: memory in use per container and GPU,
what the kernel module's ledger counts (the interposer reserves there before
each allocation); and the share of each GPU's time they got.

The daemon wires in `MemoryUsage` (`nri_gpushare.host.meminfo.ModuleMemInfo`, reading
/proc/gpushare/<gpu>/<id>/meminfo) and `GpuTimeSource` (`ModuleGpuTime`,
reading /proc/gpushare/<gpu>/<id>/gputime, sampled every few seconds into a
`ComputeMeter`); without the module both are unknown, and status says why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class MemoryUse:
    """used: bytes held on the GPU by the container's processes (quota − the
    module's Free), None when unknown; processes: pid -> bytes; why: when
    unknown, why."""

    used: int | None
    processes: Mapping[int, int] = field(default_factory=dict)
    why: str = ""


class MemoryUsage(Protocol):
    async def usage(
        self, wanted: Sequence[tuple[int, str, int]]
    ) -> Mapping[tuple[int, str], MemoryUse]:
        """For each (GPU index, container ID, quota bytes): what it uses."""


# -- GPU time: compute target vs what a container got --------------------------------

Key = tuple[int, str]
"""(GPU index, container ID)."""

WINDOW_S = 60.0
"""Status shows the compute a container used over this much of the recent past."""
MAX_SAMPLES = 256
"""Samples kept per (GPU, container) whatever the clock does (normally 13: 60 s / 5 s)."""


@dataclass(frozen=True)
class SchedState:
    """A GPU's compute scheduler settings as the module shows them (None: unknown)."""

    policy: int | None = None
    prio_ratio: int | None = None
    max_inst: int | None = None
    slice_us: int | None = None
    drain_us: int | None = None
    forced_ends: int | None = None


@dataclass(frozen=True)
class GpuTimeRead:
    """One sampling pass: the GPU time charged per (GPU, container) in ns, or
    why it is unknown (a str); the scheduler settings of the GPUs read."""

    gputime: Mapping[Key, int | str]
    gpus: Mapping[int, SchedState] = field(default_factory=dict)


class GpuTimeSource(Protocol):
    async def read(self, wanted: Sequence[Key]) -> GpuTimeRead:
        """The GPU time of each wanted (GPU, container), and those GPUs' settings."""


class Worker(Protocol):
    """Runs a blocking call off the event loop (nri_gpushare.host.worker.BlockingWorker)."""

    async def call(self, fn: Callable[[], T], what: str) -> T: ...

    def close(self) -> None: ...


class ModuleGpuTime:
    """`GpuTimeSource` from gpushare.ko's procfs (the client's `gputime`,
    `gpu_state`, `slice_us`, `drain_us` and `forced_ends`), one batch per
    pass on a worker thread."""

    def __init__(self, client: object, worker: Worker) -> None:
        self.client = client
        self.worker = worker

    async def read(self, wanted: Sequence[Key]) -> GpuTimeRead:
        gputime = getattr(self.client, "gputime", None)
        if gputime is None:
            why = "unknown: this plugin's kernel-module client cannot read gputime"
            return GpuTimeRead({key: why for key in wanted})

        def batch() -> GpuTimeRead:
            out: dict[Key, int | str] = {}
            for gpu, cid in wanted:
                try:
                    ns = gputime(gpu, cid)
                    out[gpu, cid] = (
                        ns
                        if isinstance(ns, int)
                        else "unknown: this gpushare.ko does not measure GPU time (an older module)"
                    )
                except Exception as e:  # noqa: BLE001 - one unreadable entry is shown as such
                    out[gpu, cid] = f"unknown: gputime unreadable ({e})"
            return GpuTimeRead(
                out, {gpu: self._sched(gpu) for gpu in sorted({g for g, _ in wanted})}
            )

        try:
            return await self.worker.call(batch, "reading gputime")
        except Exception as e:  # noqa: BLE001 - a stuck or vanished module: unknown
            return GpuTimeRead({key: f"unknown: {e}" for key in wanted})

    def close(self) -> None:
        self.worker.close()

    def _sched(self, gpu: int) -> SchedState:
        try:
            state = self.client.gpu_state(gpu)  # type: ignore[attr-defined]
            newer = [
                getattr(self.client, name, lambda gpu: None)(gpu)
                for name in ("slice_us", "drain_us", "forced_ends")
            ]
            return SchedState(state.policy, state.prio_ratio, state.max_inst, *newer)
        except Exception:  # noqa: BLE001 - settings unknown; the GPU times still count
            return SchedState()


@dataclass(frozen=True)
class ComputeUse:
    """used_pct: percent of the GPU's time charged to the container over the
    last window_s seconds (None when unknown, and then why)."""

    used_pct: float | None
    window_s: float | None = None
    why: str | None = None


@dataclass
class _Window:
    owner: object  # what the samples were taken for: another one starts afresh
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    why: str = ""  # why the last read gave no number


class ComputeMeter:
    """Windows of GPU-time samples per (GPU, container), in memory: the
    percent of the GPU each container got over the last `window_s` seconds
    (from the newest sample at least that old; over everything sampled until
    there is one).

    `record` takes one pass of readings with the time it was taken (the
    caller's monotonic clock) and, for each key, its owner (the allocation:
    a different object means the container was released and created again,
    so its samples are dropped).  Keys left out are forgotten.  A counter
    that went down (the container registered again, the module reloaded)
    starts the window afresh: no negative rate is ever shown."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._windows: dict[Key, _Window] = {}
        self.gpus: dict[int, SchedState] = {}

    def record(
        self, now: float, readings: Mapping[Key, tuple[object, int | str]], read: GpuTimeRead
    ) -> None:
        """readings: key -> (owner, GPU time in ns or why unknown); `read`'s
        GPU settings replace those known (GPUs not in it keep theirs)."""
        for key in set(self._windows) - set(readings):
            del self._windows[key]
        for key, (owner, value) in readings.items():
            w = self._windows.get(key)
            if w is None or w.owner is not owner:
                w = self._windows[key] = _Window(owner)
            if isinstance(value, str):
                w.samples.clear()
                w.why = value
                continue
            w.why = ""
            if w.samples and (value < w.samples[-1][1] or now < w.samples[-1][0]):
                w.samples.clear()  # the counter (or the clock) restarted
            w.samples.append((now, value))
            # The window starts at the newest sample at least window_s old:
            # sampling a little late still covers the whole window.
            while len(w.samples) > 1 and w.samples[1][0] <= now - self.window_s:
                w.samples.popleft()
        self.gpus.update(read.gpus)

    def use(self, key: Key) -> ComputeUse:
        """What `key` used over its window, as of its last sample."""
        w = self._windows.get(key)
        if w is not None and w.why:
            return ComputeUse(None, None, w.why)
        if w is None or not w.samples:
            return ComputeUse(None, None, "unknown: no sample yet")
        (t0, g0), (t1, g1) = w.samples[0], w.samples[-1]
        if t1 <= t0:
            return ComputeUse(None, None, "unknown: one sample so far (a rate needs two)")
        return ComputeUse(round((g1 - g0) / ((t1 - t0) * 1e9) * 100, 1), round(t1 - t0, 1))

    def __len__(self) -> int:
        return len(self._windows)
