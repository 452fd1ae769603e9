"""bench/report's rendering from canned benchmark JSON: goals judged MET /
NOT MET, a missing or failed benchmark reported as such (and the exit status
non-zero), the GPU and notes sections, plots written as PNGs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
STAMP = {"machine": "testhost / 2 CPUs / Linux 6", "date": "2026-11-24T12:00:00+00:00"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_report() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    loader = importlib.machinery.SourceFileLoader("bench_report", str(BENCH / "report"))
    spec = importlib.util.spec_from_loader("bench_report", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


report = load_report()


def doc(name: str, figures: dict[str, float], **extra: Any) -> dict[str, Any]:
    return {"benchmark": name, **STAMP, "figures": figures, **extra}


def create_doc(ratio: float, handling_ms: float) -> dict[str, Any]:
    arms = ["no plugin", "Go null plugin", "null plugin", "gpushare"]
    samples = {arm: [1.0 + i * 0.1 + j * 0.01 for j in range(20)] for i, arm in enumerate(arms)}
    figures = {f"{arm} p50_ms": 1.0 + i * 0.1 for i, arm in enumerate(arms)}
    figures |= {"gpushare ratio_to_go": ratio, "gpushare handling p50_ms": handling_ms}
    handling = {"gpushare": {"count": 20, "p50": handling_ms, "p99": handling_ms * 2}}
    return doc("create_latency", figures, samples_ms=samples, handling_ms=handling)


def canned(good: bool) -> dict[str, dict[str, Any]]:
    """A document per benchmark (synchronize left out: the missing one)."""
    pods = {"pods": 50, "fit": 33, "placed": 33 if good else 30, "refused": 17}
    pods |= {"over_capacity": 0, "wrong_refusals": 0, "wall_s": 2.0}
    gpu = {"index": 0, "memory_total": 12 << 30, "memory_reserved": 1 << 30}
    gpu |= {"memory_allocated": 11 << 30, "core_allocated": 88, "containers": 11}
    rss = {"idle_rss_kib": 40000, "start_rss_kib": 40100, "end_rss_kib": 40150}
    rss |= {"kib_per_cycle": 0.01 if good else 0.19, "cycles": 10000}
    accuracy = [
        {"name": "standalone, 30 %", "target": 30.0, "unit": "%", "median": 29.5,
         "samples": [29.5, 29.6]},
        {"name": "weights 1:2 (ratio)", "target": 2.0, "unit": "ratio", "median": 1.9,
         "samples": [1.9]},
    ]  # fmt: skip
    handler = {"null p50_us": 10.0, "gpushare p50_us": 50.0 if good else 300.0, "own p50_us": 40.0}
    return {
        "create_latency": create_doc(1.1 if good else 1.9, 0.12 if good else 0.4),
        "handler_latency": doc(
            "handler_latency", handler, samples_us={"null": [60.0, 61.0], "gpushare": [120.0]}
        ),
        "concurrent_pods": doc(
            "concurrent_pods",
            pods,
            samples_ms={"create": [3.0, 4.0], "start": [5.0, 6.0]},
            gpus=[gpu],
            checks=[["all that fit placed", good, "33 placed"]],
        ),
        "rss_cycles": doc(
            "rss_cycles",
            rss,
            samples=[[0, 40000], [1000, 40100], [10000, 40150]],
            warmup=1000,
            every=1000,
        ),
        "container_start": doc(
            "container_start",
            {"runc p50_ms": 50.0}
            | {
                f"{arm} added_p50_ms": 20.0 if good else 200.0
                for arm in ("wrapper, no share", "wrapper, share", "docker, CDI hooks")
            },
            samples_ms={"runc": [50.0, 51.0], "wrapper, share": [70.0, 72.0]},
            baselines={"runc": "runc", "wrapper, share": "runc"},
        ),
        "interposer_overhead": doc(
            "interposer_overhead",
            {"sync driver only median_ns": 3000.0},
            samples_ns={"sync": {"driver only": [3000.0], "interposer, quota": [3100.0]}},
        ),
        "interposer_compute": doc(
            "interposer_compute",
            {"no library pct": 98.0, "lost_points": 0.5 if good else 2.0},
            accuracy=accuracy,
        ),
    }


def write_results(results: Path, docs: dict[str, Any], status: dict[str, Any]) -> None:
    results.mkdir(parents=True)
    for name, d in docs.items():
        (results / f"{name}.json").write_text(json.dumps(d))
    (results / report.STATUS_FILE).write_text(json.dumps(status))


def goal_rows(docs: dict[str, Any], status: dict[str, Any]) -> dict[str, list[str]]:
    return {g.what: report.judge(g, docs, status) for g in report.GOALS}


def test_goals_met_and_not_met() -> None:
    met = goal_rows(canned(True), {})
    missed = goal_rows(canned(False), {})
    judged = [g.what for g in report.GOALS if g.benchmark != "synchronize"]
    assert len(judged) == 9
    for what in judged:
        assert met[what][3] == "MET", met[what]
        assert missed[what][3] == "NOT MET", missed[what]
    ratio = "gpushare's added CreateContainer p50 against the Go null plugin's"
    assert met[ratio][2] == "1.1 ×"
    assert missed["gpushare's own CreateContainer handling, p50"][2] == "400 µs"


def test_goal_run_below_the_goals_size_says_so() -> None:
    docs = canned(True)
    docs["rss_cycles"]["figures"]["cycles"] = 200
    row = goal_rows(docs, {})["Plugin RSS growth over 10,000 create/remove cycles (after warm-up)"]
    assert row[3] == "MET (run size: 200 cycles, the goal is for 10000)"


def test_synchronize_goals_from_rows_or_figures() -> None:
    rows = [
        {"pods": 2000, "containers": 10000, "seconds": 0.4, "rss_mb": 120.0, "ok": True},
        {"pods": 4000, "containers": 20000, "seconds": 1.5, "rss_mb": 150.0, "ok": True},
    ]
    docs = {"synchronize": doc("synchronize", {"seconds_20000": 0.9}, rows=rows)}
    got = goal_rows(docs, {})
    assert got["Synchronize, 10,000 containers"][2:4] == ["0.4 s", "MET"]
    assert got["Synchronize, 20,000 containers"][2:4] == ["0.9 s", "MET"]  # the figure first
    cpu = "Synchronize, 20,000 containers: the plugin's CPU time"
    assert got[cpu][3] == "NOT MEASURED (not in this run's figures)"
    rows[1]["cpu_seconds"] = 0.7
    assert goal_rows(docs, {})[cpu][2:4] == ["0.7 s", "NOT MET"]
    docs["synchronize"]["figures"]["cpu_seconds_20000"] = 0.45
    assert goal_rows(docs, {})[cpu][2:4] == ["0.45 s", "MET"]
    rss = got["Plugin RSS at 10,000 containers (peak, VmHWM, through the Synchronize)"]
    assert rss[2:4] == ["126 MB", "NOT MET"]  # the benchmark's MiB, judged in MB
    rows[0]["rss_peak_mb"] = 90.0  # the peak, where given, is what is judged
    assert goal_rows(docs, {})[rss[0]][2:4] == ["94.4 MB", "MET"]
    rows[0]["rss_peak_mb"] = 98.0  # 98 MiB is 102.8 MB: over the goal
    assert goal_rows(docs, {})[rss[0]][2:4] == ["103 MB", "NOT MET"]


def test_missing_and_failed_benchmarks_are_not_measured() -> None:
    docs = canned(True)
    del docs["create_latency"]
    status = {
        "create_latency": {"state": "failed", "detail": "exit status 1", "tail": "Boom"},
        "synchronize": {"state": "missing", "detail": "bench/synchronize.py does not exist"},
    }
    got = goal_rows(docs, status)
    assert got["gpushare's own CreateContainer handling, p50"][3] == (
        "NOT MEASURED (benchmark failed)"
    )
    assert got["Synchronize, 10,000 containers"][3] == "NOT MEASURED (benchmark missing)"
    del docs["rss_cycles"]["figures"]["kib_per_cycle"]
    row = goal_rows(docs, {})["Plugin RSS growth over 10,000 create/remove cycles (after warm-up)"]
    assert row[3] == "NOT MEASURED (not in this run's figures)"


def test_render_only_writes_the_report_and_exits_non_zero_on_a_failure(tmp_path: Path) -> None:
    docs = canned(True)
    status = {name: {"state": "ok", "seconds": 1.0, "command": f"bench/{name}.py"} for name in docs}
    status["container_start"] = {
        "state": "failed",
        "detail": "exit status 2",
        "tail": "Traceback: dockerd did not start",
    }
    write_results(tmp_path / "results", docs, status)
    notes = tmp_path / "notes.md"
    notes.write_text("### Synchronize\n\nDecoding is the cause (hand-written).\n")
    rc = report.main(["--render-only", "--out", str(tmp_path), "--notes", str(notes)])
    assert rc == 1  # container_start failed, synchronize missing
    text = (tmp_path / "REPORT.md").read_text()
    assert "**FAILED**: exit status 2" in text
    assert "Traceback: dockerd did not start" in text
    assert "**MISSING**" in text  # synchronize
    assert "Decoding is the cause (hand-written)." in text
    assert "TODO (coordinator)" not in text
    assert "No GPU was lent for this run" in text
    assert STAMP["machine"] in text and STAMP["date"] in text
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert {"create_latency.png", "handler_latency.png", "rss_cycles.png"} <= pngs
    for png in pngs:
        assert (tmp_path / png).read_bytes().startswith(PNG_MAGIC)
        assert f"]({png})" in text


def test_render_only_all_ok_exits_zero_and_leaves_a_todo(tmp_path: Path) -> None:
    docs = canned(True)
    docs["synchronize"] = doc(
        "synchronize",
        {"seconds_10000": 0.3},
        rows=[{"pods": 100, "containers": 500, "seconds": 0.05, "rss_mb": 40.0, "ok": True}],
    )
    write_results(tmp_path / "results", docs, {n: {"state": "ok"} for n in docs})
    assert report.main(["--render-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "TODO (coordinator)" in text
    assert (tmp_path / "synchronize.png").exists()


def test_gpu_json_adds_the_gpu_tables(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "gpu"
    gpu_dir.mkdir()
    memory = doc(
        "gpu_memory",
        {"quota_mib": 4096.0, "fill torch native allocated_mib": 4090.0},
        tables=[{"title": "Filling", "headers": ["allocator", "allocated"], "rows": [["a", 1]]}],
        checks=[["torch is installed", True, ""]],
        gpu="NVIDIA H100 (GPU-1)",
    )
    (gpu_dir / "gpu_memory.json").write_text(json.dumps(memory))  # gpu_compute.json missing
    write_results(tmp_path / "results", canned(True), {})
    rc = report.main(["--render-only", "--out", str(tmp_path), "--gpu-json", str(gpu_dir)])
    assert rc == 1  # synchronize and gpu_compute missing
    text = (tmp_path / "REPORT.md").read_text()
    assert "No GPU was lent" not in text
    assert "NVIDIA H100 (GPU-1)" in text
    assert "no gpu_compute.json in" in text
    assert "- `gpu_memory` on the GPU machine: 1 of 1 goals and checks met." in text
    assert "- `gpu_compute`: no goals or checks (see its section)." in text
    assert (tmp_path / "gpu_memory.png").read_bytes().startswith(PNG_MAGIC)
    # Kept with the results as results/gpu, the GPU run is found without the flag.
    (gpu_dir / "gpu_memory.json").rename(tmp_path / "results" / "gpu_memory.json")
    (tmp_path / "results" / "gpu").mkdir()
    (tmp_path / "results" / "gpu_memory.json").rename(
        tmp_path / "results" / "gpu" / "gpu_memory.json"
    )
    assert report.main(["--render-only", "--out", str(tmp_path)]) == 1
    assert "NVIDIA H100 (GPU-1)" in (tmp_path / "REPORT.md").read_text()


def test_a_failing_or_absent_script_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "BENCH", tmp_path)
    (tmp_path / "bad.py").write_text("import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)\n")
    bad = report.Benchmark("bad", "bad.py", "a failing benchmark")
    got = report.run_benchmark(bad, tmp_path, quick=True)
    assert got["state"] == "failed" and got["rc"] == 3 and "oops" in got["tail"]
    absent = report.run_benchmark(report.Benchmark("x", "absent.py", "x"), tmp_path, quick=True)
    assert absent["state"] == "missing"
