"""The benchmark script still runs (no timing is judged here)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.plugin import ROOT
from tests.testbed.fixtures import require_testbed


def test_create_latency_benchmark_runs():
    require_testbed()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "create_latency.py"), "--containers", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for arm in ("no plugin", "Go null plugin", "null plugin", "gpushare"):
        assert any(line.startswith(arm) for line in lines), result.stdout
    assert "gpushare's own CreateContainer handling" in result.stdout


def test_interposer_overhead_benchmark_runs():
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "interposer_overhead.py"),
            "--rounds",
            "2",
            "--pairs",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for row in ("| driver only |", "| interposer, off |", "| interposer, quota |"):
        assert result.stdout.count(row) == 2, result.stdout  # sync and async tables
