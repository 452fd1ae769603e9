"""The real device plugin process (`nri-gpushare device-plugin`) next to the
real daemon (`nri-gpushare run`, the same config), against the test kubelet
(`tests/k8s/kubelet.py`): registration, the device lists and their health as
the daemon comes and goes, Allocate, re-registration after a kubelet
restart, and SIGTERM.

The daemon serves its status without a runtime (it keeps trying to reach
the NRI socket, which does not exist here), so no containerd is needed:
placing what Allocate answered is the end-to-end tests' part.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nri_gpushare.k8s import UNHEALTHY, endpoint
from nri_gpushare.names import CORE, COUNT, KUBELET_ANNOTATIONS, MEMORY, RESOURCES
from tests.integration.plugin import ROOT, PluginProcess
from tests.k8s.kubelet import Devices, TestKubelet, healthy

# 2 GPUs of 16 GiB (tests.integration.plugin's inventory) less 512 MiB each.
LISTED = {RESOURCES[MEMORY]: 30, RESOURCES[CORE]: 200, RESOURCES[COUNT]: 2}


class DevicePluginProcess:
    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DevicePluginProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nri_gpushare.cli.main", "device-plugin"]
                + ["--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    async def stop(self) -> int:
        """SIGTERM; its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Node:
    kubelet: TestKubelet
    daemon: PluginProcess
    plugin: DevicePluginProcess


async def until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def daemon_answers(daemon: PluginProcess) -> bool:
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()
    try:
        daemon.status()
    except (OSError, ValueError):
        return False
    return True


async def start_daemon(daemon: PluginProcess) -> None:
    daemon.start(wait=False)  # no runtime to synchronize with: wait for its status
    await until(lambda: daemon_answers(daemon), "the daemon serves its status")


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    with tempfile.TemporaryDirectory(prefix="gs-dp-") as top:  # short: socket paths
        kubelet_dir = Path(top) / "kubelet"
        daemon = PluginProcess(
            Path(top) / "no-nri.sock",  # never there: the daemon keeps trying
            Path(top) / "daemon",
            containerd={"socket": ""},
            memory_reserve="512Mi",
            kubernetes={"device_plugin_dir": str(kubelet_dir)},
        )
        plugin = DevicePluginProcess(daemon.config_path, Path(top) / "device-plugin.log")
        kubelet = TestKubelet(kubelet_dir)
        await kubelet.start()
        try:
            await start_daemon(daemon)
            plugin.start()
            yield Node(kubelet, daemon, plugin)
        finally:
            await kubelet.stop()
            if plugin.proc is not None:
                await plugin.stop()
            if daemon.proc is not None:
                daemon.stop()
            # Shown with a failed test's report.
            print(f"--- device plugin log ---\n{plugin.log()[-8000:]}")
            print(f"--- daemon log ---\n{daemon.log()[-4000:]}")


async def wait_lists(kubelet: TestKubelet, predicate: Callable[[Devices], bool]) -> None:
    for resource, count in LISTED.items():

        def listed(devices: Devices, count: int = count) -> bool:
            return len(devices) == count and predicate(devices)

        await kubelet.wait_for(resource, listed)


async def test_registers_every_resource(node: Node) -> None:
    await node.kubelet.wait_registered(3)
    requests = node.kubelet.requests
    assert sorted((r.resource_name, r.endpoint, r.version) for r in requests) == sorted(
        (RESOURCES[s], endpoint(s), "v1beta1") for s in RESOURCES
    )
    for request in requests:
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required
    await wait_lists(node.kubelet, lambda d: True)
    for plugin in node.kubelet.plugins.values():
        assert plugin.options is not None and plugin.options.get_preferred_allocation_available
    assert len(node.kubelet.requests) == 3  # registered once


async def test_lists_the_inventory_healthy(node: Node) -> None:
    await wait_lists(node.kubelet, lambda d: healthy(d) == len(d))
    for resource, count in LISTED.items():
        devices = node.kubelet.plugins[resource].devices
        assert devices is not None
        assert [d.id for d in devices] == [str(n) for n in range(count)]
        assert node.kubelet.allocatable(resource) == count


async def test_health_follows_the_daemon(node: Node) -> None:
    await wait_lists(node.kubelet, lambda d: healthy(d) == len(d))
    node.daemon.stop()
    # Nothing can be placed while the daemon is down: every device unhealthy.
    await wait_lists(node.kubelet, lambda d: all(x.health == UNHEALTHY for x in d))
    await start_daemon(node.daemon)
    await wait_lists(node.kubelet, lambda d: healthy(d) == len(d))
    assert "the daemon's status cannot be read" in node.plugin.log()


async def test_allocate_memory_core_and_count(node: Node) -> None:
    kubelet = node.kubelet
    await wait_lists(kubelet, lambda d: healthy(d) == len(d))
    memory, core, count = (RESOURCES[s] for s in (MEMORY, CORE, COUNT))
    preferred = await kubelet.preferred(memory, ["9", "3", "10", "4", "5"], ["10"], 3)
    assert preferred == ["10", "3", "4"]
    assert await kubelet.allocate(memory, ["10", "3", "4"]) == {
        "gpushare.io/kubelet.gpu-memory": "3-4,10"
    }
    ids = [str(n) for n in range(100, 160)]
    assert await kubelet.allocate(core, ids) == {KUBELET_ANNOTATIONS[CORE]: "100-159"}
    assert await kubelet.allocate(count, ["1"]) == {KUBELET_ANNOTATIONS[COUNT]: "1"}
    with pytest.raises(GRPCError) as err:
        await kubelet.allocate(count, ["2"])  # two GPUs: 0 and 1
    assert err.value.status == Status.INVALID_ARGUMENT
    assert "not advertised" in str(err.value.message)
    log = node.plugin.log()
    assert "Allocate gpushare.io/gpu-memory: 3-4,10" in log
    assert "Allocate gpushare.io/gpu-core: 100-159" in log


async def test_registers_again_after_a_kubelet_restart(node: Node) -> None:
    kubelet = node.kubelet
    await wait_lists(kubelet, lambda d: healthy(d) == len(d))
    await kubelet.restart()  # removes every socket, a new kubelet.sock
    assert kubelet.sockets() == {"kubelet.sock"}
    await kubelet.wait_registered(6)
    assert sorted(r.resource_name for r in kubelet.requests[3:]) == sorted(RESOURCES.values())
    await wait_lists(kubelet, lambda d: healthy(d) == len(d))
    assert kubelet.sockets() == {"kubelet.sock"} | {endpoint(s) for s in RESOURCES}
    got = await kubelet.allocate(RESOURCES[MEMORY], ["0"])
    assert got == {KUBELET_ANNOTATIONS[MEMORY]: "0"}


async def test_sigterm_removes_our_sockets(node: Node) -> None:
    kubelet = node.kubelet
    await wait_lists(kubelet, lambda d: True)
    followed = list(kubelet.plugins.values())
    assert await node.plugin.stop() == 0
    assert kubelet.sockets() == {"kubelet.sock"}
    for plugin in followed:
        assert plugin.task is not None
        await asyncio.wait_for(plugin.task, 10)
        assert plugin.ended == "ok", plugin.ended  # the streams ended, not broke off
    assert "device-plugin: stopped" in node.plugin.log()
