"""A pod's resources.limits end to end on the CRI test bed: the device plugin's
own Allocate (in process, fed by the real daemon's status) answers what a
kubelet would ask, its annotations go into the CRI ContainerConfig as the
kubelet copies them, and the real plugin process gives exactly that share;
a forged pod annotation and fragmentation are refused through CRI."""

from __future__ import annotations

from typing import Any

import pytest

from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.service import DevicePluginService
from nri_gpushare.k8s.state import PluginState
from nri_gpushare.names import CORE, COUNT, KUBELET_ANNOTATIONS, MEMORY, RESOURCES
from nri_gpushare.share.model import Gpu
from tests.integration.plugin import gpu_inventory
from tests.integration.test_metrics import free_port, one, scrape, status_json
from tests.testbed.cri import GRPCError

GiB = 1 << 30
P = "gpushare.io/"


class Kubelet:
    """What the kubelet does with the device plugin for one container:
    the preferred IDs among the healthy ones, then Allocate; the answer's
    annotations are what it puts into the CRI ContainerConfig."""

    def __init__(self, plugin: Any, count: int, memory: int) -> None:
        inventory = gpu_inventory(count, f"{memory // GiB}Gi")
        gpus = [Gpu(g["index"], g["uuid"], g["name"], memory, g["index"]) for g in inventory]
        self.state = PluginState(gpus, 0, 16, plugin.status)
        self.services = {short: DevicePluginService(short, self.state) for short in RESOURCES}

    async def healthy(self, short: str) -> list[str]:
        await self.state.refresh()
        return [d.id for d in self.state.devices[short] if d.healthy]

    async def allocate(self, limits: dict[str, int]) -> dict[str, str]:
        annotations: dict[str, str] = {}
        for short, n in limits.items():
            service = self.services[short]
            preferred = await service.get_preferred_allocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_device_i_ds=await self.healthy(short), allocation_size=n
                        )
                    ]
                )
            )
            [chosen] = preferred.container_responses
            answer = await service.allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen.device_i_ds)]
                )
            )
            [container] = answer.container_responses
            annotations.update(container.annotations)
        return annotations


async def sleeper(cri, name: str, annotations=None, pod_annotations=None) -> str:
    pod_id = await cri.run_pod(name, annotations=pod_annotations)
    cid = await cri.create_container(
        pod_id, "main", command=["sleep", "3600"], annotations=annotations
    )
    await cri.start(cid)
    return cid


async def test_limits_become_exactly_the_share(containerd, start_plugin, cri):
    plugin = start_plugin(containerd, inventory=gpu_inventory(2, "16Gi"))
    kubelet = Kubelet(plugin, 2, 16 * GiB)
    annotations = await kubelet.allocate({MEMORY: 8, CORE: 60, COUNT: 2})
    assert annotations == {
        KUBELET_ANNOTATIONS[MEMORY]: "0-7",
        KUBELET_ANNOTATIONS[CORE]: "0-59",
        KUBELET_ANNOTATIONS[COUNT]: "0-1",
    }
    cid = await sleeper(cri, "limits", annotations)
    spec = (await cri.container_info(cid))["runtimeSpec"]
    env = dict(e.split("=", 1) for e in spec["process"]["env"])
    uuids = [g["uuid"] for g in gpu_inventory(2, "16Gi")]
    assert env["GPUSHARE_MEMORY_LIMIT"] == f"{4 * GiB},{4 * GiB}"
    assert env["GPUSHARE_CORE_LIMIT"] == "30,30"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    [alloc] = status_json(plugin)["allocations"]
    assert alloc["container_id"] == cid
    assert alloc["kubelet"] == {"gpu-core": "0-59", "gpu-count": "0-1", "gpu-memory": "0-7"}
    assert [(g["index"], g["memory"], g["core"]) for g in alloc["gpus"]] == [
        (0, 4 * GiB, 30),
        (1, 4 * GiB, 30),
    ]
    # The device plugin now sees those IDs held by a live container.
    assert len(await kubelet.healthy(MEMORY)) == 32
    await cri.stop(cid)
    assert status_json(plugin)["allocations"] == []


