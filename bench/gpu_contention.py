"""libgpushare.so's compute shares under contention on a real GPU.

For a lent H100/H200 with its driver, PyTorch, make and a C compiler, in one
command of a few minutes (about 4 at the defaults; keep it under 8).  It
builds libgpushare.so and the /dev/gpushare stand-in (module mode through
the module's own scheduler core, as bench/gpu_compute.py does: gpushare.ko
cannot be loaded there), then measures, each in fresh processes:

  * the weighted pair, weights 30 and 60 in module mode (policy 2: GPU
    time 1:2), --pair-per-sync matmuls between synchronisations (20, as
    gpu_compute.py's pair), twice: GPUSHARE_SCHED_PACE=0 (the gate as
    before pacing) and the default (paced, heartbeating drains, early
    renewal), each with the stand-in's count of slices ended by force
    (a SCHED INFO call: ABI 4's forced_ends);
  * a deep-queue loop (--deep matmuls queued, no sync per kernel) at 30 %:
    standalone (GPUSHARE_CORE_LIMIT=30) and module mode (policy 3, weight
    30), as a % of the same loop without the library;
  * CUDA graphs of about --graph-ms (25 ms: longer than a 10 ms slice) at
    30 %, standalone and module mode, as a % of the graphs without it;
  * standalone 30 % next to an unmanaged process (no library) running the
    deep loop on the same GPU, as a % of the deep loop alone;
  * a standalone pair at 30 % and 60 % at once (1:2 is the goal).

It prints markdown tables (target vs measured; every rate is the median of
1 s rounds) and exits 0 whatever the figures: 1 only when a measurement
could not be made, 2 when it cannot run at all (no GPU, no PyTorch, no
compiler).  --fake runs the same measurements on the tests' fake driver
(libgpushare/tests/compute_load.c as the workload, no GPU, no PyTorch), so
that the plumbing is tested anywhere (libgpushare/tests/test_bench_gpu_contention.py).

    python3 bench/gpu_contention.py [--seconds 5] [--json out.json] [--out out.md] [--fake]
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
from gpu_common import (  # noqa: E402
    GPU,
    ROOT,
    build_library,
    in_build,
    markdown_table,
    torch_gpu,
)
from gpu_contention_children import (  # noqa: E402
    RESULT,
    child_main,
    fake_argv,
    fake_result,
    forced_ends,
)
from report_common import document  # noqa: E402

FAKE_UUID = "GPU-face0000-0000-0000-0000-000000000000"  # the fake driver's GPU 0
FAKE_KERNEL_US = 340  # --fake: a kernel of the fake GPU stands for a matmul
PARTS = ["pair", "deep", "graph", "neighbour", "standalone-pair"]
HEADERS = ["measurement", "target", "measured (median)", "detail"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (5)")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run (2)")
    p.add_argument("--round-seconds", type=float, default=1.0, help="one round (1)")
    p.add_argument("--size", type=int, default=2048, help="matmul size n (n x n fp32; 2048)")
    p.add_argument("--deep", type=int, default=256, help="matmuls queued per sync (256)")
    p.add_argument("--pair-per-sync", type=int, default=20, help="the pair's matmuls per sync")
    p.add_argument("--graph-ms", type=float, default=25.0, help="a graph's length, ms (25)")
    p.add_argument("--skip", action="append", default=[], choices=PARTS, help="leave out")
    p.add_argument("--build", type=Path, help="build directory (default: a temporary one)")
    p.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    p.add_argument("--json", type=Path, help="also write the figures and raw results here")
    p.add_argument("--fake", action="store_true", help="the tests' fake driver, no GPU")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0.5 <= a.seconds <= 120 or not 0 <= a.warmup <= 30:
        p.error("--seconds in 0.5..120 and --warmup in 0..30 please")
    if not 0.1 <= a.round_seconds <= a.seconds:
        p.error("--round-seconds in 0.1..--seconds please")
    if not 64 <= a.size <= 16384 or not 1 <= a.deep <= 65536 or not 1 <= a.pair_per_sync <= 1000:
        p.error("--size in 64..16384, --deep in 1..65536, --pair-per-sync in 1..1000 please")
    if not 11 <= a.graph_ms <= 1000:
        p.error("--graph-ms in 11..1000 (longer than a 10 ms slice) please")
    return a


@dataclass
class Row:
    what: str
    target: str
    measured: str
    detail: str = ""
    value: float | None = None

    def cells(self) -> list[str]:
        return [self.what, self.target, self.measured, self.detail]


def share_row(what: str, level: int, rate: float | None, base: float | None, detail: str) -> Row:
    if rate is None or not base:
        return Row(what, f"{level} %", "not measured", detail)
    got = 100 * rate / base
    return Row(what, f"{level} %", f"{got:.1f} %", detail, got)


def ratio_row(what: str, low: float | None, high: float | None, detail: str) -> Row:
    if not low or not high:
        return Row(what, "1:2", "not measured", detail)
    return Row(what, "1:2", f"1:{high / low:.3f}", detail, high / low)


@dataclass
class Runner:
    args: argparse.Namespace
    gpu: GPU
    lib: Path
    standin: Path
    tmp: Path
    load: Path | None = None
    """--fake: compute_load, whose folder's ../fake holds the fake driver."""
    errors: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    n: int = 0
    graph_matmuls: int = 0
    """A graph's matmuls, as the unrestricted run found them (0: not yet)."""

    def base_env(self) -> dict[str, str]:
        drop = ("GPUSHARE_", "FAKEGS_", "FAKECUDA_", "COMPUTE_LOAD_", "PYTORCH_")
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith(drop)}
        if self.load is not None:
            env["LD_LIBRARY_PATH"] = str(self.load.parent.parent / "fake")
            env["FAKECUDA_DEVICES"] = "1"
            env["FAKECUDA_GPU_STATE"] = str(self.tmp / "gpu")
        else:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu.uuid
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    def standalone(self, limit: int) -> dict[str, str]:
        env = self.base_env()
        env.update(LD_PRELOAD=str(self.lib), GPUSHARE_GPU_UUIDS=self.gpu.uuid)
        env.update(GPUSHARE_ISOLATION="full", GPUSHARE_CORE_LIMIT=str(limit))
        return env

    def schedule(self, policy: int) -> Path:
        """A fresh schedule for the stand-in, under @policy."""
        self.n += 1
        d = self.tmp / f"sched{self.n}"
        d.mkdir()
        (d / "ctl").write_text(f"policy 0 {policy}\n")
        return d

    def container(self, d: Path, name: str, weight: int, *, pace: bool = True) -> dict[str, str]:
        env = self.base_env()
        env.update(
            LD_PRELOAD=f"{self.standin} {self.lib}",
            GPUSHARE_GPU_UUIDS=self.gpu.uuid,
            FAKEGS_CONTAINER=name,
            FAKEGS_QUOTAS=f"0:{self.gpu.memory}:{weight}:0",
            FAKEGS_STATE=str(d / f"ledger-{name}"),
            FAKEGS_SCHED=str(d / "sched"),
            FAKEGS_CTL=str(d / "ctl"),
        )
        if not pace:
            env["GPUSHARE_SCHED_PACE"] = "0"
        return env

    def forced(self, d: Path, name: str) -> int | None:
        """The schedule @d's forced ends, asked as a process of @name."""
        env = self.container(d, name, 0)
        env["LD_PRELOAD"] = str(self.standin)
        return forced_ends(env)

    def spec(self, mode: str, per_sync: int, start_at: float = 0.0) -> dict[str, Any]:
        a, k = self.args, self.graph_matmuls
        spec = dict(kind="loop", mode=mode, size=a.size, per_sync=per_sync, graph_ms=a.graph_ms)
        spec |= dict(graph_matmuls=k, seconds=a.seconds, warmup=a.warmup, start_at=start_at)
        return spec | {"round_seconds": a.round_seconds}

    def run(self, label: str, jobs: list[tuple[dict[str, Any], dict[str, str]]]) -> list[float]:
        """Run @jobs (spec, env) at once; their median rates ([] on an error)."""
        procs: list[subprocess.Popen[str] | None] = []
        for spec, env in jobs:
            if self.load is not None:
                argv, more = fake_argv(str(self.load), spec, FAKE_KERNEL_US)
                env = {**env, **more}
            else:
                argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
            try:
                procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
            except OSError as e:
                self.errors.append(f"{label}: {argv[0]}: {e}")
                procs.append(None)
        limit = 180 + 15 * (self.args.seconds + self.args.warmup)
        results = [self.collect(p, spec, limit) for p, (spec, _) in zip(procs, jobs, strict=True)]
        self.raw[label] = results
        if any(r is None for r in results):
            self.errors.append(f"{label}: a process failed (exit status or no result)")
            return []
        if any(r["late"] > 0 for r in results if r):
            self.errors.append(f"{label}: a process started measuring late")
            return []
        return [statistics.median(r["rates"]) for r in results if r]

    def collect(
        self, p: subprocess.Popen[str] | None, spec: dict[str, Any], limit: float
    ) -> dict[str, Any] | None:
        """A workload's result, None when it failed."""
        if p is None:
            return None
        try:
            out, _ = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        if p.returncode != 0:
            return None
        if self.load is not None:
            return fake_result(out, spec, FAKE_KERNEL_US)
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
        return dict(json.loads(lines[-1][len(RESULT) :])) if lines else None

    def together(
        self, label: str, mode: str, per_sync: int, envs: list[dict[str, str]]
    ) -> list[float]:
        lead = 1.0 if self.load is not None else 30.0  # import torch, context, warm-up
        spec = self.spec(mode, per_sync, time.time() + lead)
        return self.run(label, [(spec, env) for env in envs])


