"""Kubernetes end to end: scheduler, kubelet, device plugin, containerd, NRI.

One real node: the containerd test bed with the real plugin daemon (one
simulated 16 GiB GPU, 512 MiB reserved, max_inst 4) and the real
`nri-gpushare device-plugin` process registered with the test kubelet.  A
second node exists only as numbers.  Pods are placed by a scheduler
simulation that knows nothing but what the nodes advertise (the real node's
allocatable is the healthy count the device plugin lists, as the kubelet
reports it).  A pod the simulation binds to the real node is admitted the
kubelet's way (GetPreferredAllocation among the healthy IDs it does not hold,
then Allocate) and created through CRI with Allocate's annotations in its
ContainerConfig, as the kubelet does.

What it shows: every pod bound to the real node gets exactly the share its
limits ask for, none is refused; a pod asking more than the node advertises
(memory, compute, or a container slot past max_inst) never reaches it; a
deleted pod's room comes back.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.names import CORE, MEMORY, RESOURCES
from nri_gpushare.share.ids import format_ids, parse_ids
from tests.integration.plugin import PluginProcess, gpu_inventory
from tests.integration.test_device_plugin import DevicePluginProcess
from tests.k8s.kubelet import TestKubelet
from tests.k8s.scheduler import Scheduler, SimNode

GiB = 1 << 30
MEM, CPU = RESOURCES[MEMORY], RESOURCES[CORE]
MAX_INST = 4


@dataclass
class RealNode:
    """The test bed as a Kubernetes node: its kubelet's books and pods."""

    daemon: PluginProcess
    kubelet: TestKubelet
    cri: Any
    plugin: DevicePluginProcess
    held: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # pod -> resource -> IDs
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod -> (sandbox, container)

    def available(self, resource: str) -> list[str]:
        """Healthy IDs the kubelet does not hold (what it may hand out)."""
        plugin = self.kubelet.plugins[resource]
        taken = set().union(*(h.get(resource, set()) for h in self.held.values()))
        return [d.id for d in plugin.devices or [] if d.health == "Healthy" and d.id not in taken]

    def allocatable(self) -> dict[str, int]:
        return {r: self.kubelet.allocatable(r) for r in (MEM, CPU)}

    async def admit_and_create(self, pod: str, limits: dict[str, int]) -> str:
        """The kubelet's admission (IDs, Allocate), then CRI create + start."""
        annotations: dict[str, str] = {}
        held: dict[str, set[str]] = {}
        for resource, n in limits.items():
            available = self.available(resource)
            assert len(available) >= n, f"the kubelet would not admit {pod}: {resource}"
            ids = await self.kubelet.preferred(resource, available, [], n)
            assert len(ids) == n and set(ids) <= set(available), ids
            annotations |= await self.kubelet.allocate(resource, ids)
            held[resource] = set(ids)
        self.held[pod] = held
        sandbox = await self.cri.run_pod(pod)
        cid = await self.cri.create_container(
            sandbox, "main", command=["sleep", "3600"], annotations=annotations
        )
        await self.cri.start(cid)
        self.pods[pod] = (sandbox, cid)
        return cid

    async def delete(self, pod: str) -> None:
        """As the kubelet deletes a pod that ran: seen running by the device
        plugin first (one deleted within the second before it looks leaves
        its Allocate grant holding a container slot for up to SLOT_TTL;
        docs/kubernetes.md)."""
        seen = f"grant gpu-memory {format_ids(int(i) for i in self.held[pod][MEM])} is live"
        async with asyncio.timeout(15):
            while seen not in self.plugin.log():
                await asyncio.sleep(0.1)
        sandbox, cid = self.pods.pop(pod)
        await self.cri.stop(cid)
        await self.cri.remove(cid)
        await self.cri.stop_pod(sandbox)
        await self.cri.remove_pod(sandbox)
        del self.held[pod]  # the kubelet frees a deleted pod's devices

    async def settled(self) -> None:
        """Until the lists show what the daemon can place: the kubelet's free
        IDs equal the room the daemon reports (one GPU: exact)."""

        def room() -> dict[str, int]:
            [gpu] = self.daemon.status()["gpus"]
            if len(gpu["containers"]) >= MAX_INST or gpu["memory_free"] < GiB:
                return {MEM: 0, CPU: 0}
            return {MEM: gpu["memory_free"] // GiB, CPU: gpu["core_free"]}

        try:
            async with asyncio.timeout(15):
                while {r: len(self.available(r)) for r in (MEM, CPU)} != room():
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"lists never matched the daemon: {self.allocatable()} vs {room()}"
            ) from None


