"""The plugin's own CreateContainer handling, in process: no containerd, no
socket.  Feeds a real CreateContainerRequest (tests/unit/data, with a share
request added and a fresh container ID each time) through the stub's request
handler into the gpushare daemon's handler (kmod: off, 2 simulated GPUs),
removes the container after each, and prints p50/p99 of the handling.  A
quick, repeatable view of what `bench/create_latency.py` reports as
"gpushare's own CreateContainer handling"; `--profile` prints where it goes.

    .venv/bin/python bench/handler_latency.py [--requests 3000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nri_gpushare import daemon  # noqa: E402
from nri_gpushare.api import lite, nri  # noqa: E402
from nri_gpushare.config import load_config  # noqa: E402
from nri_gpushare.stub import Stub  # noqa: E402

SAMPLE = ROOT / "tests" / "unit" / "data" / "create_container_request.bin"
CONFIG = """
inventory:
  - {index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, memory: 16Gi}
  - {index: 1, uuid: GPU-11111111-0000-0000-0000-000000000000, memory: 16Gi}
kmod: "off"
"""
SERVICE = "nri.pkg.api.v1alpha1.Plugin"
WARMUP = 200


def requests(n: int) -> list[bytes]:
    sample = SAMPLE.read_bytes()
    out = []
    for i in range(n):
        request = nri.CreateContainerRequest().parse(sample)
        request.pod.annotations["gpushare.io/gpu-memory"] = "1Gi"
        request.pod.annotations["gpushare.io/gpu-core"] = "10"
        request.container.id = f"{i:064x}"
        out.append(bytes(request))
    return out


async def run(n: int, profile: bool) -> list[float]:
    state_dir = tempfile.mkdtemp(prefix="gs-bench-state-")  # records: like a node's, not on it
    # The node's interposer library: the plugin only checks and mounts it.
    library = Path(state_dir) / "libgpushare.so"
    library.write_bytes(b"\x7fELF stand-in")
    library.chmod(0o644)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(CONFIG + f"state_dir: {state_dir}\ninterposer: {{library: {library}}}\n")
        f.flush()
        config = load_config(f.name)
    handler = daemon.GpuShareHandler(await daemon.build_service(config, None))
    stub = Stub(handler, name="bench", index="50", socket_path="/nonexistent")
    profiler = cProfile.Profile()
    times = []
    for i, raw in enumerate(requests(n + WARMUP)):
        if i == WARMUP and profile:
            profiler.enable()
        started = time.perf_counter()
        await stub.service.handle(SERVICE, "CreateContainer", raw)
        if i >= WARMUP:
            times.append(time.perf_counter() - started)
        request = lite.decode_create_container_request(raw)
        await handler.remove_container(request.pod, request.container)
    shutil.rmtree(state_dir, ignore_errors=True)
    if profile:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    times = sorted(asyncio.run(run(args.requests, args.profile)))
    p50 = statistics.median(times) * 1e6
    p99 = times[int(len(times) * 0.99)] * 1e6
    print(
        f"CreateContainer handling in process, {len(times)} requests: "
        f"p50 {p50:.0f} us, p99 {p99:.0f} us"
    )


if __name__ == "__main__":
    main()