async def test_a_forged_pod_annotation_is_refused(make_containerd, start_plugin):
    # containerd copying gpushare.io/* pod annotations onto the container: the
    # forgery would read as the kubelet's there.
    bed = make_containerd(passthrough_annotations=(P + "*",))
    start_plugin(bed, inventory=gpu_inventory(1, "16Gi"))
    async with bed.cri_client() as cri:
        pod_id = await cri.run_pod("forged", annotations={KUBELET_ANNOTATIONS[MEMORY]: "0-15"})
        with pytest.raises(GRPCError) as info:
            await cri.create_container(pod_id, "main", command=["sleep", "3600"])
    message = info.value.message or ""
    assert f"pod annotation {KUBELET_ANNOTATIONS[MEMORY]}" in message, message
    assert "written only by nri-gpushare's device plugin through the kubelet" in message
    assert "resources.limits gpushare.io/gpu-memory / gpu-core / gpu-count instead" in message


async def test_fragmentation_is_refused_and_counted(containerd, start_plugin, cri):
    port = free_port()
    plugin = start_plugin(
        containerd, inventory=gpu_inventory(2, "16Gi"), metrics={"listen": f"127.0.0.1:{port}"}
    )
    for i in range(2):
        await sleeper(
            cri, f"fill{i}", pod_annotations={P + "gpu-memory": "6Gi", P + "gpu-devices": str(i)}
        )
    kubelet = Kubelet(plugin, 2, 16 * GiB)
    # 20 GiB free over the node: the kubelet admits 12, which no GPU has.
    assert len(await kubelet.healthy(MEMORY)) == 20
    annotations = await kubelet.allocate({MEMORY: 12})
    pod_id = await cri.run_pod("fragmented")
    with pytest.raises(GRPCError) as info:
        await cri.create_container(
            pod_id, "main", command=["sleep", "3600"], annotations=annotations
        )
    message = info.value.message or ""
    assert "the kubelet admitted resources.limits gpushare.io/gpu-memory=12" in message, message
    assert "no GPU has 12288Mi free" in message
    for g in gpu_inventory(2, "16Gi"):
        assert f"({g['uuid']}) 10240Mi and 100% compute free" in message
    assert 'docs/kubernetes.md "Fragmentation"' in message
    assert len(status_json(plugin)["allocations"]) == 2
    refusals = scrape(port)["gpushare_refusals_total"]
    assert one(refusals, reason="fragmentation") == 1
    assert one(refusals, reason="capacity") == 0


async def test_a_pod_annotation_cannot_add_compute_the_limits_did_not_ask_for(
    containerd, start_plugin, cri
):
    # The scheduler counted no gpu-core for this pod: an annotation reserving
    # compute would make the next pods the kubelet admits fail.
    plugin = start_plugin(containerd, inventory=gpu_inventory(1, "16Gi"))
    kubelet = Kubelet(plugin, 1, 16 * GiB)
    annotations = await kubelet.allocate({MEMORY: 4})
    pod_id = await cri.run_pod("adds-core", annotations={P + "gpu-core": "100"})
    with pytest.raises(GRPCError) as info:
        await cri.create_container(
            pod_id, "main", command=["sleep", "3600"], annotations=annotations
        )
    message = info.value.message or ""
    assert "pod annotation gpushare.io/gpu-core=100: the container asks with resources.limits" in (
        message
    ), message
    assert status_json(plugin)["allocations"] == []
    assert len(await kubelet.healthy(CORE)) == 100
    # asked in the limits, the same compute is given
    annotations = await kubelet.allocate({MEMORY: 4, CORE: 100})
    await sleeper(cri, "limits-core", annotations)
    [alloc] = status_json(plugin)["allocations"]
    assert [(g["memory"], g["core"]) for g in alloc["gpus"]] == [(4 * GiB, 100)]
