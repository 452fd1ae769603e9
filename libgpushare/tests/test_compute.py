"""Compute isolation on the fake driver's simulated GPU (issue 11's CI tests).

Each load (tests/compute_load.c) launches kernels through libgpushare.so as
a real program would; the fake GPU runs one kernel at a time and tells each
process how much kernel time it ran.  Module mode goes through the
/dev/gpushare stand-in (the real scheduler core, shared by the simulated
containers of a test); standalone mode through GPUSHARE_CORE_LIMIT.  A
share is GPU time over wall time, a ratio of simulated GPU time: the
criteria are the issue's (1:2 within 5 %, fixed shares within 3 points).
`pytest -s` prints the measured figures.  Deep queues, long graphs, many
containers and hostile tenants: test_contention.py, test_contention_hostile.py.
"""

from __future__ import annotations

import time
from typing import Any

from conftest import Client, Compute

PATHS = ("kernel", "ex", "coop", "multi", "graph", "capture", "host")


def _pct(r: dict[str, Any]) -> float:
    return 100 * float(r["share"])


def _show(label: str, results: list[dict[str, Any]]) -> str:
    text = f"{label}: " + ", ".join(
        f"{r['path']}/{r['lookup']} {_pct(r):.1f}% ({r['launches']} launches)" for r in results
    )
    print(text)
    return text


def _window_share(r: dict[str, Any], trace_ms: int, t_from: float, t_to: float) -> float:
    """The load's share of the GPU between @t_from and @t_to seconds."""
    lo, hi = round(t_from * 1000 / trace_ms), round(t_to * 1000 / trace_ms)
    samples = r["trace"][lo:hi]
    assert len(samples) == hi - lo, f"trace too short: {len(r['trace'])} samples"
    return 100 * sum(samples) / ((hi - lo) * trace_ms * 1e6)


def test_weights_one_to_two_give_gpu_time_one_to_two(compute: Compute) -> None:
    # Policy 2 (weighted preemptive, the default): weights 30 and 60.
    a, b = compute.run(
        {"env": compute.container("a", 30), "seconds": 3},
        {"env": compute.container("b", 60), "seconds": 3},
    )
    ratio = b["gpu_ns"] / a["gpu_ns"]
    msg = _show(f"weights 1:2 -> 1:{ratio:.3f}", [a, b])
    assert abs(ratio / 2 - 1) <= 0.05, msg
    # Together they keep the GPU busy (policy 2 is work-conserving).
    assert _pct(a) + _pct(b) >= 90, msg


def test_fixed_shares_hold_in_module_mode(compute: Compute) -> None:
    compute.ctl("policy 0 3")
    results = compute.run(
        *({"env": compute.container(f"c{w}", w), "seconds": 3} for w in (10, 30, 50))
    )
    msg = _show("policy 3, 10/30/50", results)
    for want, r in zip((10, 30, 50), results, strict=True):
        assert abs(_pct(r) - want) <= 3, msg


def test_fixed_shares_hold_in_standalone_mode(compute: Compute) -> None:
    # GPUSHARE_CORE_LIMIT by CUDA ordinal; one process per fake GPU (each
    # process holds only itself to its share).
    env = compute.standalone("10,30,50")
    loads = [{"env": {**env, "FAKECUDA_DEVICES": "3"}, "device": i} for i in range(3)]
    results = compute.run(*loads)
    msg = _show("standalone 10/30/50", results)
    for want, r in zip((10, 30, 50), results, strict=True):
        assert abs(_pct(r) - want) <= 3, msg


def test_a_graph_is_throttled_like_its_kernels_one_by_one(compute: Compute) -> None:
    # Two containers of 30 % each under policy 3: one launches a graph of
    # 50 kernels (5 ms of GPU time per launch), the other the same kernels
    # one by one.  Both get their share: a graph is charged what it took.
    compute.ctl("policy 0 3")
    graph, single = compute.run(
        {
            "env": {**compute.container("graph", 30), "COMPUTE_LOAD_GRAPH_NODES": "50"},
            "path": "graph",
            "seconds": 3,
        },
        {"env": compute.container("single", 30), "path": "kernel", "seconds": 3},
    )
    msg = _show("graph vs kernels at 30 %", [graph, single])
    assert graph["kernels"] == 50 * graph["launches"], msg
    assert abs(_pct(graph) - 30) <= 3, msg
    assert abs(_pct(graph) - _pct(single)) <= 3, msg


