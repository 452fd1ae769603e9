"""The real DRA driver process (`nri-gpushare dra-driver`) next to the real
daemon, against the test kubelet built from the kubelet's DRA protos and the
test API server, with claims allocated by the test scheduler (KEP-5075's
consumable-capacity rule): registration, the published ResourceSlice and
its republishing after a share taken by hand, prepare/unprepare (booked in
the daemon's table, idempotent), a kubelet restart, a driver killed in the
middle of a prepare, and a claim the daemon cannot honour.

The daemon serves without a runtime here (no NRI socket): the containers
that use a prepared claim are tests/integration/test_dra_cri.py's part.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nri_gpushare.k8s.dra import CDI_KIND, CLAIM_ENV, DRIVER
from nri_gpushare.local.protocol import Request
from tests.integration.dra_node import NODE, DraNode, DriverProcess, until
from tests.integration.plugin import PluginProcess
from tests.integration.test_device_plugin import start_daemon
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_kubelet import DraKubelet

GiB = 1 << 30


@pytest.fixture
async def node() -> AsyncIterator[DraNode]:
    with tempfile.TemporaryDirectory(prefix="gs-dra-") as name:  # short: socket paths
        top = Path(name)
        api = ApiServer(top, validate="1.34").start()
        daemon = PluginProcess(
            top / "no-nri.sock",  # never there: the daemon keeps trying
            top / "daemon",
            containerd={"socket": ""},
            memory_reserve="512Mi",
        )
        driver = DriverProcess(daemon.config_path, top, api)
        kubelet = DraKubelet(driver.registry_dir)
        await kubelet.start()
        try:
            await start_daemon(daemon)
            driver.start()
            n = DraNode(api, daemon, driver, kubelet)
            await kubelet.wait_registered(1)
            await until(lambda: len(n.devices()) == 2, "the slice is published")
            yield n
        finally:
            await kubelet.stop()
            if driver.proc is not None:
                await driver.stop()
            if daemon.proc is not None:
                daemon.stop()
            api.stop()
            print(f"--- dra-driver log ---\n{driver.log()[-8000:]}")
            print(f"--- daemon log ---\n{daemon.log()[-4000:]}")


async def test_registers_and_publishes_each_gpu(node: DraNode) -> None:
    plugin = node.kubelet.plugin(DRIVER)
    assert plugin.info.type == "DRAPlugin"
    [slice_] = node.api.slices.values()
    spec = slice_["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"]["name"] == NODE
    gpu0 = node.devices()["gpu-0"]
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["attributes"]["index"] == {"int": 0}
    assert gpu0["attributes"]["uuid"]["string"].startswith("GPU-00000000")
    # 16Gi less the 512Mi reserve; all compute; max_inst slots (16 by default)
    assert gpu0["capacity"]["memory"]["value"] == "15872Mi"
    assert gpu0["capacity"]["compute"]["value"] == "100"
    assert gpu0["capacity"]["slots"]["value"] == "16"


async def test_prepare_books_exactly_what_was_allocated(node: DraNode) -> None:
    node.claim("a")  # 2Gi + 30 %
    assert node.schedule("a") == ""
    result = node.api.claims[("team", "a")]["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "2Gi", "compute": "30", "slots": "1"}
    uid = node.ref("a")[2]
    answer = await node.prepare("a")
    assert answer[uid].error == ""
    [device] = answer[uid].devices
    assert device.device_name == result["device"] and device.pool_name == NODE
    assert device.cdi_device_ids == [f"{CDI_KIND}={uid}"]
    assert device.share_id == result["shareID"]
    claim = node.claims()[uid]
    assert claim["gpus"] == [
        {
            "index": int(result["device"][-1]),
            "uuid": claim["gpus"][0]["uuid"],
            "memory": 2 * GiB,
            "core": 30,
        }
    ]
    spec = json.loads((node.driver.cdi_dir / f"gpushare.io-claim_{uid}.json").read_text())
    assert spec["devices"] == [{"name": uid, "containerEdits": {"env": [f"{CLAIM_ENV}={uid}"]}}]
    # The operator sees it: nri-gpushare status and gpushare-smi.
    for program in (["nri_gpushare.cli.main", "status"], ["nri_gpushare.cli.smi"]):
        shown = subprocess.run(
            [sys.executable, "-m", *program, "--status-socket", node.daemon.status_socket],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert shown.returncode == 0, shown.stderr
        assert "claim team/a" in shown.stdout.replace("CLAIM", "claim"), shown.stdout
        assert "2048Mi 30%" in shown.stdout.replace("2Gi 30%", "2048Mi 30%"), shown.stdout
    # The kubelet retries: the same answer, one booking.
    assert (await node.prepare("a"))[uid] == answer[uid]
    assert len(node.claims()) == 1
    gpu = node.daemon.status()["gpus"][claim["gpus"][0]["index"]]
    assert gpu["memory_allocated"] == 2 * GiB
    # Unprepare releases and removes the spec; again: nothing to do.
    assert (await node.unprepare("a"))[uid].error == ""
    assert (await node.unprepare("a"))[uid].error == ""
    assert node.claims() == {}
    assert not (node.driver.cdi_dir / f"gpushare.io-claim_{uid}.json").exists()


async def test_the_slice_is_republished_after_a_share_taken_by_hand(node: DraNode) -> None:
    writes = node.api.writes[("PUT", "resourceslices")]
    assert node.take_by_hand("hand-1", "4Gi", gpu=1).ok
    await until(lambda: node.capacity("gpu-1", "memory") == "11776Mi", "gpu-1 shows 4Gi less")
    assert node.capacity("gpu-0", "memory") == "15872Mi"
    assert node.api.writes[("PUT", "resourceslices")] > writes
    # ...and the DRA claims' own shares do not shrink it (the scheduler counts them).
    node.claim("a", memory="1Gi", compute=None)
    assert node.schedule("a") == ""
    await node.prepare("a")
    assert node.ask(Request("release", "", "hand-1")).ok
    await until(lambda: node.capacity("gpu-1", "memory") == "15872Mi", "gpu-1 whole again")


async def test_a_claim_the_daemon_cannot_honour_is_refused_with_why(node: DraNode) -> None:
    node.claim("big", memory="12Gi", compute="50")
    assert node.schedule("big") == ""
    device = node.api.claims[("team", "big")]["status"]["allocation"]["devices"]["results"][0]
    gpu = int(device["device"][-1])
    # Taken by hand between the scheduler's allocation and the kubelet's prepare.
    assert node.take_by_hand("hand-1", "8Gi", gpu=gpu).ok
    uid = node.ref("big")[2]
    error = (await node.prepare("big"))[uid].error
    assert f"GPU {gpu}" in error and "exceeds the free" in error, error
    assert node.claims() == {}
    assert not (node.driver.cdi_dir / f"gpushare.io-claim_{uid}.json").exists()


async def test_a_claim_of_another_node_is_refused(node: DraNode) -> None:
    node.claim("a")
    assert node.schedule("a") == ""
    claim = node.api.claims[("team", "a")]
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    node.api.put_claim(claim)
    uid = node.ref("a")[2]
    assert "not this node's" in (await node.prepare("a"))[uid].error
    assert node.claims() == {}


async def test_a_kubelet_restart(node: DraNode) -> None:
    node.claim("a")
    assert node.schedule("a") == ""
    await node.prepare("a")
    before = node.kubelet.registrations
    await node.kubelet.restart()
    await until(lambda: node.kubelet.registrations > before, "registered again")
    uid = node.ref("a")[2]
    assert (await node.prepare("a"))[uid].error == ""  # still prepared, same answer
    assert len(node.claims()) == 1


async def test_the_driver_killed_in_the_middle_of_a_prepare(node: DraNode) -> None:
    node.claim("a")
    assert node.schedule("a") == ""
    uid = node.ref("a")[2]
    assert node.daemon.proc is not None and node.driver.proc is not None
    os.kill(node.daemon.proc.pid, signal.SIGSTOP)  # the daemon sits on the booking
    try:
        pending = asyncio.ensure_future(node.prepare("a"))
        await until(lambda: f"claim {uid}: booking" in node.driver.log(), "asked the daemon", 10)
        await asyncio.sleep(0.3)  # the request on its way (either way the retry must hold)
        node.driver.kill()  # kill -9, the booking asked and never answered
    finally:
        os.kill(node.daemon.proc.pid, signal.SIGCONT)
    [first] = await asyncio.gather(pending, return_exceptions=True)
    assert isinstance(first, Exception) or first[uid].error, first  # not prepared
    node.driver.start()
    await until(lambda: node.kubelet.registrations >= 2, "the new driver registered")
    answer = await node.prepare("a")  # the kubelet's retry
    assert answer[uid].error == "" and len(node.claims()) == 1
    index = node.claims()[uid]["gpus"][0]["index"]
    assert node.daemon.status()["gpus"][index]["memory_allocated"] == 2 * GiB


async def test_the_health_stream_reports_each_gpu(node: DraNode) -> None:
    # Without NVML every GPU is healthy: the health stream says so for both.
    plugin = await node.kubelet.watch_health(DRIVER)
    await node.kubelet.wait_for(lambda: plugin.health is not None and len(plugin.health) == 2)
    assert all(h.health == 1 for h in plugin.health)


async def test_a_claim_deleted_without_an_unprepare_is_collected(node: DraNode) -> None:
    node.claim("a")
    node.claim("kept", memory="1Gi", compute=None)
    for name in ("a", "kept"):
        assert node.schedule(name) == ""
    await node.prepare("a", "kept")
    uid = node.ref("a")[2]
    del node.api.claims[("team", "a")]  # gone, and the kubelet never unprepares it
    await until(lambda: uid not in node.claims(), "the booking of the deleted claim is freed")
    assert not (node.driver.cdi_dir / f"gpushare.io-claim_{uid}.json").exists()
    assert [c["name"] for c in node.claims().values()] == ["kept"]
