"""What gpushare-runc adds to a container's start: `ctr run --rm` of a
container that runs `true`, through plain runc and through gpushare-runc,
rotating between the arms in one run on one private containerd (the test
bed) with the daemon running, so that load on the machine hits all alike.

Arms:
- runc: the shim runs runc itself (the baseline);
- wrapper, no share: gpushare-runc passes through (create asks nothing:
  the container asks for no share, so it execs runc after reading
  config.json; every other subcommand is a plain exec);
- wrapper, share: the container asks `gpushare.io/gpu-memory=1Gi`: the
  daemon places, registers and the wrapper edits config.json, runs runc
  create as a child, binds; at delete it releases.
- lean wrapper, share: the same, the wrapper's Python started with `-S`
  and the source tree on its path.  The project's venv holds an editable
  install (`pip install -e`), whose import finder, run at every Python
  start by site, costs ~16 ms here, four times per container (create,
  start, delete twice); a regular install has no such finder, so this arm
  is closer to what a node pays.

Prints count, p50 and p99 of each arm's wall time, the difference of each
to the baseline's p50, and the ratio.

    .venv/bin/python bench/container_start.py [--runs 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.plugin import PluginProcess, gpu_inventory  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402
from tests.testbed.images import BUSYBOX_IMAGE, build_images  # noqa: E402

WARMUP = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="containers per arm")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gs-start-"))
    with Containerd() as bed:
        plugin = PluginProcess(
            bed.nri_socket, work / "plugin", inventory=gpu_inventory(1, "16Gi")
        ).start()
        try:
            wrapper = plugin.runc_wrapper()
            lean = work / "gpushare-runc-lean"
            lean.write_text(
                f"#!/bin/sh\nGPUSHARE_API_SOCKET={plugin.api_socket} PYTHONPATH={ROOT} "
                f'exec {sys.executable} -S -m nri_gpushare.runc_wrapper "$@"\n'
            )
            lean.chmod(0o755)
            runc = shutil.which("runc") or "/usr/sbin/runc"
            ctr = [str(bed.ctr), "-a", str(bed.grpc_address), "-n", "default"]
            subprocess.run([*ctr, "images", "import", str(build_images())], check=True,
                           capture_output=True)  # fmt: skip
            arms = {
                "runc": [runc, []],
                "wrapper, no share": [str(wrapper), []],
                "wrapper, share": [str(wrapper), ["--label", "gpushare.io/gpu-memory=1Gi"]],
                "lean wrapper, share": [str(lean), ["--label", "gpushare.io/gpu-memory=1Gi"]],
            }
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for i in range(WARMUP + args.runs):
                for arm, (binary, flags) in arms.items():
                    argv = [
                        *ctr, "run", "--rm", "--runc-binary", binary,
                        "--runc-root", str(bed.runc_root), *flags,
                        BUSYBOX_IMAGE, f"start-{i}-{list(arms).index(arm)}", "true",
                    ]  # fmt: skip
                    started = time.perf_counter()
                    subprocess.run(argv, check=True, capture_output=True)
                    if i >= WARMUP:
                        times[arm].append(time.perf_counter() - started)
            left = plugin.status()["allocations"]
            if left:
                raise SystemExit(f"allocations left after the run: {left}")
        finally:
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["runc"])
    print(f"ctr run --rm (true), {args.runs} containers per arm, rotating; milliseconds")
    print(f"{'arm':20} {'n':>4} {'p50':>8} {'p99':>8} {'+p50':>8} {'ratio':>6}")
    for arm, values in times.items():
        p50 = statistics.median(values)
        print(
            f"{arm:20} {len(values):4d} {p50 * 1e3:8.1f} {percentile(values, 0.99) * 1e3:8.1f} "
            f"{(p50 - base) * 1e3:+8.1f} {p50 / base:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
