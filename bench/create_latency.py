"""CRI CreateContainer latency with the gpushare plugin connected vs without.

Starts a private containerd 1.7.24 (the test bed), creates N containers with a
GPU share request in one pod and measures each CreateContainer call, first
with no NRI plugin, then with `nri-gpushare run` connected.  Each container is removed
right after it is created (its share is released), so the node never fills.
Prints p50/p99 of both, the difference, and the plugin's own handling time
from its status socket.

    .venv/bin/python bench/create_latency.py [--containers 200]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.plugin import PluginProcess  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402

REQUEST = {"gpushare.io/gpu-memory": "1Gi", "gpushare.io/gpu-core": "10"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def create_batch(client, pod_id: str, count: int, tag: str) -> list[float]:
    timings = []
    for i in range(count):
        started = time.perf_counter()
        cid = await client.create_container(pod_id, f"{tag}-{i}", command=["true"])
        timings.append(time.perf_counter() - started)
        await client.remove(cid)
    return timings


async def main(containers: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    bed = Containerd().start()
    plugin = PluginProcess(bed.nri_socket, workdir, log_level="warning")
    try:
        async with bed.cri_client() as client:
            pod_id = await client.run_pod("bench", annotations=REQUEST)
            await create_batch(client, pod_id, 10, "warm")  # warm caches
            baseline = await create_batch(client, pod_id, containers, "base")
            plugin.start()
            with_plugin = await create_batch(client, pod_id, containers, "nri")
            handler = plugin.status()["nri"]["handler_ms"]["CreateContainer"]
            assert handler["count"] == containers, f"plugin saw {handler['count']} creates"
    finally:
        if plugin.proc is not None:
            plugin.stop()
        bed.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def ms(value: float) -> str:
        return f"{value * 1000:7.2f} ms"

    base50, base99 = percentile(baseline, 0.5), percentile(baseline, 0.99)
    nri50, nri99 = percentile(with_plugin, 0.5), percentile(with_plugin, 0.99)
    print(f"CRI CreateContainer, {len(baseline)} containers each (share request {REQUEST})")
    print(f"{'':14} {'p50':>10} {'p99':>10} {'mean':>10}")
    print(f"{'no plugin':14} {ms(base50)} {ms(base99)} {ms(statistics.mean(baseline))}")
    print(f"{'gpushare':14} {ms(nri50)} {ms(nri99)} {ms(statistics.mean(with_plugin))}")
    print(f"{'added':14} {ms(nri50 - base50)} {ms(nri99 - base99)}")
    print(f"ratio p50 {nri50 / base50:.3f}  p99 {nri99 / base99:.3f}")
    print(
        f"plugin's own CreateContainer handling: p50 {handler['p50']:.3f} ms, "
        f"p99 {handler['p99']:.3f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.containers))