def test_high_priority_preempts_within_a_slice_and_keeps_to_prio_ratio(
    compute: Compute,
) -> None:
    slice_ms, ratio, trace_ms = 20, 60, 100
    compute.ctl("policy 0 2", f"prio_ratio 0 {ratio}", f"slice_us 0 {slice_ms * 1000}")
    t0 = time.monotonic_ns() + 300_000_000
    low = compute.start(compute.container("low", 50), seconds=3.5, t0=t0)
    high = compute.start(
        compute.container("high", 50, highprio=1),
        seconds=2.5,
        t0=t0 + 1_000_000_000,
        trace_ms=trace_ms,
    )
    lo, hi = compute.result(low), compute.result(high)
    first_ms = hi["first_ns"] / 1e6
    windows = [_window_share(hi, trace_ms, t / 10, t / 10 + 0.5) for t in range(0, 20, 5)]
    msg = _show(
        f"high priority: first grant after {first_ms:.1f} ms, 0.5 s windows "
        + "/".join(f"{w:.0f}" for w in windows)
        + " %",
        [hi, lo],
    )
    # Within one slice and its grace (GS_SCHED_GRACE: a quarter slice) of
    # asking, with a slice's margin for the test machine's own scheduling.
    assert first_ms <= slice_ms * 1.25 + slice_ms, msg
    # Served first (more than its weight alone would give), never beyond
    # prio_ratio while the other container has work.
    assert _pct(hi) > 50 + 3, msg
    assert all(w <= ratio + 3 for w in windows), msg


def test_switching_the_policy_live_changes_the_shares_within_a_second(
    compute: Compute,
) -> None:
    # Policy 3 with 20/20 caps both at 20 %; switched to 2 (weights 20:20)
    # at 1.2 s, each gets half of the GPU.
    trace_ms = 100
    compute.ctl("policy 0 3")
    t0 = time.monotonic_ns() + 300_000_000
    procs = [
        compute.start(compute.container(n, 20), seconds=3.2, t0=t0, trace_ms=trace_ms)
        for n in ("a", "b")
    ]
    time.sleep((t0 - time.monotonic_ns()) / 1e9 + 1.2)
    compute.ctl("policy 0 2")
    a, b = (compute.result(p) for p in procs)
    before = [_window_share(r, trace_ms, 0.2, 1.2) for r in (a, b)]
    after = [_window_share(r, trace_ms, 2.2, 3.1) for r in (a, b)]
    msg = _show(
        f"policy 3 -> 2: before {before[0]:.1f}/{before[1]:.1f} %, "
        f"from 1 s after {after[0]:.1f}/{after[1]:.1f} %",
        [a, b],
    )
    assert all(abs(s - 20) <= 3 for s in before), msg
    assert all(abs(s - 50) <= 5 for s in after), msg


def test_no_limit_gets_the_whole_gpu_and_costs_little_per_launch(compute: Compute) -> None:
    # No GPUSHARE_CORE_LIMIT (the gate is off), a container alone at weight
    # 100 (gated, every slice renewed), and no library at all.
    off, alone, bare = (
        compute.run({"env": env, "seconds": 1})[0]
        for env in (
            compute.standalone(None),
            compute.container("alone", 100),
            compute.standalone(None, preload="none"),
        )
    )
    msg = _show("no limit (library off, module alone at 100, no library)", [off, alone, bare])
    for r in (off, alone):
        assert _pct(r) >= _pct(bare) - 3, msg
    # The library's cost per launch: kernels of no duration, so the loop is
    # all launches (printed, not asserted: it is this machine's speed).
    zero = {"FAKECUDA_NS_PER_BLOCK": "0"}
    cost = {}
    for name, env in (
        ("off", compute.standalone(None)),
        ("alone", compute.container("alone0", 100)),
        ("none", compute.standalone(None, preload="none")),
    ):
        (r,) = compute.run({"env": {**env, **zero}, "seconds": 0.5})
        cost[name] = r["wall_ns"] / r["launches"]
    print(
        "ns per launch: "
        + ", ".join(f"{k} {v:.0f}" for k, v in cost.items())
        + f"; library's overhead: off {cost['off'] - cost['none']:.0f}, "
        f"module alone {cost['alone'] - cost['none']:.0f}"
    )


