"""DRA end to end on the CRI test bed: the real driver process prepares a
claim the test scheduler allocated (KEP-5075's consumable-capacity rule),
the test kubelet passes the claim's CDI device to containerd through CRI
(``CDI_devices``) as the real kubelet does, and the real plugin process
holds the container to exactly the claim's share; a pod the claim is not
reserved for is refused; the fragmentation case of docs/kubernetes.md,
which the device plugin's node-wide sums admit and the daemon then refuses,
is placed by DRA where a GPU has the room."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.k8s.dra import CLAIM_ENV, DRIVER
from nri_gpushare.k8s.dra.slices import SliceGpu, node_slice
from nri_gpushare.local.protocol import Request
from nri_gpushare.names import MEMORY
from tests.integration.dra_node import NODE, DraNode, DriverProcess, until
from tests.integration.plugin import gpu_inventory
from tests.integration.test_kubelet_requests import Kubelet, sleeper
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_kubelet import DraKubelet
from tests.testbed.cri import GRPCError

GiB = 1 << 30


@pytest.fixture
async def dra(containerd, start_plugin) -> AsyncIterator[DraNode]:
    daemon = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    with tempfile.TemporaryDirectory(prefix="gs-dra-") as name:
        top = Path(name)
        api = ApiServer(top, validate="1.34").start()
        driver = DriverProcess(daemon.config_path, top, api)
        driver.cdi_dir = Path(containerd.base) / "cdi"  # where the bed's containerd reads
        kubelet = DraKubelet(driver.registry_dir)
        await kubelet.start()
        driver.start()
        node = DraNode(api, daemon, driver, kubelet)
        try:
            await kubelet.wait_registered(1)
            await until(lambda: len(node.devices()) == 2, "the slice is published")
            yield node
        finally:
            await kubelet.stop()
            await driver.stop()
            api.stop()
            print(f"--- dra-driver log ---\n{driver.log()[-6000:]}")


async def prepared(node: DraNode, name: str, pod_uid: str, **asked: Any) -> str:
    """A claim made, allocated for pod `pod_uid` and prepared: its CDI device."""
    node.claim(name, **asked)
    assert node.schedule(name, pod_uid) == ""
    uid = node.ref(name)[2]
    answer = (await node.prepare(name))[uid]
    assert answer.error == "", answer.error
    [device] = answer.devices
    [cdi] = device.cdi_device_ids
    return str(cdi)


async def run_with_claim(cri, name: str, pod_uid: str, cdi: str) -> tuple[str, str]:
    pod_id = await cri.run_pod(name, uid=pod_uid)
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"], cdi_devices=[cdi])
    await cri.start(cid)
    return pod_id, cid


def env_of(info: dict[str, Any]) -> dict[str, str]:
    entries = info["runtimeSpec"]["process"]["env"]
    return dict(e.split("=", 1) for e in entries)


async def test_the_claims_container_gets_exactly_its_share(dra: DraNode, cri) -> None:
    pod_uid = str(uuid.uuid4())
    cdi = await prepared(dra, "train", pod_uid, memory="2Gi", compute="30")
    uid = dra.ref("train")[2]
    _, cid = await run_with_claim(cri, "train", pod_uid, cdi)
    env = env_of(await cri.container_info(cid))
    assert env[CLAIM_ENV] == uid  # the CDI device's edit, applied by containerd
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    assert env["GPUSHARE_CORE_LIMIT"] == "30"
    status = dra.daemon.status()
    [alloc] = [a for a in status["allocations"] if a["container_id"] == cid]
    assert alloc["claim"] == uid
    claim = dra.claims()[uid]
    assert claim["holder"] == cid
    [share] = alloc["gpus"]
    assert (share["index"], share["memory"], share["core"]) == (
        claim["gpus"][0]["index"],
        2 * GiB,
        30,
    )
    assert env["NVIDIA_VISIBLE_DEVICES"] == share["uuid"]
    # Counted once: the container holds the claim's booking, not a second share.
    assert status["gpus"][share["index"]]["memory_allocated"] == 2 * GiB
    # Its container gone, the claim is booked again until the kubelet unprepares it.
    await cri.stop(cid)
    await cri.remove(cid)
    await until(lambda: dra.claims()[uid]["holder"] == "", "the booking is the claim's again")
    assert dra.daemon.status()["gpus"][share["index"]]["memory_allocated"] == 2 * GiB
    await dra.unprepare("train")
    assert dra.daemon.status()["gpus"][share["index"]]["memory_allocated"] == 0


async def test_a_pod_the_claim_is_not_reserved_for_is_refused(dra: DraNode, cri) -> None:
    cdi = await prepared(dra, "train", str(uuid.uuid4()))
    with pytest.raises(GRPCError) as info:
        await run_with_claim(cri, "intruder", str(uuid.uuid4()), cdi)
    assert "is not one claim" in str(info.value.message) and "reserved for" in str(
        info.value.message
    )
    assert not [a for a in dra.daemon.status()["allocations"] if a["claim"]]


async def test_fragmentation_is_placed_by_dra(dra: DraNode, cri) -> None:
    # 3Gi free on each GPU: 6Gi free on the node, no GPU with 4Gi.
    for gpu in (0, 1):
        assert dra.take_by_hand(f"hand-{gpu}", "13Gi", gpu=gpu).ok
    await until(lambda: dra.capacity("gpu-1", "memory") == "3Gi", "the slice shows 3Gi each")
    # The device plugin's sums admit gpu-memory: 4 here; the daemon refuses it.
    kubelet = Kubelet(dra.daemon, 2, 16 * GiB)
    annotations = await kubelet.allocate({MEMORY: 4})
    with pytest.raises(GRPCError, match="fragmentation"):
        await sleeper(cri, "dp-pod", annotations=annotations)
    # Through DRA the scheduler sees each GPU: not this node, but node-b with room.
    other = SliceGpu(0, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "Other GPU", 16 * GiB)
    dra.api.slices["node-b-gpushare.io"] = node_slice(
        "node-b", [other], memory_reserve_bytes=0, max_inst=16, generation=1
    )
    dra.claim("four", memory="4Gi", compute=None)
    assert dra.schedule("four") == ""
    [result] = dra.api.claims[("team", "four")]["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == ("node-b", "gpu-0")
    # Room freed on this node's GPU 1: a new claim goes there and runs.
    assert dra.ask(Request("release", "", "hand-1")).ok
    await until(lambda: dra.capacity("gpu-1", "memory") == "16Gi", "gpu-1 free again")
    del dra.api.slices["node-b-gpushare.io"]
    pod_uid = str(uuid.uuid4())
    cdi = await prepared(dra, "four-here", pod_uid, memory="4Gi", compute=None)
    assert (
        dra.api.claims[("team", "four-here")]["status"]["allocation"]["devices"]["results"][0][
            "device"
        ]
        == "gpu-1"
    )
    _, cid = await run_with_claim(cri, "four-here", pod_uid, cdi)
    [alloc] = [a for a in dra.daemon.status()["allocations"] if a["container_id"] == cid]
    assert [(g["index"], g["memory"]) for g in alloc["gpus"]] == [(1, 4 * GiB)]
    assert DRIVER and NODE  # the node's own pool is node-a
