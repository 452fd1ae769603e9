"""The control plane: pods that get shares and what their containers see,
`nri-gpushare status` and `gpushare-smi`, a refused pod, the plugin's
decision log and its metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping

from scripts.demo.enforce import say
from tests.integration.plugin import PluginProcess
from tests.testbed.cri import CriClient, GRPCError


async def shares(cri: CriClient) -> None:
    """Two pods asking for shares: what their containers see, and a
    sleeping container of each that keeps its share."""
    for name, asked in (
        ("trainer", {"gpushare.io/gpu-memory": "6Gi", "gpushare.io/gpu-core": "30"}),
        ("notebook", {"gpushare.io/gpu-memory": "4Gi"}),
    ):
        say(
            f"pod {name} with annotations {asked}; its container runs `env` "
            "(and loads libgpushare.so through its /etc/ld.so.preload)"
        )
        run = await cri.run_container_env(name=name, pod_annotations=asked)
        for line in run.lines:
            if line.startswith(("GPUSHARE_", "NVIDIA_")):
                print("   ", line)
        pod_id = await cri.run_pod(f"{name}-sleeper", annotations=asked)
        cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"])
        await cri.start(cid)


def status(plugin: PluginProcess) -> None:
    say("nri-gpushare status")
    cmd = [sys.executable, "-m", "nri_gpushare.cli.main", "status"]
    subprocess.run([*cmd, "--status-socket", plugin.status_socket], check=True)


def smi(plugin: PluginProcess, env: Mapping[str, str]) -> None:
    say("gpushare-smi")
    cmd = [sys.executable, "-m", "nri_gpushare.cli.smi", "--status-socket", plugin.status_socket]
    subprocess.run(cmd, check=True, env={**os.environ, **env})


async def refusal(cri: CriClient, plugin: PluginProcess) -> None:
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


def metrics(address: str) -> None:
    say(f"Prometheus metrics (metrics.listen): curl http://{address}/metrics, a few")
    with urllib.request.urlopen(f"http://{address}/metrics") as reply:
        shown = ("gpushare_gpu_memory_", "gpushare_container_memory_quota", "gpushare_refusals")
        for line in reply.read().decode().splitlines():
            if line.startswith(shown) and not line.endswith(" 0.0"):
                print("   ", line)
