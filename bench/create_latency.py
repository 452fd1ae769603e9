"""CRI CreateContainer latency with the gpushare plugin connected vs without.

Starts three private containerd 1.7.24 instances (the test bed), all with NRI
enabled: one with no plugin (the baseline), one with a plugin that does
nothing (bench/null_plugin.py: the cost of any plugin on this stub and
transport, and of containerd's own NRI work), one with `nri-gpushare run`.
It creates N containers with a GPU share request in each, rotating between
the three so that load on the machine hits all alike.  Each container is removed
right after it is created (its share is released), so the node never fills.
Prints p50/p99 of each, the difference to the baseline, and gpushare's own
handling time from its status socket.

    .venv/bin/python bench/create_latency.py [--containers 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.plugin import PluginProcess  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402

REQUEST = {"gpushare.io/gpu-memory": "1Gi", "gpushare.io/gpu-core": "10"}
ARMS = ["no plugin", "null plugin", "gpushare"]
WARMUP = 10


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_create(client, pod_id: str, name: str) -> float:
    started = time.perf_counter()
    cid = await client.create_container(pod_id, name, command=["true"])
    elapsed = time.perf_counter() - started
    await client.remove(cid)
    return elapsed


async def wait_registered(bed: Containerd, name: str) -> None:
    marker = f'registered as \\"10-{name}\\"'
    deadline = time.monotonic() + 15
    while marker not in bed.log_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"plugin {name} did not register:\n{bed.log_tail(20)}")
        await asyncio.sleep(0.05)


async def main(containers: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    beds = {arm: Containerd().start() for arm in ARMS}  # all with NRI enabled
    # The node's interposer library: the plugin checks it and mounts it (the
    # benchmark's busybox containers are static, so its content does not matter).
    library = workdir / "libgpushare.so"
    library.write_bytes(b"\x7fELF stand-in")
    library.chmod(0o644)
    plugin = PluginProcess(
        beds["gpushare"].nri_socket,
        workdir,
        log_level="warning",
        interposer={"library": str(library)},
    )
    null = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("null_plugin.py")),
            str(beds["null plugin"].nri_socket),
        ]
    )
    timings: dict[str, list[float]] = {arm: [] for arm in ARMS}
    try:
        plugin.start()
        await wait_registered(beds["null plugin"], "null")
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                arm: await stack.enter_async_context(bed.cri_client()) for arm, bed in beds.items()
            }
            pods = {
                arm: await client.run_pod("bench", annotations=REQUEST)
                for arm, client in clients.items()
            }
            for i in range(containers + WARMUP):
                # Rotate which arm goes first so none gets a systematic edge.
                order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]
                for arm in order:
                    elapsed = await timed_create(clients[arm], pods[arm], f"c{i}")
                    if i >= WARMUP:
                        timings[arm].append(elapsed)
        handler = plugin.status()["nri"]["handler_ms"]["CreateContainer"]
        total = containers + WARMUP
        assert handler["count"] == total, f"plugin saw {handler['count']} creates"
        assert plugin.status()["allocations"] == [], "removed containers kept shares"
    finally:
        plugin.stop()
        null.terminate()
        null.wait()
        for bed in beds.values():
            bed.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def ms(value: float) -> str:
        return f"{value * 1000:7.2f} ms"

    base50 = percentile(timings["no plugin"], 0.5)
    base99 = percentile(timings["no plugin"], 0.99)
    print(f"CRI CreateContainer, {containers} containers per arm, request {REQUEST}")
    print(f"{'':12} {'p50':>10} {'p99':>10} {'mean':>10} {'+p50':>10} {'+p99':>10}")
    for arm, values in timings.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        print(
            f"{arm:12} {ms(p50)} {ms(p99)} {ms(statistics.mean(values))} "
            f"{ms(p50 - base50)} {ms(p99 - base99)}"
        )
    print(
        f"gpushare's own CreateContainer handling: p50 {handler['p50']:.3f} ms, "
        f"p99 {handler['p99']:.3f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.containers))
