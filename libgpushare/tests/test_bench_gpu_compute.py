"""bench/gpu_compute.py's logic that needs no GPU: arguments, the goals and
their table, the exit status, and the exit 2 with a reason when there is no
GPU or no PyTorch (a stand-in nvidia-smi and stand-in torch modules)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import FAKE_UUIDS, ROOT, Build

SCRIPT = ROOT / "bench" / "gpu_compute.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_compute", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_compute"] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["gpu_compute"]


def test_defaults_and_argument_errors(bench: ModuleType) -> None:
    a = bench.parse_args([])
    assert (a.seconds, a.levels, a.size, a.out) == (10.0, [10, 30, 50, 100], 2048, None)
    a = bench.parse_args(["--seconds", "3", "--levels", "25,75", "--out", "x.md"])
    assert (a.seconds, a.levels, a.out) == (3.0, [25, 75], Path("x.md"))
    for bad in (
        ["--levels", "0,50"],
        ["--levels", "10,10"],
        ["--levels", "101"],
        ["--levels", "x"],
        ["--levels", ""],
        ["--seconds", "0.1"],
        ["--size", "8"],
        ["--graph-matmuls", "0"],
        ["--rounds-per-process", "1"],
        ["--skip", "nothing"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_level_goals_within_three_points(bench: ModuleType) -> None:
    ok = bench.level_goal("matmul loop", 30, 296.0, 1000.0)
    assert (ok.achieved, ok.ok) == ("29.6 %", True)
    assert bench.level_goal("matmul loop", 30, 330.0, 1000.0).ok  # exactly 3 points
    assert not bench.level_goal("matmul loop", 30, 269.0, 1000.0).ok
    assert not bench.level_goal("graph", 10, 140.0, 1000.0).ok  # graphs not throttled
    missing = bench.level_goal("graph", 50, None, 1000.0)
    assert (missing.achieved, missing.ok) == ("not measured", False)
    assert not bench.level_goal("graph", 50, 500.0, None).ok


def test_pair_goal_is_one_to_two_within_five_percent(bench: ModuleType) -> None:
    assert bench.pair_goal(100.0, 209.0).ok
    assert bench.pair_goal(100.0, 191.0).ok
    assert not bench.pair_goal(100.0, 211.0).ok
    assert not bench.pair_goal(100.0, 600.0).ok  # HAMi's 1:6
    assert bench.pair_goal(100.0, 200.0).achieved == "1:2.00"
    assert not bench.pair_goal(None, 200.0).ok


def test_overhead_goal_on_medians(bench: ModuleType) -> None:
    base = [1000.0] * 9 + [900.0]
    assert bench.overhead_goal("preload, no limit", base, [995.0] * 10).ok
    assert bench.overhead_goal("preload, 100 %", base, [990.0] * 10).ok  # exactly 1 %
    slow = bench.overhead_goal("preload, 100 %", base, [980.0] * 10)
    assert not slow.ok and slow.achieved.startswith("+2.00% median")
    assert not bench.overhead_goal("preload, 100 %", base, []).ok


def test_goal_table_and_exit_code(bench: ModuleType) -> None:
    goals = [
        bench.level_goal("matmul loop", 30, 296.0, 1000.0),
        bench.pair_goal(100.0, 300.0),
    ]
    table = bench.goal_table(goals)
    assert table.splitlines()[0] == "| measurement | target | achieved | goal | result |"
    assert "| matmul loop at 30 % | 30 % | 29.6 % | ±3 points | PASS |" in table
    assert "| 1:2 | 1:3.00 | 1:2 within 5% | FAIL |" in table
    assert bench.exit_code(goals) == 1
    assert bench.exit_code(goals[:1]) == 0
    assert bench.exit_code([]) == 1  # nothing measured is no pass
    assert bench.percentile([1.0, 2.0, 3.0], 0.01) == 1.0


def test_a_known_limit_is_shown_but_does_not_decide_the_exit(bench: ModuleType) -> None:
    standalone = bench.pair_goal(100.0, 275.0, gates=False)
    module = bench.pair_goal(100.0, 198.0, "two containers at weights 30 + 60")
    assert standalone.row()[-1].startswith("FAIL (not gating")
    assert module.row()[0] == "two containers at weights 30 + 60"
    assert bench.exit_code([module, standalone]) == 0
    assert bench.exit_code([standalone]) == 1  # no gating goal at all is no pass
    assert bench.exit_code([bench.pair_goal(100.0, 300.0), standalone]) == 1


def test_overhead_interval_covers_the_noise(bench: ModuleType) -> None:
    rng = __import__("random").Random(1)
    noisy = [1000.0 * rng.uniform(0.7, 1.3) for _ in range(30)]
    same = [1000.0 * rng.uniform(0.7, 1.3) for _ in range(30)]
    low, high = bench.cost_interval(noisy, same)
    assert low < 0 < high and high - low > 0.05  # identical arms, wide noise
    assert bench.cost_interval(noisy, same) == (low, high)  # seeded
    tight = bench.cost_interval([1000.0] * 20, [980.0] * 20)
    assert tight == pytest.approx((0.02, 0.02))
    goal = bench.overhead_goal("standalone", [1000.0] * 20, [995.0] * 20, "loop", gates=False)
    assert "95 % interval +0.50% to +0.50%" in goal.achieved and not goal.gates
    assert bench.spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    unsure = bench.overhead_goal("standalone", noisy, [v * 0.97 for v in noisy], "loop")
    assert not unsure.ok and unsure.inconclusive and unsure.row()[-1].startswith("INCONCLUSIVE")
    clear = bench.overhead_goal("standalone", [1000.0] * 20, [950.0] * 20, "loop")
    assert not clear.ok and not clear.inconclusive and clear.row()[-1] == "FAIL"


def test_overhead_arms_rotate(bench: ModuleType) -> None:
    orders = [bench.rotated(r) for r in range(3)]
    assert [o[0] for o in orders] == bench.OVERHEAD_ARMS
    assert all(sorted(o) == sorted(bench.OVERHEAD_ARMS) for o in orders)


def test_child_environment(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_MEMORY_LIMIT", "1")
    monkeypatch.setenv("LD_PRELOAD", "/x.so")
    gpu = bench.GPU(0, "GPU-1", "H100", 80 << 30)
    env = bench.child_env(gpu, Path("/b/libgpushare.so"), 30)
    assert env["LD_PRELOAD"] == "/b/libgpushare.so" and env["GPUSHARE_CORE_LIMIT"] == "30"
    assert env["GPUSHARE_GPU_UUIDS"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert "GPUSHARE_MEMORY_LIMIT" not in env and "GPUSHARE_DEBUG" not in env
    assert "GPUSHARE_CORE_LIMIT" not in bench.child_env(gpu, Path("/b/l.so"), None)
    bare = bench.child_env(gpu, None, 30)
    assert "LD_PRELOAD" not in bare and not any(k.startswith("GPUSHARE_") for k in bare)


def test_launch_loop_and_module_mode_on_the_fake_driver(
    bench: ModuleType, build: Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The overhead measurement end to end, the fake driver in the real one's
    # place: bench/launch_loop.c and the stand-in build, every arm runs, and
    # the module arm really is in module mode.
    for name in list(os.environ):
        if name.startswith(("GPUSHARE_", "FAKECUDA_", "FAKEGS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(build.fake_dir))
    monkeypatch.setenv("FAKECUDA_NS_PER_BLOCK", "200")
    standin, loop = bench.build_tools(tmp_path / "b")
    args = bench.parse_args(
        ["--loop-processes", "2", "--loop-rounds", "2", "--loop-launches", "2000"]
    )
    gpu = bench.GPU(0, FAKE_UUIDS[0], "fake", 8 << 30)
    b = bench.Bench(args, gpu, build.lib, standin, loop, tmp_path)
    rows: list[list[object]] = []
    bench.measure_launch_loop(b, rows)
    assert b.notes == []
    assert [r[0] for r in rows] == bench.OVERHEAD_ARMS and all(r[1] == 4 for r in rows)
    assert [g.what.split(", ", 1)[1] for g in b.goals] == [
        f"{arm} vs no preload" for arm in bench.OVERHEAD_ARMS[1:]
    ]
    env = bench.module_env(b, "alone", 100, tmp_path / "sched-probe")
    env["GPUSHARE_DEBUG"] = "1"
    proc = subprocess.run([str(loop), "0", "1000", "1"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "compute module, weights [100]" in proc.stderr
    assert "ledger module, quotas [8589934592]" in proc.stderr


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_gpu_exits_2_and_says_why(tmp_path: Path) -> None:
    proc = run(dict(os.environ, PATH=str(tmp_path)))  # no nvidia-smi anywhere
    assert proc.returncode == 2
    assert "no NVIDIA GPU" in proc.stderr and proc.stdout == ""


FAKE_SMI = """#!/bin/sh
echo "0, GPU-face0000-0000-0000-0000-000000000000, Fake H100, 81559"
"""


@pytest.mark.parametrize(
    ("torch_module", "said"),
    [
        ("raise ImportError('no torch here')", "PyTorch is not installed"),
        (
            "class cuda:\n    is_available = staticmethod(lambda: False)\n",
            "PyTorch does not see a CUDA GPU",
        ),
    ],
)
def test_without_pytorch_with_cuda_exits_2_and_says_why(
    tmp_path: Path, torch_module: str, said: str
) -> None:
    bin_dir, lib_dir = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir()
    lib_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    (lib_dir / "torch.py").write_text(torch_module)  # shadows any real PyTorch
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", PYTHONPATH=str(lib_dir))
    proc = run(env)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "needs PyTorch with CUDA" in proc.stderr
