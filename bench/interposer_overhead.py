"""What libgpushare.so adds to CUDA allocation calls, on the tests' fake driver.

Builds the interposer and the fake driver (make -C libgpushare), compiles
bench/interposer_loop.c (cuMemAlloc_v2/cuMemFree_v2 and cuMemAllocAsync/
cuMemFreeAsync pairs through dlsym), and runs it in rounds that rotate
between three configurations, so that a busy machine slows all alike:

  driver only        no preload
  interposer, off    preloaded, GPUSHARE_ISOLATION=none (pass-through)
  interposer, quota  preloaded, a standalone quota (reserve, record, release)

Prints the median and p99 over rounds of the time per allocate+free pair, the
time the interposer adds, and the ratio to the driver alone.  The fake
driver's own cost is an mmap and a munmap per pair, far below a real
driver's, so the ratio overstates what a real GPU would show; the added
nanoseconds are the interposer's own cost.  For a real GPU see
bench/gpu_memory.py.

    .venv/bin/python bench/interposer_overhead.py [--rounds 30] [--pairs 20000] [--json PATH]

--json PATH also writes the benchmark convention's object (bench/report_common.py):
  figures: "<kind> <configuration> median_ns", "... p99_ns", "... added_ns" (the
    median minus the driver's alone), kind "sync" (cuMemAlloc_v2 + cuMemFree_v2)
    or "async" (cuMemAllocAsync + cuMemFreeAsync);
  samples_ns: {kind: {configuration: [ns per pair, one per round]}};
  rounds, pairs: the run's size.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from report_common import write_json  # noqa: E402

CONFIGS = {
    "driver only": {},
    "interposer, off": {"preload": True, "GPUSHARE_ISOLATION": "none"},
    "interposer, quota": {
        "preload": True,
        "GPUSHARE_ISOLATION": "full",
        "GPUSHARE_MEMORY_LIMIT": str(4 << 30),
    },
}


def build(workdir: Path) -> tuple[Path, Path, Path]:
    lib_build = workdir / "libgpushare"
    make = ["make", "-s", "-C", str(ROOT / "libgpushare"), f"BUILD={lib_build}", "all", "fake"]
    subprocess.run(make, check=True)
    loop = workdir / "interposer_loop"
    source = ROOT / "bench" / "interposer_loop.c"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(loop), str(source)], check=True)
    return lib_build / "libgpushare.so", lib_build / "fake", loop


def run_once(loop: Path, lib: Path, fake: Path, config: dict, pairs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHARE_", "LD_"))}
    env["LD_LIBRARY_PATH"] = str(fake)
    env.update({k: v for k, v in config.items() if k != "preload"})
    if config.get("preload"):
        env["LD_PRELOAD"] = str(lib)
    out = subprocess.run(
        [str(loop), str(pairs), str(1 << 20)], env=env, check=True, capture_output=True, text=True
    ).stdout
    return {kind: float(ns) for kind, ns in (line.split() for line in out.splitlines())}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--json", type=Path, help="also write the figures and samples here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.pairs < 1:
        parser.error("--rounds and --pairs must be at least 1")

    with tempfile.TemporaryDirectory(prefix="gs-interposer-bench-") as tmp:
        lib, fake, loop = build(Path(tmp))
        samples: dict[str, dict[str, list[float]]] = {
            name: {"sync": [], "async": []} for name in CONFIGS
        }
        for _ in range(args.rounds):
            for name, config in CONFIGS.items():
                for kind, ns in run_once(loop, lib, fake, config, args.pairs).items():
                    samples[name][kind].append(ns)

    print(
        f"# libgpushare.so overhead on the fake driver\n\n"
        f"{platform.node()}, {os.cpu_count()} CPUs, {date.today()}; {args.rounds} rounds "
        f"of {args.pairs} allocate+free pairs of 1 MiB per configuration, rotating.\n"
    )
    figures: dict[str, float] = {}
    for kind, title in (
        ("sync", "cuMemAlloc_v2 + cuMemFree_v2"),
        ("async", "cuMemAllocAsync + cuMemFreeAsync"),
    ):
        base = statistics.median(samples["driver only"][kind])
        print(f"## {title}\n")
        print("| configuration | median ns/pair | p99 ns/pair | added (median) | ratio |")
        print("|---|---:|---:|---:|---:|")
        for name in CONFIGS:
            values = samples[name][kind]
            median = statistics.median(values)
            figures[f"{kind} {name} median_ns"] = median
            figures[f"{kind} {name} p99_ns"] = p99(values)
            figures[f"{kind} {name} added_ns"] = median - base
            print(
                f"| {name} | {median:.0f} | {p99(values):.0f} | "
                f"{median - base:+.0f} | {median / base:.3f} |"
            )
        print()
    write_json(
        args.json,
        "interposer_overhead",
        figures,
        samples_ns={
            kind: {name: samples[name][kind] for name in CONFIGS} for kind in ("sync", "async")
        },
        rounds=args.rounds,
        pairs=args.pairs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
