"""Standalone mode under contention (src/feedback.c).

A process held to GPUSHARE_CORE_LIMIT in standalone mode charges its
private core for the time it held the GPU, and next to a busy neighbour
that hold takes in the neighbour's kernels (the fake GPU is FIFO, as a
real one time-slices).  The feedback steers the core's weight by the
process's own GPU time as NVML reports it (the fake NVML's per-process
samples, from the kernels the simulated GPU ran for each pid), so that
the process gets its share of the GPU, not of its holds.

Shares are simulated GPU time over wall time, measured from the load's
trace once the feedback has had time to settle (NVML samples every 1/6 s,
as the real driver does): SETTLE_S to the end of the run.  `pytest -s`
prints the figures.
"""

from __future__ import annotations

from typing import Any

from conftest import Compute

SECONDS = 5.0
TRACE_MS = 100
SETTLE_S = 2.0  # the window measured: SETTLE_S .. SECONDS - 0.2


def _share(r: dict[str, Any]) -> float:
    """The load's share of the GPU (percent) after the feedback settled."""
    lo, hi = round(SETTLE_S * 1000 / TRACE_MS), round((SECONDS - 0.2) * 1000 / TRACE_MS)
    samples: list[int] = r["trace"][lo:hi]
    assert len(samples) == hi - lo, f"trace too short: {len(r['trace'])} samples"
    return 100 * sum(samples) / ((hi - lo) * TRACE_MS * 1e6)


def _run(compute: Compute, *envs: dict[str, str]) -> tuple[list[float], str]:
    """Run one load per environment on GPU 0 together; their settled shares."""
    results = compute.run(*({"env": env, "seconds": SECONDS, "trace_ms": TRACE_MS} for env in envs))
    shares = [_share(r) for r in results]
    text = ", ".join(
        f"{s:.1f}% (whole run {100 * r['share']:.1f}%)"
        for s, r in zip(shares, results, strict=True)
    )
    print(text)
    return shares, text


def _limited(compute: Compute, limit: int, **extra: str) -> dict[str, str]:
    return {**compute.standalone(str(limit)), **extra}


def test_thirty_percent_next_to_an_unmanaged_busy_process(compute: Compute) -> None:
    (mine, other), msg = _run(
        compute, _limited(compute, 30), compute.standalone(None, preload="none")
    )
    assert 27 <= mine <= 33, msg
    assert mine + other >= 90, msg


def test_thirty_percent_next_to_a_library_process_with_no_limit(compute: Compute) -> None:
    (mine, other), msg = _run(compute, _limited(compute, 30), compute.standalone(None))
    assert 27 <= mine <= 33, msg
    assert mine + other >= 90, msg


def test_a_pair_of_33_and_67_percent_gets_one_to_two(compute: Compute) -> None:
    (a, b), msg = _run(compute, _limited(compute, 33), _limited(compute, 67))
    assert abs(b / a / 2 - 1) <= 0.05, msg
    assert a + b >= 90, msg


def test_thirty_percent_alone_is_unchanged(compute: Compute) -> None:
    (mine,), msg = _run(compute, _limited(compute, 30))
    assert 27 <= mine <= 33, msg


def test_without_feedback_the_neighbour_takes_the_share(compute: Compute) -> None:
    # GPUSHARE_STANDALONE_FEEDBACK=0: the hold is charged as exclusive, and
    # the process gets about its limit times its part of its holds.  The
    # tests above would fail without the feedback.
    off = _limited(compute, 30, GPUSHARE_STANDALONE_FEEDBACK="0")
    (mine, _), msg = _run(compute, off, compute.standalone(None, preload="none"))
    assert mine < 24, msg


def test_in_a_pid_namespace_the_pid_nvml_reports_is_found(compute: Compute) -> None:
    # NVML reports every process under another number (FAKENVML_PID_OFFSET,
    # as a host sees a container's processes): getpid() is not on its list,
    # and the process finds its own by the memory probe.
    ns = {"FAKENVML_PID_OFFSET": "100000"}
    (mine, other), msg = _run(
        compute, _limited(compute, 30, **ns), {**compute.standalone(None, preload="none"), **ns}
    )
    assert 27 <= mine <= 33, msg
    assert mine + other >= 90, msg
