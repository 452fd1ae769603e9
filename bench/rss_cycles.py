"""The gpushare plugin's resident memory idle and over many create/remove cycles.

Runs the real plugin process (`nri-gpushare run`, simulated GPUs, no kernel
module) connected to bench/nri_runtime.py's NRI runtime in containerd's
role, over the real protocol.  After registration, Configure and an empty
Synchronize it measures the idle RSS (VmRSS of /proc/<pid>/status, sampled
over --idle seconds), then runs --cycles container lifecycles as containerd
1.7 sends them: CreateContainer with a share request (a real request from
tests/unit/data with gpushare.io/gpu-memory=1Gi, gpu-core=10 and a fresh
container ID), StopContainer (when the plugin subscribed to it), and the
RemoveContainer event.  RSS is sampled every --every cycles.  The growth is
the slope of a least-squares line through the samples after the warm-up,
in KiB per cycle.  The warm-up (--warmup, half the cycles by default) must
cover what the plugin keeps bounded but fills as it works: the stub keeps
the last 4,096 handler timings of each method (CreateContainer,
StopContainer, StateChange: ~0.1 KiB per cycle until cycle 4,096), besides
caches and the allocator's arenas; growth after that does not stop by
itself.  At the end the plugin must hold no allocation.

    .venv/bin/python bench/rss_cycles.py [--cycles 10000] [--every 100] [--warmup 5000]
        [--idle 2] [--json PATH]

--json PATH also writes the benchmark convention's object (bench/report_common.py):
  figures: idle_rss_kib, start_rss_kib (after warm-up), end_rss_kib,
    max_rss_kib, growth_kib (end minus after warm-up), kib_per_cycle (the
    fit's slope after warm-up), kib_per_cycle_all (the fit over every
    sample, warm-up included), cycles, create p50_ms / create p99_ms
    (round trip of CreateContainer), wall_s;
  samples: [[cycle, rss_kib], ...] from cycle 0 (before the first create);
  idle_samples_kib: [rss_kib, ...] while idle; warmup, every: the run's settings.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nri_runtime import NriRuntime  # noqa: E402
from report_common import percentile, write_json  # noqa: E402

from nri_gpushare.nri.api import nri  # noqa: E402
from tests.integration.plugin import PluginProcess  # noqa: E402

SAMPLE = ROOT / "tests" / "unit" / "data" / "create_container_request.bin"
REQUEST = {"gpushare.io/gpu-memory": "1Gi", "gpushare.io/gpu-core": "10"}


def rss_kib(pid: int) -> int:
    """VmRSS of process `pid` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of rss over cycle (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    return statistics.linear_regression(xs, ys).slope


async def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="gs-rss-"))
    runtime = NriRuntime(str(work / "nri.sock"))
    await runtime.start()
    library = work / "libgpushare.so"  # the plugin only checks and mounts it
    library.write_bytes(b"\x7fELF stand-in")
    library.chmod(0o644)
    plugin = PluginProcess(
        work / "nri.sock",
        work / "plugin",
        log_level="warning",
        interposer={"library": str(library)},
    )
    sample = nri.CreateContainerRequest().parse(SAMPLE.read_bytes())
    sample.pod.annotations.update(REQUEST)
    pod = bytes(sample.pod)
    try:
        plugin.start(wait=False)
        assert plugin.proc is not None
        pid = plugin.proc.pid
        conn = await runtime.wait_plugin()
        events = await conn.configure()
        await conn.synchronize([], [])
        stop_subscribed = bool(events & (1 << (nri.Event.STOP_CONTAINER - 1)))
        idle: list[int] = []
        for _ in range(max(1, int(args.idle * 10))):
            idle.append(rss_kib(pid))
            await asyncio.sleep(0.1)
        samples: list[tuple[int, int]] = [(0, rss_kib(pid))]
        creates: list[float] = []
        started = time.perf_counter()
        for i in range(1, args.cycles + 1):
            sample.container.id = f"{i:064x}"
            container = bytes(sample.container)
            reply, seconds = await conn.create_container(pod, container)
            creates.append(seconds)
            adjust = nri.CreateContainerResponse().parse(reply).adjust
            if not (adjust.env or adjust.devices):  # the share was not placed
                raise RuntimeError(f"cycle {i}: CreateContainer placed no share: {adjust}")
            if stop_subscribed:
                await conn.stop_container(pod, container)
            await conn.remove_container(pod, container)
            if i % args.every == 0 or i == args.cycles:
                samples.append((i, rss_kib(pid)))
        wall = time.perf_counter() - started
        left = plugin.status()["allocations"]
        if left:
            print(f"rss_cycles: {len(left)} allocations left after the cycles", file=sys.stderr)
            return 1
    except Exception:
        traceback.print_exc()
        print(f"rss_cycles: the plugin's log ends:\n{plugin.log()[-1500:]}", file=sys.stderr)
        return 1
    finally:
        if plugin.proc is not None:
            plugin.stop()
        await runtime.close()
        shutil.rmtree(work, ignore_errors=True)

    after = [(c, r) for c, r in samples if c >= args.warmup] or samples[-2:]
    per_cycle = slope(after)
    idle_kib = statistics.median(idle)
    figures: dict[str, float] = {
        "idle_rss_kib": idle_kib,
        "start_rss_kib": after[0][1],
        "end_rss_kib": samples[-1][1],
        "max_rss_kib": max(r for _, r in samples),
        "growth_kib": samples[-1][1] - after[0][1],
        "kib_per_cycle": per_cycle,
        "kib_per_cycle_all": slope(samples),
        "cycles": args.cycles,
        "create p50_ms": percentile(creates, 0.5) * 1000,
        "create p99_ms": percentile(creates, 0.99) * 1000,
        "wall_s": wall,
    }
    print(f"plugin RSS over {args.cycles} create/remove cycles (pid {pid})")
    print(f"  idle:                   {idle_kib / 1024:8.1f} MiB")
    print(f"  after {after[0][0]:6} cycles:     {after[0][1] / 1024:8.1f} MiB")
    print(f"  after {samples[-1][0]:6} cycles:     {samples[-1][1] / 1024:8.1f} MiB")
    print(f"  growth after warm-up:   {per_cycle:8.3f} KiB/cycle (least squares)")
    print(
        f"  CreateContainer round trip: p50 {figures['create p50_ms']:.3f} ms, "
        f"p99 {figures['create p99_ms']:.3f} ms; {wall:.1f} s in all"
    )
    write_json(
        args.json,
        "rss_cycles",
        figures,
        samples=[list(s) for s in samples],
        idle_samples_kib=idle,
        warmup=args.warmup,
        every=args.every,
        stop_container=stop_subscribed,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10000, help="create/remove cycles (10000)")
    ap.add_argument("--every", type=int, default=100, help="sample RSS every N cycles (100)")
    ap.add_argument("--warmup", type=int, help="cycles left out of the fit (half of them)")
    ap.add_argument("--idle", type=float, default=2.0, help="seconds of idle sampling (2)")
    ap.add_argument("--json", type=Path, help="also write the figures and samples here")
    args = ap.parse_args()
    if args.cycles < 1 or args.every < 1:
        ap.error("--cycles and --every must be positive")
    if args.warmup is None:
        args.warmup = args.cycles // 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
