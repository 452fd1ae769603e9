"""bench/synchronize.py at its quick size: the real plugin process answers
every chunk of a split Synchronize, reports every pod and container it
synchronized and every asking container as unserved (the script fails
otherwise), and the --json object is well formed.  No timing is judged.
About 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.plugin import ROOT


def test_synchronize_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "synchronize.json"
    # 600 containers of ~4 KiB are over ttrpc's 4 MiB: the request is split.
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "synchronize.py"),
            "--sizes",
            "100/500,120/1100",
            "--asking",
            "10",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "synchronize"
    assert doc["machine"] and doc["date"]
    assert doc["asking_every"] == 10
    rows = doc["rows"]
    assert [(r["pods"], r["containers"]) for r in rows] == [(100, 500), (120, 1100)]
    assert [r["asking"] for r in rows] == [10 * 5, 11 * 10]  # pods 0, 10, ... of 5 or 10
    for row in rows:
        assert isinstance(row["ok"], bool)
        assert row["seconds"] > 0 and row["rss_mb"] > 0 and row["rss_peak_mb"] >= row["rss_mb"]
        assert row["chunks"] >= 1 and row["bytes"] > 0
    assert rows[0]["chunks"] == 1 and rows[1]["chunks"] > 1  # split as containerd 1.7 splits
    for key in ("seconds", "cpu_seconds", "rss_mb", "rss_peak_mb", "rss_idle_mb", "chunks"):
        for row in rows:
            value = doc["figures"][f"{key}_{row['containers']}"]
            assert isinstance(value, int | float) and not isinstance(value, bool)
    lines = [line for line in result.stdout.splitlines() if " containers: " in line]
    assert len(lines) == 2, result.stdout