def solo(r: Runner, label: str, mode: str, per_sync: int, env: dict[str, str]) -> float | None:
    rates = r.run(label, [(r.spec(mode, per_sync), env)])
    return rates[0] if rates else None


def measure_levels(r: Runner, mode: str, rows: list[Row]) -> float | None:
    """The loop (deep or graph) without the library, and at 30 % both ways."""
    per_sync = r.args.deep if mode == "plain" else 1
    name = (
        f"deep-queue loop ({per_sync} queued, no sync per kernel)"
        if mode == "plain"
        else f"CUDA graph of about {r.args.graph_ms:g} ms"
    )
    base = solo(r, f"{mode} no library", mode, per_sync, r.base_env())
    if mode == "graph" and base is not None:  # the same graphs at 30 %
        r.graph_matmuls = int(r.raw[f"{mode} no library"][0]["graph_matmuls"])
        name += f" ({r.graph_matmuls} matmuls)"
    rate = solo(r, f"{mode} standalone 30", mode, per_sync, r.standalone(30))
    rows.append(share_row(f"{name}, standalone 30 %", 30, rate, base, "vs no library"))
    d = r.schedule(3)
    rate = solo(r, f"{mode} module 30", mode, per_sync, r.container(d, "w30", 30))
    detail = f"policy 3, weight 30; forced ends {r.forced(d, 'w30')}"
    rows.append(share_row(f"{name}, module 30 %", 30, rate, base, detail))
    return base


