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
from conftest import ROOT

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
