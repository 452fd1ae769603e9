"""The demo's checks (scripts/demo/checks.py) fail where they must: on
fabricated numbers, a share 10 points off its target fails, a cap
exceeded fails, a quota that does not hold fails, and a host too loaded
to keep the simulated GPU busy is measured again, then fails with that
reason, never passes."""

import pytest

from scripts.demo.checks import (
    DemoFailed,
    Pod,
    Window,
    busy_needed,
    check_quota,
    check_shares,
    measured,
)
from scripts.demo.measure import cpu_wait_ns, parse_snapshot, window_of

GiB = 1 << 30
PAIR = [Pod("core-30", "a", 30), Pod("core-60", "b", 60)]


def window(a: float, b: float, total: float | None = None, wait: float | None = 3.0) -> Window:
    return Window(4.0, {"a": a, "b": b}, a + b if total is None else total, wait)


def test_shares_within_three_points_pass():
    check_shares(PAIR, window(32.9, 57.1))


def test_a_share_ten_points_off_fails_naming_the_pod():
    with pytest.raises(DemoFailed, match=r"core-60: measured 50\.0% for gpu-core 60"):
        check_shares(PAIR, window(30.0, 50.0))
    with pytest.raises(DemoFailed, match="core-30"):
        check_shares(PAIR, window(40.0, 60.0))


def test_a_cap_passes_below_and_fails_above():
    capped = [PAIR[0], Pod("core-60", "b", 60, exact=False)]
    check_shares(capped, window(30.0, 34.0))
    with pytest.raises(DemoFailed, match="over its cap"):
        check_shares(capped, window(30.0, 64.0))


def test_a_pod_that_never_ran_fails():
    with pytest.raises(DemoFailed, match="no process of it ran"):
        check_shares(PAIR, Window(4.0, {"a": 30.0}, 30.0))


def test_the_busy_bar_is_what_the_loads_ask_for():
    assert busy_needed(PAIR) == 87.0
    assert busy_needed([*PAIR, Pod("no-core", "c", None)]) == 97.0


def test_a_loaded_host_is_measured_again_then_passes():
    windows = iter([window(20.0, 40.0), window(30.0, 60.0)])
    rests = []
    got, tries = measured(PAIR, lambda: next(windows), between=lambda: rests.append(1))
    assert tries == 2 and got.shares == {"a": 30.0, "b": 60.0} and rests == [1]


def test_a_host_loaded_every_time_fails_with_that_reason():
    calls = []

    def loaded() -> Window:
        calls.append(1)
        return window(20.0, 40.0)

    with pytest.raises(
        DemoFailed, match=r"in 3 windows \(busy 60\.0%, its loads waiting 3\.0%; "
    ) as e:
        measured(PAIR, loaded)
    assert "too loaded" in str(e.value) and "core-30 20.0%, core-60 40.0%" in str(e.value)
    assert len(calls) == 3


def test_a_busy_gpu_with_a_missed_share_is_not_retried_but_fails():
    got, tries = measured(PAIR, lambda: window(20.0, 70.0))
    assert tries == 1
    with pytest.raises(DemoFailed, match="core-30"):
        check_shares(PAIR, got)


LINES = [
    f"cuMemGetInfo total {GiB} free {GiB} -> 0",
    f"cuDeviceTotalMem {GiB} -> 0",
    f"nvmlDeviceGetMemoryInfo total {GiB} used 0 -> 0",
    *[f"cuMemAlloc {GiB // 4} -> 0"] * 4,
    "cuMemAlloc 1 more byte -> 2",
    f"held {GiB}",
]


def test_a_quota_that_holds_passes():
    check_quota(LINES, GiB)


@pytest.mark.parametrize(
    ("index", "line", "match"),
    [
        (7, "cuMemAlloc 1 more byte -> 0", "does not hold"),
        (0, f"cuMemGetInfo total {16 * GiB} free {16 * GiB} -> 0", "cuMemGetInfo"),
        (6, f"cuMemAlloc {GiB // 4} -> 2", "allocating up to"),
        (2, f"nvmlDeviceGetMemoryInfo total {16 * GiB} used 0 -> 0", "nvmlDeviceGetMemoryInfo"),
    ],
)
def test_a_quota_that_does_not_hold_fails(index, line, match):
    lines = list(LINES)
    lines[index] = line
    with pytest.raises(DemoFailed, match=match):
        check_quota(lines, GiB)


def test_shares_come_from_the_simulated_gpus_executed_time():
    s0 = parse_snapshot("now 1000000000\nproc 10 1 0 100\nproc 11 1 0 0\nproc 12 0 5 9\n")
    s1 = parse_snapshot(
        "now 5000000000\nproc 10 1 0 1200000100\nproc 11 1 0 2400000000\nproc 13 1 0 200000000\n"
    )
    w = window_of(s0, s1, 1, {10: "a", 11: "b", 13: None})
    assert w.seconds == 4.0 and w.shares == {"a": 30.0, "b": 60.0} and w.total == 95.0
    with pytest.raises(ValueError):
        parse_snapshot("garbage")
    waited = window_of(s0, s1, 1, {10: "a"}, {10: 40_000_000, 11: 80_000_000})
    assert waited.cpu_wait == 2.0  # the most any load waited: 80 ms of 4 s


def test_cpu_wait_sums_the_threads_runnable_time(tmp_path):
    for tid, line in ((7, "100 300 5\n"), (8, "1 200 2\n"), (9, "garbled\n")):
        (tmp_path / "7" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "7" / "task" / str(tid) / "schedstat").write_text(line)
    assert cpu_wait_ns(7, tmp_path) == 500
    assert cpu_wait_ns(8, tmp_path) == 0