def measure_pairs(r: Runner, rows: list[Row]) -> None:
    k = r.args.pair_per_sync
    for pace in (False, True):
        d = r.schedule(2)
        envs = [r.container(d, f"w{w}", w, pace=pace) for w in (30, 60)]
        label = "pair module " + ("paced" if pace else "pace off")
        rates = r.together(label, "plain", k, envs) or [0.0, 0.0]
        when = "default (after)" if pace else "GPUSHARE_SCHED_PACE=0 (before)"
        detail = f"forced ends {r.forced(d, 'w30')}; matmuls/s {rates[0]:,.0f} : {rates[1]:,.0f}"
        rows.append(ratio_row(f"weights 30 + 60, module mode, {when}", rates[0], rates[1], detail))


def measure_standalone(r: Runner, base: float | None, rows: list[Row]) -> None:
    k = r.args.deep
    if "neighbour" not in r.args.skip:
        if base is None:
            base = solo(r, "plain no library", "plain", k, r.base_env())
        rates = r.together("neighbour", "plain", k, [r.standalone(30), r.base_env()]) or [0.0, 0.0]
        other = f"{100 * rates[1] / base:.1f} %" if base else "?"
        rows.append(
            share_row(
                "standalone 30 % next to an unmanaged busy process",
                30,
                rates[0] or None,
                base,
                f"the unmanaged process: {other} of the loop alone",
            )
        )
    if "standalone-pair" not in r.args.skip:
        envs = [r.standalone(30), r.standalone(60)]
        rates = r.together("standalone pair", "plain", r.args.pair_per_sync, envs) or [0.0, 0.0]
        rows.append(ratio_row("standalone 30 % + 60 % at once", rates[0], rates[1], "no turns"))


