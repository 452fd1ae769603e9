"""The NRI plugin against a real containerd (1.7.24, or 2.1.9 with
GPUSHARE_CONTAINERD=2) with CRI pods."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import pytest
import yaml

from nri_gpushare.nri.stub import Plugin, Stub
from tests.integration.plugin import ROOT, gpu_inventory
from tests.testbed.containerd import Containerd
from tests.testbed.cri import GRPCError
from tests.testbed.fixtures import require_testbed

UUID0 = gpu_inventory(1, "16Gi")[0]["uuid"]


def env_of(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


async def test_plugin_registers_and_containerd_sees_it(containerd, start_plugin):
    seen = len(containerd.log_text())  # the log is shared with earlier tests
    plugin = start_plugin(containerd)
    status = plugin.status()
    assert status["nri"]["connected"] and status["nri"]["sessions"] == 1
    assert status["nri"]["handler_ms"]["Configure"]["count"] == 1
    log = containerd.log_text()[seen:]
    assert 'registered as \\"10-gpushare\\"' in log, log[-2000:]
    assert 'plugin \\"10-gpushare\\" connected' in log, log[-2000:]


async def test_timeouts_come_from_configure_where_the_runtime_sends_them(
    make_containerd, start_plugin
):
    """NRI 0.8 (containerd 2.x) sends its timeouts in Configure and the plugin
    goes by them; NRI 0.6 (1.7.24) does not, so the plugin keeps its own
    setting.  Either way it subscribes to no event past NRI 0.8's (0x7FF):
    a bit the runtime does not know would fail Configure."""
    bed: Containerd = make_containerd(plugin_request_timeout="3s")
    plugin = start_plugin(
        bed, nri={"socket": str(bed.nri_socket), "plugin_index": "10", "request_timeout": 1.5}
    )
    configured = re.search(
        r"configured by containerd (\S+): events (0x[0-9a-f]+) .*request timeout ([\d.]+) s",
        plugin.log(),
    )
    assert configured, plugin.log()[-3000:]
    version, mask, timeout = configured.groups()
    assert version.lstrip("v").startswith(".".join(map(str, bed.version[:2])) + ".")
    assert int(mask, 16) & ~0x7FF == 0
    assert float(timeout) == (3.0 if bed.major >= 2 else 1.5)


async def test_pod_annotation_gets_injected_environment(containerd, start_plugin, cri):
    start_plugin(containerd)
    run = await cri.run_container_env(pod_annotations={"gpushare.io/gpu-memory": "2Gi"})
    env = env_of(run.lines)
    assert run.exit_code == 0
    assert env["GPUSHARE_MEMORY_LIMIT"] == "2147483648"
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUID0


async def test_container_without_request_is_left_alone(containerd, start_plugin, cri):
    start_plugin(containerd)
    run = await cri.run_container_env(env={"FOO": "bar"})
    env = env_of(run.lines)
    assert env["FOO"] == "bar"
    assert not any(key.startswith("GPUSHARE_") for key in env)


async def test_refusal_message_reaches_the_cri_caller(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    pod_id = await cri.run_pod("refused", annotations={"gpushare.io/gpu-memory": "lots"})
    with pytest.raises(GRPCError) as info:
        await cri.create_container(pod_id, "c", command=["true"])
    message = info.value.message or ""
    assert "gpushare.io/gpu-memory" in message and "lots" in message, message
    assert plugin.status()["allocations"] == []


@pytest.mark.parametrize("downtime", [0.0, 3.0])
async def test_plugin_reconnects_after_containerd_restart(make_containerd, start_plugin, downtime):
    bed = make_containerd()
    plugin = start_plugin(bed)
    bed.kill()
    time.sleep(downtime)  # the plugin backs off while the runtime is away
    bed.start()
    back = time.monotonic()
    connected = plugin.wait_connected(sessions=2)
    # The acceptance bound: back within 2 s of the runtime (the backoff tops out at 1 s).
    assert connected - back < 2.0, f"reconnected after {connected - back:.2f} s"
    async with bed.cri_client() as client:
        run = await client.run_container_env(pod_annotations={"gpushare.io/gpu-memory": "1Gi"})
    assert env_of(run.lines)["GPUSHARE_MEMORY_LIMIT"] == str(1 << 30)


async def test_plugin_sigterm_exits_cleanly(containerd, start_plugin):
    plugin = start_plugin(containerd)
    assert plugin.stop() == 0
    assert "nri-gpushare: stopped" in plugin.log()


class Recorder(Plugin):
    """A minimal plugin that records what Synchronize hands back."""

    def __init__(self) -> None:
        self.synchronized: list[set[str]] = []

    async def synchronize(self, pods, containers):
        self.synchronized.append({c.id for c in containers})
        return []

    async def stop_container(self, pod, container):
        return []


async def run_stub(socket: str) -> tuple[Recorder, Stub, asyncio.Task[None]]:
    recorder = Recorder()
    stub = Stub(recorder, name="recorder", index="20", socket_path=socket)
    task = asyncio.create_task(stub.run())
    await asyncio.wait_for(stub.synchronized.wait(), 10)
    return recorder, stub, task


async def test_synchronize_hands_back_running_containers(containerd, cri):
    first, stub, task = await run_stub(str(containerd.nri_socket))
    ids = []
    try:
        for name in ("one", "two"):
            pod_id = await cri.run_pod(name)
            cid = await cri.create_container(pod_id, name, command=["sleep", "300"])
            await cri.start(cid)
            ids.append(cid)
    finally:
        await stub.stop()
        await task

    second, stub, task = await run_stub(str(containerd.nri_socket))
    try:
        assert set(ids) <= second.synchronized[-1]
    finally:
        await stub.stop()
        await task


async def test_status_cli_text_and_json(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    pod_id = await cri.run_pod("shown", annotations={"gpushare.io/gpu-memory": "3Gi"})
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"])
    await cri.start(cid)
    base = [
        sys.executable,
        "-m",
        "nri_gpushare.cli.main",
        "status",
        "--config",
        str(plugin.config_path),
    ]
    text = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert "3072Mi" in text and cid[:13] in text and "default/shown" in text
    data = json.loads(
        subprocess.run(base + ["--json"], capture_output=True, text=True, check=True).stdout
    )
    assert data["allocations"][0]["container_id"] == cid
    assert data["gpus"][0]["memory_allocated"] == 3 << 30


def test_status_cli_without_a_plugin_says_so(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nri_gpushare.cli.main",
            "status",
            "--status-socket",
            str(tmp_path / "none.sock"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "cannot reach the plugin" in result.stderr and "nri-gpushare run" in result.stderr


async def test_plugin_launched_by_containerd_uses_fd3(tmp_path):
    """containerd starts plugins found in its plugin_path and hands them fd 3."""
    require_testbed()
    bed = Containerd()
    config = tmp_path / "gpushare.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "status_socket": str(tmp_path / "status.sock"),
                "api_socket": str(tmp_path / "api.sock"),
                # Never the default: another lane's plugin may hold it.
                "state_dir": str(tmp_path / "state"),
                "containerd": {"socket": str(bed.grpc_address)},
                "kmod": "off",
                "use_nvml": False,
                "inventory": gpu_inventory(1, "8Gi"),
                "interposer": {"missing": "warn"},  # no libgpushare.so on this node
            }
        )
    )
    bed.nri_plugin_dir.mkdir(parents=True, exist_ok=True)
    launcher = bed.nri_plugin_dir / "10-gpushare"
    launcher.write_text(
        f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m nri_gpushare.cli run "
        f"--config {config} 2>>{tmp_path / 'plugin.log'}\n"
    )
    launcher.chmod(0o755)
    try:
        bed.start()
        async with bed.cri_client() as client:
            deadline = time.monotonic() + 15
            while 'registered as \\"10-gpushare\\"' not in bed.log_text():
                assert time.monotonic() < deadline, bed.log_tail(40)
                await asyncio.sleep(0.05)
            run = await client.run_container_env(pod_annotations={"gpushare.io/gpu-memory": "1Gi"})
        assert env_of(run.lines)["GPUSHARE_MEMORY_LIMIT"] == str(1 << 30)
        assert "pre-launched" in (tmp_path / "plugin.log").read_text()
    finally:
        bed.stop()
