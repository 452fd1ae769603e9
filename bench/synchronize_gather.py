"""Synchronize's reading in process: where the plugin's CPU goes on
bench/synchronize.py's node, without the socket, the runtime or the domain.

For one size it splits the node into requests as bench/synchronize.py's
runtime does (--per containers and a fifth as many pods each), then times,
median of --repeat, CPU seconds: decoding the requests into views, the
native scanner alone, the heads built from its rows, and SyncState's whole
gathering (the garbage collector paused during each request, as the
stub pauses it), with the native scanner and with the Python reader.

    .venv/bin/python bench/synchronize_gather.py [--size 4000/20000]
        [--per 500] [--repeat 5] [--profile]

--profile prints cProfile's top functions of one native gathering.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nri_runtime import synchronize_payload  # noqa: E402
from synchronize import node, sizes  # noqa: E402

from nri_gpushare.daemon.sync_gather import SyncState  # noqa: E402
from nri_gpushare.nri.api import lite, sync_scan  # noqa: E402
from nri_gpushare.nri.stub.gc_pause import collection_paused  # noqa: E402
from nri_gpushare.nri.wire import native  # noqa: E402
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS  # noqa: E402


def cpu(work: Callable[[], object], repeat: int) -> float:
    """The median CPU seconds of `work`."""
    spent = []
    for _ in range(repeat):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return sorted(spent)[repeat // 2]


def use_native(on: bool) -> None:
    os.environ[native.ENV] = "1" if on else "0"
    native.library.cache_clear()
    sync_scan._scanner.cache_clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4000/20000")
    parser.add_argument("--per", type=int, default=500, help="containers per request")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    [(pods, containers)] = sizes(args.size)
    the_node = node(pods, containers, 20)
    per, pods_per = args.per, max(1, args.per * pods // containers)
    count = -(-containers // per)
    requests = [
        synchronize_payload(
            the_node.pods[k * pods_per : (k + 1) * pods_per]
            if k < count - 1
            else the_node.pods[k * pods_per :],
            the_node.containers[k * per : (k + 1) * per],
            k < count - 1,
        )
        for k in range(count)
    ]
    views = [lite.decode_synchronize_request(r) for r in requests]

    def gather() -> None:
        state = SyncState()
        for payload in requests:
            with collection_paused():  # as the stub reads each request
                request = lite.decode_synchronize_request(payload)
                state.gather(request.pods, request.containers)
        assert len(state.finish()) == containers

    use_native(True)
    scanner = sync_scan._scanner("container", COARSE_MARKERS, RAW_MARKERS)
    if scanner is None:
        raise SystemExit(f"{native.PATH} does not load: make -C {native.PATH.parent}")
    spans = []
    for v in views:
        s = array("q")
        for c in v.containers:
            s.extend((c.start, c.end))
        spans.append(s)
    print(f"{pods} pods / {containers} containers in {count} requests, CPU s (median):")
    stages: list[tuple[str, Callable[[], object]]] = [
        ("decode into views", lambda: [lite.decode_synchronize_request(r) for r in requests]),
        (
            "native scan alone",
            lambda: [scanner.scan(r, s) for r, s in zip(requests, spans, strict=True)],
        ),
        (
            "container heads (scan incl.)",
            lambda: [
                sync_scan.scan_containers(v.containers, COARSE_MARKERS, RAW_MARKERS) for v in views
            ],
        ),
        (
            "pod heads (scan incl.)",
            lambda: [sync_scan.scan_pods(v.pods, COARSE_MARKERS, RAW_MARKERS) for v in views],
        ),
        ("decode + gather, native", gather),
    ]
    for name, work in stages:
        print(f"  {name:30} {cpu(work, args.repeat):.3f}")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(gather)
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    use_native(False)
    print(f"  {'decode + gather, Python':30} {cpu(gather, args.repeat):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
