"""The benchmarks still run and bench/report writes its report from them
(no timing is judged here).  The report's quick run covers every benchmark
script, each with its --json checked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.integration.plugin import ROOT
from tests.testbed.fixtures import require_testbed
from tests.unit.test_bench_report import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_quick_runs_every_benchmark(tmp_path: Path) -> None:
    """bench/report --quick: every benchmark at tiny sizes (~1 min), each one's
    JSON as the convention says, REPORT.md with every section and its PNGs."""
    require_testbed()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for bench in report.BENCHMARKS:
        doc = json.loads((tmp_path / "results" / f"{bench.name}.json").read_text())
        assert doc["benchmark"] == bench.name
        assert doc["machine"] and doc["date"]
        assert doc["figures"], bench.name
        for key, value in doc["figures"].items():
            assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    text = (tmp_path / "REPORT.md").read_text()
    assert "**Quick run**" in text
    for bench in report.BENCHMARKS:
        assert f"(bench/{bench.script})" in text
    assert "FAILED" not in text and "MISSING" not in text and "(benchmark " not in text
    # Quick sizes leave some goals unmeasured (no 10,000-container Synchronize).
    goals = re.findall(r"\| (?:MET|NOT MET|NOT MEASURED)\b", text)
    assert len(goals) == len(report.GOALS), text
    pngs = re.findall(r"\]\(([\w.]+\.png)\)", text)
    assert len(pngs) >= len(report.BENCHMARKS), text
    for png in pngs:
        assert (tmp_path / png).read_bytes().startswith(PNG_MAGIC), png


def test_handler_ab_compares_two_trees(tmp_path: Path) -> None:
    """bench/handler_ab.py against this tree's own HEAD, at tiny sizes: both
    trees run, each arm gets a ratio (no timing is judged)."""
    out = tmp_path / "ab.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "handler_ab.py"), "--base", "HEAD"]
        + ["--rounds", "2", "--requests", "20", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "handler_ab" and doc["base"] == "HEAD"
    for arm in ("null", "gpushare", "gpushare-plain"):
        assert doc["figures"][f"{arm} ratio"] > 0
        assert len(doc["rounds"]["base"][arm]) == len(doc["rounds"]["this"][arm]) == 2
