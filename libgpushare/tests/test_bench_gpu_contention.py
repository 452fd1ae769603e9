"""bench/gpu_contention.py without a GPU: its arguments and rows, the exit 2
with a reason when there is no GPU, and every measurement end to end on the
tests' fake driver (--fake: compute_load.c in PyTorch's place), the
stand-in's forced ends included.  No figure is judged here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT, Build

SCRIPT = ROOT / "bench" / "gpu_contention.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_contention", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_contention"] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["gpu_contention"]


def test_defaults_and_argument_errors(bench: ModuleType) -> None:
    a = bench.parse_args([])
    assert (a.seconds, a.warmup, a.deep, a.pair_per_sync, a.graph_ms) == (5.0, 2.0, 256, 20, 25.0)
    assert not a.fake and a.skip == []
    a = bench.parse_args(["--fake", "--skip", "graph", "--skip", "pair", "--deep", "64"])
    assert a.fake and a.skip == ["graph", "pair"] and a.deep == 64
    for bad in (
        ["--seconds", "0.1"],
        ["--round-seconds", "9", "--seconds", "2"],
        ["--graph-ms", "5"],  # not longer than a slice
        ["--deep", "0"],
        ["--size", "8"],
        ["--skip", "nothing"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_rows_say_target_and_measured(bench: ModuleType) -> None:
    row = bench.share_row("loop, standalone 30 %", 30, 298.0, 1000.0, "vs no library")
    assert row.cells() == ["loop, standalone 30 %", "30 %", "29.8 %", "vs no library"]
    assert row.value == pytest.approx(29.8)
    assert bench.share_row("x", 30, None, 1000.0, "").measured == "not measured"
    assert bench.share_row("x", 30, 300.0, None, "").value is None
    pair = bench.ratio_row("weights 30 + 60", 100.0, 197.0, "forced ends 0")
    assert (pair.target, pair.measured, pair.value) == ("1:2", "1:1.970", 1.97)
    assert bench.ratio_row("x", 0.0, 0.0, "").measured == "not measured"


def test_without_a_gpu_exits_2_and_points_at_fake(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "1"],
        env=dict(os.environ, PATH=str(tmp_path)),  # no nvidia-smi anywhere
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no NVIDIA GPU" in proc.stderr and "--fake" in proc.stderr and proc.stdout == ""


def test_every_measurement_runs_on_the_fake_driver(
    build: Build, compute_bins: tuple[Path, Path], tmp_path: Path
) -> None:
    # The whole command, the fake driver in the GPU's place: every row is
    # measured, the module rows through the stand-in (with its forced ends,
    # read by the SCHED INFO call), the pair before and after pacing.
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith(("GPUSHARE_", "FAKECUDA_", "FAKEGS_"))
    }
    out = tmp_path / "out.json"
    argv = [sys.executable, str(SCRIPT), "--fake", "--seconds", "0.6", "--warmup", "0"]
    argv += ["--round-seconds", "0.5", "--build", str(build.dir), "--json", str(out)]
    argv += ["--out", str(tmp_path / "out.md")]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "gpu_contention" and doc["errors"] == []
    rows = {r[0]: r for r in doc["rows"]}
    assert len(rows) == 8, list(rows)
    before = rows["weights 30 + 60, module mode, GPUSHARE_SCHED_PACE=0 (before)"]
    after = rows["weights 30 + 60, module mode, default (after)"]
    for row in (before, after):
        assert row[1] == "1:2" and row[2].startswith("1:"), row
        assert row[3].startswith("forced ends ") and row[3].split()[2].rstrip(";").isdigit(), row
    module = [r for name, r in rows.items() if name.endswith("module 30 %")]
    assert len(module) == 2 and all("forced ends " in r[3] for r in module)
    assert "None" not in json.dumps(doc["rows"])
    assert all(r[2] != "not measured" for r in rows.values())
    assert set(doc["figures"]) == set(rows)
    assert (tmp_path / "out.md").read_text().count("\n| ") == 9  # header + 8 rows


def test_a_failed_measurement_exits_1(bench: ModuleType, tmp_path: Path) -> None:
    # A workload that does not run: the row is not measured, the error is
    # said, and the exit status is 1 (misses never are: only errors).
    args = bench.parse_args(["--fake", "--seconds", "1", "--skip", "pair", "--skip", "graph"])
    args.skip += ["neighbour", "standalone-pair"]
    gpu = bench.GPU(0, bench.FAKE_UUID, "fake", 8 << 30)
    r = bench.Runner(args, gpu, tmp_path / "no.so", tmp_path / "no.so", tmp_path, tmp_path / "nx")
    assert bench.report(args, r) == 1
    assert r.errors and "failed" in r.errors[0]