@pytest.fixture
async def node(containerd, start_plugin, cri) -> AsyncIterator[RealNode]:
    with tempfile.TemporaryDirectory(prefix="gs-k8s-") as top:
        kubelet_dir = Path(top) / "device-plugins"
        daemon = start_plugin(
            containerd,
            inventory=gpu_inventory(1, "16Gi"),
            memory_reserve="512Mi",
            max_inst=MAX_INST,
            kubernetes={"device_plugin_dir": str(kubelet_dir)},
        )
        plugin = DevicePluginProcess(daemon.config_path, Path(top) / "device-plugin.log")
        async with TestKubelet(kubelet_dir) as kubelet:
            plugin.start()
            try:
                await kubelet.wait_registered(len(RESOURCES))
                for resource in RESOURCES.values():
                    await kubelet.wait_for(
                        resource, lambda d: any(x.health == "Healthy" for x in d)
                    )
                yield RealNode(daemon, kubelet, cri, plugin)
            finally:
                await plugin.stop()
                print(f"--- device plugin log ---\n{plugin.log()[-6000:]}")


def share(daemon: PluginProcess, cid: str) -> dict[str, Any]:
    [found] = [a for a in daemon.status()["allocations"] if a["container_id"] == cid]
    return found


async def test_the_scheduler_places_by_what_the_node_advertises(node: RealNode) -> None:
    await node.settled()
    assert node.allocatable() == {MEM: 15, CPU: 100}  # 16 GiB less 512 MiB, one GPU
    big = SimNode("big", {MEM: 160, CPU: 200})
    real = SimNode("real", node.allocatable())
    scheduler = Scheduler([real, big])

    async def submit(pod: str, limits: dict[str, int]) -> str:
        """Schedule from the advertised numbers; run it when it is ours."""
        await node.settled()
        real.allocatable = node.allocatable()  # the kubelet's node status update
        target = scheduler.schedule(pod, limits)
        if target is not real:
            return target.name if target else "unschedulable"
        cid = await node.admit_and_create(pod, limits)
        got = share(node.daemon, cid)
        [gpu] = got["gpus"]
        assert gpu["memory"] == limits[MEM] * GiB
        assert gpu["core"] == limits.get(CPU, 0)
        for resource, ids in node.held[pod].items():
            short = resource.split("/")[1]
            assert parse_ids(got["kubelet"][short]) == {int(i) for i in ids}
        return "real"

    placed = {
        "p1": await submit("p1", {MEM: 4, CPU: 30}),
        "p2": await submit("p2", {MEM: 3, CPU: 30}),
        "p3": await submit("p3", {MEM: 20}),  # more memory than the node has
        "p4": await submit("p4", {MEM: 2, CPU: 50}),  # 40% compute left
        "p5": await submit("p5", {MEM: 2, CPU: 40}),
        "p6": await submit("p6", {MEM: 1}),  # the fourth container: max_inst
        "p7": await submit("p7", {MEM: 1}),  # 5 GiB free, but no container slot
        "p8": await submit("p8", {MEM: 400}),
    }
    assert placed == {
        "p1": "real",
        "p2": "real",
        "p3": "big",
        "p4": "big",
        "p5": "real",
        "p6": "real",
        "p7": "big",
        "p8": "unschedulable",
    }
    status = node.daemon.status()
    assert status["gpus"][0]["memory_allocated"] == 10 * GiB
    assert status["gpus"][0]["core_allocated"] == 100
    # Deleting a pod gives its room back, through the lists alone.
    await node.delete("p1")
    scheduler.delete("p1")
    assert await submit("p9", {MEM: 4, CPU: 30}) == "real"
    assert await submit("p10", {MEM: 1}) == "big"
    # The daemon's books and the kubelet's agree: every live container's IDs
    # are the ones it was allocated, and they add up to what is placed.
    live = node.daemon.status()["allocations"]
    assert len(live) == MAX_INST
    ids = [parse_ids(a["kubelet"]["gpu-memory"]) for a in live]
    assert sum(map(len, ids)) * GiB == node.daemon.status()["gpus"][0]["memory_allocated"]
    assert set().union(*ids) == {int(i) for h in node.held.values() for i in h[MEM]}