def measure_all(r: Runner) -> list[Row]:
    rows: list[Row] = []
    skip = r.args.skip
    if "pair" not in skip:
        measure_pairs(r, rows)
    base = measure_levels(r, "plain", rows) if "deep" not in skip else None
    if "graph" not in skip:
        measure_levels(r, "graph", rows)
    measure_standalone(r, base, rows)
    return rows


def report(args: argparse.Namespace, r: Runner) -> int:
    rows = measure_all(r)
    where = "the fake driver (--fake)" if args.fake else f"{r.gpu.name} ({r.gpu.uuid})"
    text = [
        f"# libgpushare compute shares under contention on {where}\n",
        f"{args.size}x{args.size} fp32 matmuls; {args.seconds:g} s per run in "
        f"{args.round_seconds:g} s rounds after {args.warmup:g} s of warm-up; medians\n",
        markdown_table(HEADERS, [row.cells() for row in rows]),
    ]
    text += [f"\nError: {e}" for e in r.errors]
    print("\n".join(text), flush=True)
    if args.out:
        args.out.write_text("\n".join(text) + "\n")
    if args.json:
        figures = {row.what: row.value for row in rows if row.value is not None}
        doc = document(
            "gpu_contention",
            figures,
            headers=HEADERS,
            rows=[row.cells() for row in rows],
            errors=r.errors,
            gpu=where,
            raw=r.raw,
        )
        args.json.write_text(json.dumps(doc, default=str))
    return 1 if r.errors else 0


def build(args: argparse.Namespace, out: Path) -> tuple[Path, Path, Path | None]:
    """libgpushare.so, the stand-in and (--fake) the fake driver and workload."""
    lib = build_library(out)
    targets = [str(out / "fake" / "fake_gsdev.so")]
    load = out / "tests" / "compute_load" if args.fake else None
    if load is not None:
        targets += ["fake", str(load)]
    proc = subprocess.run(
        ["make", "-C", str(ROOT / "libgpushare"), f"BUILD={out}", *targets],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the stand-in failed:\n{proc.stdout}\n{proc.stderr}")
    return lib, out / "fake" / "fake_gsdev.so", load


def run(args: argparse.Namespace, gpu: GPU, out: Path) -> int:
    lib, standin, load = build(args, out)
    with tempfile.TemporaryDirectory(prefix="gpushare-contention-") as tmp:
        return report(args, Runner(args, gpu, lib, standin, Path(tmp), load))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.child:
        return child_main(args.child)
    if args.fake:
        gpu: GPU | None = GPU(0, FAKE_UUID, "fake GPU", 8 << 30)
    else:
        gpu = torch_gpu(
            "gpu_contention.py", "use --fake without one", "this benchmark needs PyTorch"
        )
    if gpu is None:
        return 2
    return in_build("gpu_contention.py", args.build, lambda out: run(args, gpu, out))


if __name__ == "__main__":
    sys.exit(main())
