"""libgpushare.so on a real GPU: compute shares and launch overhead, standalone mode.

For a machine with an NVIDIA GPU, its driver, PyTorch, make and a C compiler
(the project's lent H100).  It builds libgpushare.so, then runs each
measurement in a fresh process with

    LD_PRELOAD=libgpushare.so  GPUSHARE_GPU_UUIDS=<GPU 0's UUID>
    CUDA_VISIBLE_DEVICES=<the same UUID>  GPUSHARE_CORE_LIMIT=<percent>

(no kernel module: the interposer's standalone mode, each process holding
itself to its share) and prints markdown:

  * a fixed matmul loop (--size square fp32 matmuls, TF32 off: a fraction of
    a millisecond each on an H100), and the same loop captured as a CUDA
    graph of --graph-matmuls matmuls, at each of --levels percent: its
    throughput (matmuls per second over --seconds, after a warm-up) as a
    fraction of the same loop without the library;
  * two processes at once with 33 % and 67 %: their throughput ratio (1:2);
  * the interposer's cost on a launch-heavy loop (torch.add on small
    tensors): without the library, with it and no limit, with it at 100 %,
    in alternating processes, each timing short rounds; medians and p99 of
    the per-round throughput.

Goals (issue 11): every level within 3 points of its target, plain and
graphs; the pair 1:2 within 5 %; overhead at most 1 %.  The goal table is
also written to --out.  Exit status: 0 when every goal holds, 1 when one
fails, 2 when it cannot run (no GPU, no PyTorch, no compiler, bad arguments).

    python3 bench/gpu_compute.py [--seconds 10] [--levels 10,30,50,100] [--out bench/gpu_compute.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402  (a script: its folder on the path first)
    GPU,
    NoGPU,
    build_library,
    find_gpu,
    markdown_table,
    percentile,
)
from report_common import document  # noqa: E402

RESULT = "GPU_COMPUTE_RESULT "
LEVEL_POINTS = 3.0  # a level within this many percentage points of its target
PAIR_TOLERANCE = 0.05  # the pair's ratio within 5 % of 1:2
OVERHEAD_MAX = 0.01  # at most 1 % less throughput with the library
PAIR = (33, 67)


def parse_levels(text: str) -> list[int]:
    """'10,30,50,100' -> [10, 30, 50, 100]: distinct percents in 1..100."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of percents: {text!r}") from None
    if not levels or any(not 1 <= v <= 100 for v in levels) or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(
            f"--levels: distinct whole percents in 1..100, comma-separated (got {text!r})"
        )
    return levels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="libgpushare.so on a real GPU: compute shares and launch overhead."
    )
    p.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per throughput run (10)"
    )
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run (2)")
    p.add_argument(
        "--levels",
        type=parse_levels,
        default=[10, 30, 50, 100],
        help="GPUSHARE_CORE_LIMIT percents to measure (10,30,50,100)",
    )
    p.add_argument("--size", type=int, default=2048, help="matmul size n (n x n fp32; 2048)")
    p.add_argument(
        "--graph-matmuls", type=int, default=20, help="matmuls per captured CUDA graph (20)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="alternating overhead processes per arm (3)"
    )
    p.add_argument(
        "--round-seconds", type=float, default=0.5, help="one timed overhead round (0.5)"
    )
    p.add_argument(
        "--rounds-per-process", type=int, default=10, help="timed rounds per process (10)"
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["levels", "graphs", "pair", "overhead"],
        help="leave a part out (repeatable)",
    )
    p.add_argument("--build", type=Path, help="build directory (default: a temporary one)")
    p.add_argument("--out", type=Path, help="also write the goal table (markdown) here")
    p.add_argument("--json", type=Path, help="also write every raw result here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0.5 <= a.seconds <= 600:
        p.error("--seconds must be between 0.5 and 600")
    if not 0 <= a.warmup <= 60:
        p.error("--warmup must be between 0 and 60")
    if not 64 <= a.size <= 16384:
        p.error("--size must be between 64 and 16384")
    if not 1 <= a.graph_matmuls <= 1000:
        p.error("--graph-matmuls must be between 1 and 1000")
    if a.rounds < 1 or a.rounds_per_process < 2 or a.round_seconds <= 0:
        p.error("--rounds >= 1, --rounds-per-process >= 2 and --round-seconds > 0 please")
    return a


@dataclass
class Goal:
    """One row of the goal table."""

    what: str
    target: str
    achieved: str
    goal: str
    ok: bool

    def row(self) -> list[str]:
        return [self.what, self.target, self.achieved, self.goal, "PASS" if self.ok else "FAIL"]


GOAL_HEADERS = ["measurement", "target", "achieved", "goal", "result"]


def level_goal(loop: str, level: int, rate: float | None, base: float | None) -> Goal:
    """`loop` at GPUSHARE_CORE_LIMIT=`level`: its throughput as a percent of
    the unrestricted loop's, within LEVEL_POINTS of the level."""
    goal = f"±{LEVEL_POINTS:g} points"
    what = f"{loop} at {level} %"
    if rate is None or not base:
        return Goal(what, f"{level} %", "not measured", goal, False)
    got = 100.0 * rate / base
    return Goal(what, f"{level} %", f"{got:.1f} %", goal, abs(got - level) <= LEVEL_POINTS)


def pair_goal(low: float | None, high: float | None) -> Goal:
    """Two processes at PAIR percents at once: throughput 1:2 within PAIR_TOLERANCE."""
    what = f"two processes {PAIR[0]} % + {PAIR[1]} % at once"
    goal = f"1:2 within {PAIR_TOLERANCE:.0%}"
    if not low or not high:
        return Goal(what, "1:2", "not measured", goal, False)
    ratio = high / low
    return Goal(what, "1:2", f"1:{ratio:.2f}", goal, abs(ratio / 2 - 1) <= PAIR_TOLERANCE)


def overhead_goal(arm: str, without: list[float], with_: list[float]) -> Goal:
    """The library's cost on per-round throughput: 1 - median(with) / median(without)."""
    what = f"launch-heavy loop, {arm} vs no preload"
    goal = f"≤ {OVERHEAD_MAX:.0%} (median)"
    if not without or not with_:
        return Goal(what, "0 %", "not measured", goal, False)
    b50, w50 = statistics.median(without), statistics.median(with_)
    b99, w99 = percentile(without, 0.01), percentile(with_, 0.01)  # the slowest rounds
    cost = 1 - w50 / b50
    achieved = f"{cost:+.2%} median, {1 - w99 / b99:+.2%} p99 round"
    return Goal(what, "0 %", achieved, goal, cost <= OVERHEAD_MAX + 1e-9)


def goal_table(goals: list[Goal]) -> str:
    return markdown_table(GOAL_HEADERS, [g.row() for g in goals])


def exit_code(goals: list[Goal]) -> int:
    """0 when every goal holds (and there is one), 1 otherwise."""
    return 0 if goals and all(g.ok for g in goals) else 1


# ---------------------------------------------------------------- children
# Each measurement runs in a process of its own (the preload and its limit
# are per process); it prints one RESULT line of JSON.


def _matmul(spec: dict[str, Any]) -> dict[str, Any]:
    """Matmuls per second over spec['seconds'], plain or as graph replays."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    n, k = int(spec["size"]), int(spec["graph_matmuls"])
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    stream = torch.cuda.Stream()
    graph = None
    with torch.cuda.stream(stream):
        for _ in range(3):  # cuBLAS picks its kernel and workspace before capture
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        if spec["mode"] == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(k):
                    torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

        def batch() -> int:
            if graph is not None:
                graph.replay()
                return k
            for _ in range(k):
                torch.matmul(a, b, out=c)
            return k

        def run(seconds: float) -> tuple[int, float]:
            done = 0
            start = time.perf_counter()
            while True:
                done += batch()
                stream.synchronize()
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    return done, elapsed

        run(spec["warmup"])
        late = 0.0
        if spec.get("start_at"):  # the pair: both measure over the same seconds
            late = time.time() - spec["start_at"]
            if late < 0:
                time.sleep(-late)
        matmuls, elapsed = run(spec["seconds"])
    return {"rate": matmuls / elapsed, "matmuls": matmuls, "elapsed": elapsed, "late": late}


def _launches(spec: dict[str, Any]) -> dict[str, Any]:
    """Small torch.add launches per second, per round of spec['round_seconds']."""
    import torch

    x = torch.ones(256, device="cuda")
    y = torch.ones(256, device="cuda")
    per_sync = 1000

    def run(seconds: float) -> float:
        done = 0
        start = time.perf_counter()
        while True:
            for _ in range(per_sync):
                torch.add(x, y, out=x)
            torch.cuda.synchronize()
            done += per_sync
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return done / elapsed

    run(spec["warmup"])
    return {"rates": [run(spec["round_seconds"]) for _ in range(spec["rounds"])]}


def _probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One launch under GPUSHARE_DEBUG: the interposer says what it does."""
    import torch

    x = torch.ones(16, device="cuda")
    torch.add(x, x, out=x)
    torch.cuda.synchronize()
    return {}


CHILDREN = {"matmul": _matmul, "launches": _launches, "probe": _probe}


def run_child_main(raw: str) -> int:
    spec = json.loads(raw)
    out = CHILDREN[spec["kind"]](spec)
    print(RESULT + json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------ parent


@dataclass
class ChildResult:
    ok: bool
    value: dict[str, Any]
    stderr: str
    why: str = ""


@dataclass
class Bench:
    args: argparse.Namespace
    gpu: GPU
    lib: Path
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


def has_torch_cuda() -> str:
    """'' when PyTorch is installed and sees a GPU, else why not."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot start {sys.executable}: {e}"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"PyTorch is not installed for {sys.executable} ({tail[:120]})"
    if proc.stdout.strip() != "True":
        return "PyTorch does not see a CUDA GPU (torch.cuda.is_available() is False)"
    return ""


def child_env(gpu: GPU, lib: Path | None, limit: int | None, debug: bool = False) -> dict[str, str]:
    """A child's environment: the library preloaded (lib) with GPUSHARE_CORE_LIMIT
    `limit` (None: no limit), or nothing of gpushare at all (lib None)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith(("GPUSHARE_", "PYTORCH_"))
    }
    env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
        env["GPUSHARE_GPU_UUIDS"] = gpu.uuid
        env["GPUSHARE_ISOLATION"] = "full"
        if limit is not None:
            env["GPUSHARE_CORE_LIMIT"] = str(limit)
        if debug:
            env["GPUSHARE_DEBUG"] = "1"
    return env


def start_child(spec: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish_child(proc: subprocess.Popen[str], timeout: float) -> ChildResult:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return ChildResult(False, {}, "", f"timed out after {timeout:.0f} s")
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return ChildResult(False, {}, err, tail[:200])
    return ChildResult(True, json.loads(lines[-1][len(RESULT) :]), err)


def run_child(spec: dict[str, Any], env: dict[str, str], timeout: float) -> ChildResult:
    return finish_child(start_child(spec, env), timeout)


def child_timeout(args: argparse.Namespace) -> float:
    # Start-up (import torch, a CUDA context) plus the runs, throttled at 10 %.
    return 120.0 + 15 * float(args.warmup + args.seconds)


def matmul_spec(args: argparse.Namespace, mode: str, **more: Any) -> dict[str, Any]:
    return {
        "kind": "matmul",
        "mode": mode,
        "size": args.size,
        "graph_matmuls": args.graph_matmuls,
        "seconds": args.seconds,
        "warmup": args.warmup,
        **more,
    }


def measure_probe(b: Bench) -> None:
    """The interposer is loaded and gates in standalone mode at a level below 100."""
    level = min([v for v in b.args.levels if v < 100] or [50])
    r = run_child({"kind": "probe"}, child_env(b.gpu, b.lib, level, debug=True), 300)
    said = f"compute standalone, limits [{level}] percent"
    ok = r.ok and said in r.stderr
    b.raw["probe"] = r.stderr[-2000:] if r.ok else r.why
    b.goals.append(
        Goal(
            "the interposer gates in standalone mode",
            f"GPUSHARE_CORE_LIMIT={level}",
            "said so (GPUSHARE_DEBUG)" if ok else (r.why or "did not say so"),
            f"'{said}'",
            ok,
        )
    )


def measure_levels(b: Bench, mode: str, rows: list[list[Any]]) -> float | None:
    """One loop (plain or graph) unrestricted and at each level; the base rate."""
    loop = "matmul loop" if mode == "plain" else f"CUDA graph of {b.args.graph_matmuls} matmuls"
    timeout = child_timeout(b.args)
    base_run = run_child(matmul_spec(b.args, mode), child_env(b.gpu, None, None), timeout)
    b.raw[f"{mode} unrestricted"] = base_run.value or base_run.why
    base = base_run.value.get("rate") if base_run.ok else None
    rows.append([loop, "no preload", f"{base:,.0f}" if base else f"error: {base_run.why}", "100"])
    for level in b.args.levels:
        r = run_child(matmul_spec(b.args, mode), child_env(b.gpu, b.lib, level), timeout)
        b.raw[f"{mode} {level}"] = r.value or r.why
        rate = r.value.get("rate") if r.ok else None
        share = f"{100 * rate / base:.1f}" if rate and base else ""
        rows.append([loop, f"{level} %", f"{rate:,.0f}" if rate else f"error: {r.why}", share])
        b.goals.append(level_goal(loop, level, rate, base))
    return base


def measure_pair(b: Bench, base: float | None, rows: list[list[Any]]) -> None:
    timeout = child_timeout(b.args)
    start_at = time.time() + 30  # both are warm by then (import, context, warm-up)
    procs = [
        start_child(matmul_spec(b.args, "plain", start_at=start_at), child_env(b.gpu, b.lib, level))
        for level in PAIR
    ]
    results = [finish_child(p, timeout + 60) for p in procs]
    rates: list[float | None] = []
    for level, r in zip(PAIR, results, strict=True):
        b.raw[f"pair {level}"] = r.value or r.why
        rate = r.value.get("rate") if r.ok else None
        if r.ok and r.value.get("late", 0) > 0:
            b.notes.append(
                f"the {level} % process of the pair started {r.value['late']:.1f} s late"
            )
            rate = None
        rates.append(rate)
        share = f"{100 * rate / base:.1f}" if rate and base else ""
        rows.append(
            [
                f"matmul loop, pair {PAIR[0]}+{PAIR[1]}",
                f"{level} %",
                f"{rate:,.0f}" if rate else f"error: {r.why}",
                share,
            ]
        )
    b.goals.append(pair_goal(rates[0], rates[1]))


OVERHEAD_ARMS = [("no preload", False, None), ("no limit", True, None), ("100 %", True, 100)]


def measure_overhead(b: Bench, rows: list[list[Any]]) -> None:
    a = b.args
    spec = {
        "kind": "launches",
        "warmup": a.warmup,
        "round_seconds": a.round_seconds,
        "rounds": a.rounds_per_process,
    }
    timeout = 120 + a.warmup + a.round_seconds * a.rounds_per_process * 2
    rates: dict[str, list[float]] = {name: [] for name, _, _ in OVERHEAD_ARMS}
    for rnd in range(a.rounds):
        # Rotate the order: drift (clocks, temperature) falls on every arm alike.
        order = OVERHEAD_ARMS[rnd % 3 :] + OVERHEAD_ARMS[: rnd % 3]
        for name, preload, limit in order:
            r = run_child(spec, child_env(b.gpu, b.lib if preload else None, limit), timeout)
            if not r.ok:
                b.notes.append(f"overhead, {name}: {r.why}")
                continue
            rates[name].extend(r.value["rates"])
    b.raw["overhead"] = rates
    for name, values in rates.items():
        if values:
            rows.append(
                [
                    name,
                    len(values),
                    f"{statistics.median(values):,.0f}",
                    f"{percentile(values, 0.01):,.0f}",
                ]
            )
    base = rates["no preload"]
    for name, _, _ in OVERHEAD_ARMS[1:]:
        b.goals.append(overhead_goal(f"preload, {name}", base, rates[name]))


def report(args: argparse.Namespace, gpu: GPU, lib: Path) -> int:
    b = Bench(args, gpu, lib)
    out: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        out.append(text)

    say(f"# libgpushare compute shares on {gpu.name} ({gpu.uuid}), standalone mode\n")
    say(
        f"{args.size}x{args.size} fp32 matmuls (TF32 off), graphs of {args.graph_matmuls}; "
        f"{args.seconds:g} s per run after {args.warmup:g} s of warm-up; "
        f"Python {sys.version.split()[0]}\n"
    )
    measure_probe(b)
    rows: list[list[Any]] = []
    tables: list[dict[str, Any]] = []
    base = None
    if "levels" not in args.skip:
        base = measure_levels(b, "plain", rows)
    if "graphs" not in args.skip:
        measure_levels(b, "graph", rows)
    if "pair" not in args.skip:
        measure_pair(b, base, rows)
    if rows:
        say("## Throughput (matmuls per second)\n")
        headers = ["loop", "GPUSHARE_CORE_LIMIT", "matmuls/s", "% of no preload"]
        say(markdown_table(headers, rows))
        say()
        title = "Throughput (matmuls per second)"
        tables.append({"title": title, "headers": headers, "rows": rows})
    if "overhead" not in args.skip:
        orows: list[list[Any]] = []
        measure_overhead(b, orows)
        say(
            f"## Launch-heavy loop (torch.add, 256 floats): launches per second per "
            f"{args.round_seconds:g} s round\n"
        )
        headers = ["arm", "rounds", "median", "p99 (slowest 1 %)"]
        say(markdown_table(headers, orows))
        say()
        title = "Launch-heavy loop (torch.add, 256 floats): launches per second"
        tables.append({"title": title, "headers": headers, "rows": orows})
    say("## Goals\n")
    table = goal_table(b.goals)
    say(table)
    for note in b.notes:
        say(f"\nNote: {note}")
    if args.out:
        args.out.write_text("\n".join(out) + "\n")
    if args.json:
        # The benchmark convention's object (bench/report_common.py), plus
        # goals: rows of goal_headers; tables: [{"title", "headers", "rows"}]
        # as printed; notes; gpu; raw: every child's result.  Figures: each
        # goal's achieved number where it is one ("<measurement> achieved").
        figures: dict[str, float] = {}
        for g in b.goals:
            try:
                figures[f"{g.what} achieved"] = float(g.achieved.split()[0])
            except (ValueError, IndexError):
                pass
        doc = document(
            "gpu_compute",
            figures,
            goals=[g.row() for g in b.goals],
            goal_headers=GOAL_HEADERS,
            tables=tables,
            notes=b.notes,
            gpu=f"{gpu.name} ({gpu.uuid})",
            raw=b.raw,
        )
        args.json.write_text(json.dumps(doc, default=str))
    return exit_code(b.goals)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.child:
        return run_child_main(args.child)
    try:
        gpu = find_gpu()
    except NoGPU as e:
        print(f"gpu_compute.py: no NVIDIA GPU: {e}; this benchmark needs one", file=sys.stderr)
        return 2
    if why := has_torch_cuda():
        print(f"gpu_compute.py: {why}; this benchmark needs PyTorch with CUDA", file=sys.stderr)
        return 2
    try:
        if args.build:
            return report(args, gpu, build_library(args.build.resolve()))
        with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
            return report(args, gpu, build_library(Path(tmp)))
    except RuntimeError as e:
        print(f"gpu_compute.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
