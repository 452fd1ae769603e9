"""What gpushare-runc adds to a container's start: `ctr run --rm` of a
container that runs `true`, through plain runc and through gpushare-runc,
rotating between the arms in one run on one private containerd (the test
bed) with the daemon running, so that load on the machine hits all alike.

gpushare-runc is the compiled front (front/, `.venv/bin/gpushare-front`,
what scripts/install-node.sh installs as gpushare-runc), run by the shim as
it is (the daemon's socket in containerd's environment).  Arms:
- runc: the shim runs runc itself (the baseline);
- wrapper, no share: create sends runc-create (the daemon reads config.json:
  the container asks for no share) and execs runc; every other subcommand
  is a plain exec;
- wrapper, share: the container asks `gpushare.io/gpu-memory=1Gi`: the
  daemon places, registers and edits config.json, the front runs runc
  create as a child and binds (start); at delete it releases;
- python wrapper, share: the same through the Python wrapper alone (the
  reference the front hands odd cases to), for comparison.

and, through a private dockerd (Debian trixie's 26.1) on the same containerd
(unless --no-docker), `docker run --rm --network none` of the same container:
- docker, runc: the baseline of the docker arms;
- docker, CDI hooks: `--device gpushare.io/gpu=0` from the spec
  `nri-gpushare cdi generate` writes with the front as the hook program, with
  a 1Gi share (isolation none, as the CDI path without the kernel module
  allows): its createRuntime hook asks the daemon to place and register,
  its poststop hook releases.

Prints count, p50 and p99 of each arm's wall time, the difference of each
to its baseline's p50 (runc for the ctr arms, docker runc for the docker
arms), and the ratio.

    .venv/bin/python bench/container_start.py [--runs 40] [--no-docker] [--json PATH]

--json PATH also writes the benchmark convention's object (bench/report_common.py):
  figures: "<arm> p50_ms", "<arm> p99_ms", "<arm> added_p50_ms" for each arm;
  samples_ms: {arm: [each start's wall time in ms]}; baselines: {arm: its baseline arm};
  runs: containers per arm.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

from report_common import write_json  # noqa: E402

from tests.integration.plugin import PluginProcess, gpu_inventory  # noqa: E402
from tests.testbed.containerd import Containerd  # noqa: E402
from tests.testbed.docker import Dockerd  # noqa: E402
from tests.testbed.images import BUSYBOX_IMAGE, build_images  # noqa: E402

WARMUP = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cdi_spec(plugin: PluginProcess, directory: Path) -> None:
    """The node's CDI spec for `plugin`, as `nri-gpushare cdi generate` writes it."""
    directory.mkdir()
    nri_gpushare = str(ROOT / ".venv" / "bin" / "nri-gpushare")
    front = str(ROOT / ".venv" / "bin" / "gpushare-front")
    subprocess.run(
        [nri_gpushare, "cdi", "generate", "--config", str(plugin.config_path),
         "--output", str(directory / "gpushare.io-gpu.json"), "--hook-path", front],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="containers per arm")
    parser.add_argument("--no-docker", action="store_true", help="leave the docker arms out")
    parser.add_argument("--json", type=Path, help="also write the figures and samples here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gs-start-"))
    docker: Dockerd | None = None
    # The plugin's socket reaches gpushare-runc as on a node, through the
    # environment containerd gives its shims (the tests' runc_wrapper() is a
    # shell script setting it, one more program start per runc call).
    os.environ["GPUSHARE_API_SOCKET"] = str(work / "plugin" / "api.sock")
    with Containerd() as bed:
        plugin = PluginProcess(
            bed.nri_socket, work / "plugin", inventory=gpu_inventory(1, "16Gi")
        ).start()
        assert plugin.api_socket == os.environ["GPUSHARE_API_SOCKET"]
        try:
            wrapper = ROOT / ".venv" / "bin" / "gpushare-front"
            python_wrapper = ROOT / ".venv" / "bin" / "gpushare-runc"
            runc = shutil.which("runc") or "/usr/sbin/runc"
            ctr = [str(bed.ctr), "-a", str(bed.grpc_address), "-n", "default"]
            subprocess.run([*ctr, "images", "import", str(build_images())], check=True,
                           capture_output=True)  # fmt: skip

            def ctr_run(binary: str, flags: list[str]) -> Callable[[str], list[str]]:
                return lambda name: [
                    *ctr, "run", "--rm", "--runc-binary", binary,
                    "--runc-root", str(bed.runc_root), *flags, BUSYBOX_IMAGE, name, "true",
                ]  # fmt: skip

            share = ["--label", "gpushare.io/gpu-memory=1Gi"]
            arms: dict[str, Callable[[str], list[str]]] = {
                "runc": ctr_run(runc, []),
                "wrapper, no share": ctr_run(str(wrapper), []),
                "wrapper, share": ctr_run(str(wrapper), share),
                "python wrapper, share": ctr_run(str(python_wrapper), share),
            }
            baselines = dict.fromkeys(arms, "runc")
            if not args.no_docker:
                cdi_spec(plugin, work / "cdi")
                docker = Dockerd(bed, cdi_spec_dirs=[work / "cdi"]).start()
                run = [
                    str(docker.docker_bin), "-H", docker.host, "run", "--rm",
                    "--network", "none",
                ]  # fmt: skip
                device = [
                    "--device", "gpushare.io/gpu=0",
                    "--annotation", "gpushare.io/gpu-memory=1Gi",
                    "--annotation", "gpushare.io/isolation=none",
                ]  # fmt: skip
                arms["docker, runc"] = lambda name: [*run, BUSYBOX_IMAGE, "true"]
                arms["docker, CDI hooks"] = lambda name: [*run, *device, BUSYBOX_IMAGE, "true"]
                baselines["docker, runc"] = baselines["docker, CDI hooks"] = "docker, runc"
            env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
            if docker is not None:
                env["DOCKER_CONFIG"] = str(docker.cli_config)
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            numbered = list(enumerate(arms.items()))
            for i in range(WARMUP + args.runs):
                # Rotate which arm goes first so none gets a systematic edge.
                k = i % len(numbered)
                for n, (arm, argv) in numbered[k:] + numbered[:k]:
                    started = time.perf_counter()
                    done = subprocess.run(argv(f"start-{i}-{n}"), capture_output=True, env=env)
                    if done.returncode != 0:
                        raise SystemExit(f"{arm}: exit {done.returncode}: {done.stderr!r}")
                    if i >= WARMUP:
                        times[arm].append(time.perf_counter() - started)
            left = plugin.status()["allocations"]
            if left:
                raise SystemExit(f"allocations left after the run: {left}")
            # Each start of an arm with a share placed one (none failed open).
            asking = [a for a in arms if a.endswith(", share") or "CDI" in a]
            placed = plugin.log().count("decision=placed ")
            if placed != len(asking) * (WARMUP + args.runs):
                raise SystemExit(
                    f"{placed} shares placed for {WARMUP + args.runs} starts of {asking}"
                )
        finally:
            if docker is not None:
                docker.stop()
            plugin.stop()
    shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, float] = {}
    print(f"container start (true), {args.runs} containers per arm, rotating; milliseconds")
    print(f"{'arm':22} {'n':>4} {'p50':>8} {'p99':>8} {'+p50':>8} {'ratio':>6}")
    for arm, values in times.items():
        p50 = statistics.median(values)
        base = statistics.median(times[baselines[arm]])
        p99 = percentile(values, 0.99)
        print(
            f"{arm:22} {len(values):4d} {p50 * 1e3:8.1f} {p99 * 1e3:8.1f} "
            f"{(p50 - base) * 1e3:+8.1f} {p50 / base:6.2f}"
        )
        figures |= {
            f"{arm} p50_ms": p50 * 1e3,
            f"{arm} p99_ms": p99 * 1e3,
            f"{arm} added_p50_ms": (p50 - base) * 1e3,
        }
    write_json(
        args.json,
        "container_start",
        figures,
        samples_ms={arm: [v * 1e3 for v in values] for arm, values in times.items()},
        baselines=baselines,
        runs=args.runs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
