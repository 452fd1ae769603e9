"""The local demo (`make demo`): GPU sharing on a private containerd, no GPU needed.

1. starts a private containerd 1.7.24 with CRI and NRI (nothing on the host's
   own containerd is touched),
2. starts `nri-gpushare run` with an embedded config: a simulated inventory of
   two 16 GiB GPUs,
3. runs two pods asking for GPU shares and prints what their containers see
   (each also gets the CUDA interposer, built here, through /etc/ld.so.preload),
4. shows `nri-gpushare status` and `gpushare-smi`, a refused pod with its
   error and the plugin's decision log line about it, a few of the Prometheus
   metrics it serves, and cleans up.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.plugin import PluginProcess, gpu_inventory  # noqa: E402
from tests.testbed.containerd import Containerd, missing_prerequisites  # noqa: E402
from tests.testbed.cri import GRPCError  # noqa: E402


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


async def demo() -> None:
    missing = missing_prerequisites()
    if missing:
        sys.exit("demo: missing prerequisites: " + "; ".join(missing) + " (run `make prereqs`)")
    workdir = Path(tempfile.mkdtemp(prefix="gs-demo-"))
    say("starting a private containerd 1.7.24 with NRI enabled")
    say("building the CUDA interposer libgpushare.so (make -C libgpushare)")
    build = workdir / "libgpushare"
    subprocess.run(["make", "-s", "-C", str(ROOT / "libgpushare"), f"BUILD={build}"], check=True)
    bed = Containerd().start()
    with socket.socket() as probe:  # a free port for the metrics endpoint
        probe.bind(("127.0.0.1", 0))
        metrics = f"127.0.0.1:{probe.getsockname()[1]}"
    plugin = PluginProcess(
        bed.nri_socket,
        workdir,
        log_level="info",
        inventory=gpu_inventory(2, "16Gi"),
        interposer={"library": str(build / "libgpushare.so")},
        metrics={"listen": metrics},
    )
    try:
        say("starting nri-gpushare on a simulated inventory: 2 x 16Gi GPUs")
        plugin.start()
        async with bed.cri_client() as cri:
            for name, annotations in (
                ("trainer", {"gpushare.io/gpu-memory": "6Gi", "gpushare.io/gpu-core": "30"}),
                ("notebook", {"gpushare.io/gpu-memory": "4Gi"}),
            ):
                say(
                    f"pod {name} with annotations {annotations}; its container runs `env` "
                    "(and loads libgpushare.so through its /etc/ld.so.preload)"
                )
                run = await cri.run_container_env(name=name, pod_annotations=annotations)
                for line in run.lines:
                    if line.startswith(("GPUSHARE_", "NVIDIA_")):
                        print("   ", line)
                pod_id = await cri.run_pod(f"{name}-sleeper", annotations=annotations)
                cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"])
                await cri.start(cid)

            say("nri-gpushare status")
            status_cmd = [
                sys.executable,
                "-m",
                "nri_gpushare.cli.main",
                "status",
                "--status-socket",
                plugin.status_socket,
            ]
            subprocess.run(status_cmd, check=True)

            say("gpushare-smi")
            smi_cmd = [
                sys.executable,
                "-m",
                "nri_gpushare.cli.smi",
                "--status-socket",
                plugin.status_socket,
            ]
            subprocess.run(smi_cmd, check=True)

            say("a pod asking for more than a GPU has: refused at CreateContainer")
            pod_id = await cri.run_pod("too-big", annotations={"gpushare.io/gpu-memory": "20Gi"})
            try:
                await cri.create_container(pod_id, "main", command=["true"])
            except GRPCError as exc:
                print("    CreateContainer failed:", exc.message)
            say("the plugin's decision log (journalctl -u nri-gpushare -g decision= on a node)")
            for line in plugin.log().splitlines():
                if " decision=" in line:
                    print("   ", line)

            say(f"Prometheus metrics (metrics.listen): curl http://{metrics}/metrics, a few")
            with urllib.request.urlopen(f"http://{metrics}/metrics") as reply:
                shown = (
                    "gpushare_gpu_memory_",
                    "gpushare_container_memory_quota",
                    "gpushare_refusals",
                )
                for line in reply.read().decode().splitlines():
                    if line.startswith(shown) and not line.endswith(" 0.0"):
                        print("   ", line)

            say("cleaning up: stopping and removing every pod releases its share")
        subprocess.run(status_cmd, check=True)
    finally:
        plugin.stop()
        bed.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    say("done")


if __name__ == "__main__":
    asyncio.run(demo())
