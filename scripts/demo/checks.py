"""The demo's checks, on plain numbers: a quota that holds, and shares of
the GPU's time that meet their targets.  A failed check raises `DemoFailed`
with one line naming it; the demo prints that line and exits 1."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
TOLERANCE = 3.0
"""Points a measured share may be off its target."""
BUSY_MARGIN = 3.0
"""Points the simulated GPU may be idle below what the loads ask for before
the host counts as too loaded to measure (the qemu guest, where processes
wake slowly between the module's slices, allows more)."""


class DemoFailed(Exception):
    """A check failed: the message is one line naming it."""


@dataclass(frozen=True)
class Pod:
    """A compute pod of the demo: its name, container ID, and what it asks.
    `target`: gpu-core percent, None for none; `exact`: the share must come
    out at the target (False: the target is only a cap, as for a standalone
    process next to one nobody holds back)."""

    name: str
    container_id: str
    target: int | None
    exact: bool = True


@dataclass(frozen=True)
class Window:
    """One measured window: seconds, the percent of the simulated GPU's time
    each container got (by container ID) and all processes together, and
    the most any load's threads waited for a CPU (percent of the window,
    summed over its threads; None: not known)."""

    seconds: float
    shares: dict[str, float]
    total: float
    cpu_wait: float | None = None


def check_quota(lines: Sequence[str], quota: int) -> None:
    """The memory program's output (scripts/demo/cuda_demo.c) shows the quota
    as the card's size, allocations up to it succeed and one byte more fails
    with CUDA's out-of-memory error."""
    seen = {line.split(" ->")[0]: line for line in lines}

    def result(key: str) -> int:
        line = seen.get(key)
        if line is None:
            raise DemoFailed(f"memory quota: the program printed no {key!r} line: {list(lines)}")
        return int(line.rsplit("-> ", 1)[1])

    info = next((ln for ln in lines if ln.startswith("cuMemGetInfo total ")), "")
    if not info or int(info.split()[2]) != quota:
        raise DemoFailed(f"memory quota: cuMemGetInfo does not show {quota} bytes total: {info!r}")
    for key in (f"cuDeviceTotalMem {quota}", f"nvmlDeviceGetMemoryInfo total {quota} used 0"):
        if result(key) != CUDA_SUCCESS:
            raise DemoFailed(f"memory quota: {key!r} failed")
    allocs = [ln for ln in lines if ln.startswith("cuMemAlloc ") and "more byte" not in ln]
    held = sum(int(ln.split()[1]) for ln in allocs if ln.endswith(f"-> {CUDA_SUCCESS}"))
    if held != quota or len(allocs) != sum(ln.endswith("-> 0") for ln in allocs):
        raise DemoFailed(f"memory quota: allocating up to {quota} bytes got {held}: {allocs}")
    over = result("cuMemAlloc 1 more byte")
    if over != CUDA_ERROR_OUT_OF_MEMORY:
        raise DemoFailed(
            f"memory quota does not hold: one byte past {quota} bytes returned {over}, "
            f"not {CUDA_ERROR_OUT_OF_MEMORY} (CUDA_ERROR_OUT_OF_MEMORY)"
        )


def busy_needed(pods: Sequence[Pod], margin: float = BUSY_MARGIN) -> float:
    """How busy (percent) the simulated GPU must be over a window for its
    shares to count: what the loads ask for (100 when one is held back by
    nothing, or only by a cap), less `margin` points."""
    greedy = any(p.target is None or not p.exact for p in pods)
    wanted = 100.0 if greedy else min(100.0, float(sum(p.target or 0 for p in pods)))
    return wanted - margin


def check_shares(pods: Sequence[Pod], window: Window) -> None:
    """Each pod with a target got it within TOLERANCE points (a cap: at most
    that); raises DemoFailed naming the first that did not."""
    for p in pods:
        got = window.shares.get(p.container_id)
        if got is None:
            raise DemoFailed(f"compute share of {p.name}: no process of it ran on the GPU")
        if p.target is None:
            continue
        if p.exact and abs(got - p.target) > TOLERANCE:
            raise DemoFailed(
                f"compute share of {p.name}: measured {got:.1f}% for gpu-core {p.target} "
                f"(more than {TOLERANCE:g} points off, over {window.seconds:.1f} s)"
            )
        if not p.exact and got > p.target + TOLERANCE:
            raise DemoFailed(
                f"compute share of {p.name}: measured {got:.1f}% over its cap of {p.target}% "
                f"(by more than {TOLERANCE:g} points, over {window.seconds:.1f} s)"
            )


def measured(
    pods: Sequence[Pod],
    measure: Callable[[], Window],
    tries: int = 3,
    margin: float = BUSY_MARGIN,
    between: Callable[[], None] = lambda: None,
) -> tuple[Window, int]:
    """Measure windows until the simulated GPU was busy for what the loads
    ask (at most `tries`); the window and how many were taken (check_shares
    then checks it).  A GPU idle every time fails, never passes: the host was
    too loaded to run the loads, or they fell short by themselves (how long
    they waited for a CPU and their last shares tell which).  `between` runs
    before each new try (the loads' feedback settles after a starved window)."""
    need = busy_needed(pods, margin)
    seen = []
    for attempt in range(1, tries + 1):
        if attempt > 1:
            between()
        window = measure()
        if window.total >= need:
            return window, attempt
        waited = "" if window.cpu_wait is None else f", its loads waiting {window.cpu_wait:.1f}%"
        seen.append(f"{window.total:.1f}%{waited}")
        print(
            f"    the simulated GPU was busy {window.total:.1f}% of the window (at least "
            f"{need:g}% needed){waited} for a CPU: not busy enough to measure shares"
            + ("; measuring again" if attempt < tries else ""),
            flush=True,
        )
    last = ", ".join(f"{p.name} {window.shares.get(p.container_id, 0.0):.1f}%" for p in pods)
    raise DemoFailed(
        f"compute shares not measured: the simulated GPU was idle too much in {tries} windows "
        f"(busy {'; '.join(seen)}; at least {need:g}% needed): the host is too loaded to keep "
        f"it busy, or the loads fell short of their shares (last window: {last})"
    )