def test_every_launch_path_is_throttled(compute: Compute) -> None:
    # One fake GPU per path, each process held to 30 % in standalone mode.
    env = {**compute.standalone(",".join(["30"] * len(PATHS))), "FAKECUDA_DEVICES": "8"}
    results = compute.run(*({"env": env, "path": p, "device": i} for i, p in enumerate(PATHS)))
    msg = _show("every path at 30 %", results)
    for r in results:
        assert abs(_pct(r) - 30) <= 3, msg
    host = results[PATHS.index("host")]
    assert host["host_ran"] == host["launches"] and not host["host_disorder"], msg


def test_lookups_are_gated_and_the_suite_sees_a_bypass(compute: Compute) -> None:
    # Entry points found by dlsym and by cuGetProcAddress (its per-thread
    # default stream variants too, on stream 0) are throttled like direct
    # calls; with the build that does not wrap lookups, the dlsym path
    # escapes and the share is not held: the tests above would fail.
    limits = {**compute.standalone("30,30,30,30,30"), "FAKECUDA_DEVICES": "5"}
    gated = [("kernel", "dlsym"), ("kernel", "proc"), ("kernel", "ptds"), ("capture", "ptds")]
    nolookup = {**limits, **compute.standalone("30,30,30,30,30", preload="nolookup")}
    results = compute.run(
        *(
            {"env": limits, "path": p, "lookup": how, "device": i}
            for i, (p, how) in enumerate(gated)
        ),
        {"env": nolookup, "lookup": "dlsym", "device": len(gated)},
    )
    msg = _show("lookups at 30 % (the last without lookup wrappers)", results)
    for r in results[:-1]:
        assert abs(_pct(r) - 30) <= 3, msg
    assert _pct(results[-1]) > 30 + 30, msg


def test_the_fake_gpu_runs_one_kernel_at_a_time_and_times_it(client: Client) -> None:
    # The test bed itself, without the library: kernels of 1 us per block
    # queue behind each other on one device, whatever their stream; events
    # time them; capture runs nothing and forbids synchronising.
    r = client.run(
        """
device(0)
f = d.CUfunction(0x1000)
s1, s2 = ok(d.cuStreamCreate, 0), ok(d.cuStreamCreate, 0)
a, b = ok(d.cuEventCreate, 0), ok(d.cuEventCreate, 0)
ok(d.cuEventRecord, a, s1)
ok(d.cuLaunchKernel, f, 2000, 1, 1, 32, 1, 1, 0, s1, 0, 0)
ok(d.cuLaunchKernel, f, 1000, 2, 1, 32, 1, 1, 0, s2, 0, 0)
ok(d.cuEventRecord, b, s2)
R["query"] = call(d.cuEventQuery, b)[0]
ok(d.cuEventSynchronize, b)
R["two_streams_ms"] = ok(d.cuEventElapsedTime, a, b)
g = ok(d.cuGraphCreate, 0)
p = d.CUDA_KERNEL_NODE_PARAMS()
p.func, p.gridDimX, p.gridDimY, p.gridDimZ = f, 500, 1, 1
for _ in range(4):
    ok(d.cuGraphAddKernelNode, g, None, 0, p)
x = ok(d.cuGraphInstantiate, g, 0)
ok(d.cuEventRecord, a, s1)
ok(d.cuGraphLaunch, x, s1)
ok(d.cuEventRecord, b, s1)
ok(d.cuStreamSynchronize, s1)
R["graph_ms"] = ok(d.cuEventElapsedTime, a, b)
ok(d.cuStreamBeginCapture, s1, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
R["capturing"] = int(ok(d.cuStreamIsCapturing, s1))
ok(d.cuLaunchKernel, f, 1000, 1, 1, 32, 1, 1, 0, s1, 0, 0)
R["sync_in_capture"] = call(d.cuStreamSynchronize, s1)[0]
R["end_capture"] = call(d.cuStreamEndCapture, s1)[0]
""",
        preload=None,
    )
    assert r["query"] == "CUDA_ERROR_NOT_READY"
    # Lower bounds: the work itself; upper: plus the launching process's pace.
    assert 4.0 <= r["two_streams_ms"] < 6, r
    assert 2.0 <= r["graph_ms"] < 4, r
    assert r["capturing"] == 1
    assert r["sync_in_capture"] == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert r["end_capture"] == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
