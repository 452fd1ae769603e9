"""The plugin's own CreateContainer handling, in process: no containerd, no
socket.  Feeds a real CreateContainerRequest (tests/unit/data, a fresh
container ID each time) through the stub's request handler (decode, the
plugin's handler, encode: what the daemon's status reports as handler time
and `bench/create_latency.py` as "own CreateContainer handling") into three
plugins, measured the same way, rotating request by request:

- null: bench/null_plugin.py's plugin (subscribes, changes nothing);
- gpushare: the daemon's handler (kmod: off, 2 simulated GPUs; logging as
  the daemon's, text at info, into a file) on a request
  asking for a share (gpushare.io/gpu-memory=1Gi, gpu-core=10), the
  container removed after each (not timed);
- gpushare-plain: the same handler on the request without a share (most
  containers of a node).

Prints p50/p99 of each; `--profile` prints where gpushare's time goes.

    .venv/bin/python bench/handler_latency.py [--requests 3000] [--profile [tottime]] [--json PATH]

--json PATH writes the benchmark convention's object (bench/report_common.py):
  figures: "<arm> p50_us", "<arm> p99_us" for arm null, gpushare, gpushare-plain,
    and "own p50_us" (gpushare's p50 minus null's: the share logic's own cost);
  samples_us: {arm: [microseconds, ...]} in the order taken.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from null_plugin import NullPlugin  # noqa: E402
from report_common import percentile, write_json  # noqa: E402

from nri_gpushare.config import load_config  # noqa: E402
from nri_gpushare.daemon.main import build_service  # noqa: E402
from nri_gpushare.daemon.nri_handler import GpuShareHandler  # noqa: E402
from nri_gpushare.nri.api import lite, nri  # noqa: E402
from nri_gpushare.nri.stub import Stub  # noqa: E402
from nri_gpushare.share.decisions import configure_logging  # noqa: E402

SAMPLE = ROOT / "tests" / "unit" / "data" / "create_container_request.bin"
CONFIG = """
inventory:
  - {index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, memory: 16Gi}
  - {index: 1, uuid: GPU-11111111-0000-0000-0000-000000000000, memory: 16Gi}
kmod: "off"
"""
SERVICE = "nri.pkg.api.v1alpha1.Plugin"
WARMUP = 200


def requests(n: int, share: bool) -> list[bytes]:
    sample = SAMPLE.read_bytes()
    out = []
    for i in range(n):
        request = nri.CreateContainerRequest().parse(sample)
        for mapping in (request.pod.annotations, request.container.annotations):
            for key in [k for k in mapping if k.startswith("gpushare.io/")]:
                del mapping[key]  # the sample's own request
        if share:
            request.pod.annotations["gpushare.io/gpu-memory"] = "1Gi"
            request.pod.annotations["gpushare.io/gpu-core"] = "10"
        request.container.id = f"{i:064x}"
        out.append(bytes(request))
    return out


ARMS = ("null", "gpushare", "gpushare-plain")


async def run(n: int, profile: str | None, idle: float = 0.0) -> dict[str, list[float]]:
    """Seconds per request of each arm, after WARMUP requests of each; with
    `idle` seconds of sleep before each request (a plugin between a node's
    container starts: its caches gone cold)."""
    state_dir = tempfile.mkdtemp(prefix="gs-bench-state-")  # records: like a node's, not on it
    # The node's interposer library: the plugin only checks and mounts it.
    library = Path(state_dir) / "libgpushare.so"
    library.write_bytes(b"\x7fELF stand-in")
    library.chmod(0o644)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(CONFIG + f"state_dir: {state_dir}\ninterposer: {{library: {library}}}\n")
        f.flush()
        config = load_config(f.name)
    # Logging as the daemon's (text, info: every decision is a line), into a file.
    log_file = open(Path(state_dir) / "plugin.log", "w")  # noqa: SIM115 - closed below
    configure_logging("info", "text")
    log_handler = logging.getLogger().handlers[0]
    assert isinstance(log_handler, logging.StreamHandler)
    log_handler.setStream(log_file)
    handler = GpuShareHandler(await build_service(config, None))
    stubs = {
        "null": Stub(NullPlugin(), name="null", index="10", socket_path="/nonexistent"),
        "gpushare": Stub(handler, name="bench", index="50", socket_path="/nonexistent"),
        "gpushare-plain": Stub(handler, name="bench", index="50", socket_path="/nonexistent"),
    }
    asking, plain = requests(n + WARMUP, True), requests(n + WARMUP, False)
    payloads = {"null": plain, "gpushare": asking, "gpushare-plain": plain}
    profiler = cProfile.Profile()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i in range(n + WARMUP):
        for arm in ARMS:  # rotating: the machine's load falls on every arm alike
            raw = payloads[arm][i]
            mine = profile is not None and i >= WARMUP and arm == "gpushare"
            if idle:
                time.sleep(idle)  # blocking: nothing else of ours runs meanwhile
            if mine:
                profiler.enable()
            started = time.perf_counter()
            await stubs[arm].service.handle(SERVICE, "CreateContainer", raw)
            elapsed = time.perf_counter() - started
            if mine:
                profiler.disable()
            if i >= WARMUP:
                times[arm].append(elapsed)
            if arm == "gpushare":
                request = lite.decode_create_container_request(raw)
                await handler.remove_container(request.pod, request.container)
    # What was measured is what the figures say: every request with a share
    # placed (and released), none of the plain ones (no share asked).
    counts = handler.service.decisions.counts
    if counts["placed"] != n + WARMUP or counts["released"] != n + WARMUP or counts["refused"]:
        raise SystemExit(f"handler_latency: the gpushare arm did not place each share: {counts}")
    logging.getLogger().removeHandler(log_handler)
    log_file.close()
    shutil.rmtree(state_dir, ignore_errors=True)
    if profile is not None:
        pstats.Stats(profiler).sort_stats(profile).print_stats(40)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument(
        "--profile",
        nargs="?",
        const="cumulative",
        help="profile gpushare (sorted: cumulative, tottime)",
    )
    parser.add_argument(
        "--idle-ms",
        type=float,
        default=0.0,
        help="sleep this long before each request (cold caches, as between container starts)",
    )
    parser.add_argument("--json", type=Path, help="also write the benchmark JSON object here")
    args = parser.parse_args()
    times = asyncio.run(run(args.requests, args.profile, args.idle_ms / 1000))
    figures: dict[str, float] = {}
    print(
        "CreateContainer handling in process (stub: decode, handler, encode), "
        f"{args.requests} requests each"
        + (f", {args.idle_ms:g} ms idle before each:" if args.idle_ms else ":")
    )
    for arm in ARMS:
        ordered = sorted(times[arm])
        p50 = statistics.median(ordered) * 1e6
        p99 = percentile(ordered, 0.99) * 1e6
        figures[f"{arm} p50_us"], figures[f"{arm} p99_us"] = p50, p99
        print(f"  {arm:15} p50 {p50:6.0f} us, p99 {p99:6.0f} us")
    figures["own p50_us"] = figures["gpushare p50_us"] - figures["null p50_us"]
    print(f"  gpushare's share logic over the null plugin: p50 {figures['own p50_us']:.0f} us")
    write_json(
        args.json,
        "handler_latency",
        figures,
        samples_us={arm: [t * 1e6 for t in times[arm]] for arm in ARMS},
    )


if __name__ == "__main__":
    main()
