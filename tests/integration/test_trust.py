"""A hostile tenant against the real plugin (issue 8): real containerd, real
CRI pods.  Nothing a pod, container or image sets may disable the plugin,
forge an allocation or grant itself a share, and containers that escaped the
plugin while it was down are found.

This module's containerd passes ``gpushare.io/*`` pod and container
annotations through into the OCI spec (the runtime's ``pod_annotations`` /
``container_annotations``), as an operator may configure it: then a pod can
put any ``gpushare.io/assigned`` it likes on its containers.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator

import pytest

from tests.integration.plugin import gpu_inventory
from tests.testbed.containerd import Containerd
from tests.testbed.cri import GRPCError
from tests.testbed.cri_generated.runtime.v1 import ContainerState
from tests.testbed.fixtures import _keep, require_testbed
from tests.testbed.images import build_custom_image

GiB = 1 << 30
P = "gpushare.io/"
ASSIGNED = P + "assigned"
UUIDS = [g["uuid"] for g in gpu_inventory(2, "16Gi")]

ENV_IMAGE = "docker.io/gpushare/cgpu-env:test"  # ENV ALIYUN_COM_GPU_MEM_CONTAINER=8
LABEL_IMAGE = "docker.io/gpushare/share-label:test"  # LABEL gpushare.io/gpu-memory=4Gi
MAINTAINER_IMAGE = "docker.io/gpushare/maintainer-label:test"  # LABEL gpushare.io/maintainer


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    require_testbed()
    bed = Containerd(passthrough_annotations=(P + "*",)).start()
    for name, env, labels in (
        (ENV_IMAGE, {"ALIYUN_COM_GPU_MEM_CONTAINER": "8"}, {}),
        (LABEL_IMAGE, {}, {P + "gpu-memory": "4Gi"}),
        (MAINTAINER_IMAGE, {}, {P + "maintainer": "someone@example.com"}),
    ):
        bed.import_images(build_custom_image(name, env, labels))
    try:
        yield bed
    finally:
        bed.stop(remove=not _keep())


def claim(memory: int, core: int, high: bool, gpu: int = 0) -> str:
    """A forged gpushare.io/assigned value."""
    return json.dumps(
        {
            "version": 1,
            "gpus": [{"index": gpu, "uuid": UUIDS[gpu], "memory": memory, "core": core}],
            "priority": "high" if high else "normal",
            "isolation": "full",
        }
    )


async def sleeper(cri, name: str, annotations=None, image=None, namespace="default") -> str:
    pod_id = await cri.run_pod(name, namespace=namespace, annotations=annotations)
    kwargs = {"image": image} if image else {}
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"], **kwargs)
    await cri.start(cid)
    return cid


async def env_run(cri, name: str, pod_annotations=None, image=None) -> dict[str, str]:
    kwargs = {"image": image} if image else {}
    run = await cri.run_container(["env"], name=name, pod_annotations=pod_annotations, **kwargs)
    assert run.exit_code == 0, run.lines
    return dict(line.split("=", 1) for line in run.lines if "=" in line)


def allocated(plugin) -> dict[int, int]:
    return {g["index"]: g["memory_allocated"] for g in plugin.status()["gpus"]}


# -- hole 1: one bad annotation made the plugin inert -------------------------------------


@pytest.mark.parametrize(
    "forged",
    [
        '{"version":1,"gpus":[{"index":0,"uuid":"' + UUIDS[0] + '","memory":Infinity,"core":0}]}',
        "[" * 5000,
    ],
    ids=["infinity", "nested"],
)
async def test_a_bad_assigned_annotation_never_makes_the_plugin_inert(
    containerd, start_plugin, cri, forged
):
    # Created while no plugin runs, so the annotation stays on the container.
    await sleeper(cri, "poison", {ASSIGNED: forged})
    plugin = start_plugin(containerd)  # Synchronize sees the poisoned container
    assert plugin.status()["nri"]["connected"]
    env = await env_run(cri, "after-poison", {P + "gpu-memory": "1Gi"})
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(GiB)
    assert plugin.status()["allocations"] == []  # the runner exited: released


# -- hole 2: a container could forge its allocation ----------------------------------------


async def test_a_forged_allocation_is_ignored_after_a_restart(containerd, start_plugin, cri):
    # Both created while the plugin is down, carrying forged allocations.
    claims_all = await sleeper(cri, "claims-all", {ASSIGNED: claim(16 * GiB, 100, True)})
    small = await sleeper(
        cri, "claims-more", {P + "gpu-memory": "1Gi", ASSIGNED: claim(16 * GiB, 0, False, 1)}
    )
    plugin = start_plugin(containerd)  # unserved: deny, the default
    assert plugin.status()["allocations"] == []
    assert allocated(plugin) == {0: 0, 1: 0}
    # The one that asked runs with no share at all: killed, to come back through
    # the plugin; the one that only claims a share asked for nothing and runs on.
    assert (await cri.wait_exit(small, timeout=15)).exit_code == 137
    assert (await cri.container_status(claims_all)).state == ContainerState.CONTAINER_RUNNING
    # The whole capacity is still there: both GPUs take a full-size pod.
    await sleeper(cri, "full-0", {P + "gpu-memory": "16Gi"})
    await sleeper(cri, "full-1", {P + "gpu-memory": "16Gi"})
    assert allocated(plugin) == {0: 16 * GiB, 1: 16 * GiB}


async def test_a_forged_annotation_on_a_new_container_is_replaced(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    cid = await sleeper(
        cri, "forger", {P + "gpu-memory": "1Gi", ASSIGNED: claim(16 * GiB, 100, True)}
    )
    info = await cri.container_info(cid)
    assigned = json.loads(info["runtimeSpec"]["annotations"][ASSIGNED])
    assert assigned["gpus"][0]["memory"] == GiB and assigned["priority"] == "normal"
    nothing = await sleeper(cri, "forger-no-ask", {ASSIGNED: claim(16 * GiB, 100, True)})
    info = await cri.container_info(nothing)
    assert ASSIGNED not in info["runtimeSpec"]["annotations"]
    assert "ignoring the gpushare.io/assigned it carries" in plugin.log()


async def test_kill_9_and_restart_recover_from_the_daemons_own_records(
    containerd, start_plugin, cri
):
    plugin = start_plugin(containerd)
    await sleeper(cri, "rec-a", {P + "gpu-memory": "3Gi", P + "gpu-core": "30"})
    await sleeper(cri, "rec-b", {P + "gpu-memory": "2Gi", P + "priority": "high"})
    before = plugin.status()
    state_dir = plugin.workdir.parent / "state"
    state_file = state_dir / "allocations.json"
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
    plugin.kill()
    again = start_plugin(containerd)
    after = again.status()
    assert after["allocations"] == before["allocations"] and after["unserved"] == []
    assert after["gpus"] == before["gpus"]


async def test_a_state_file_others_can_write_is_not_trusted(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    cid = await sleeper(cri, "tampered", {P + "gpu-memory": "2Gi"})
    plugin.kill()
    state_file = plugin.workdir.parent / "state" / "allocations.json"
    os.chmod(state_file, 0o666)
    again = start_plugin(containerd, unserved="warn")  # listed, not killed
    assert again.status()["allocations"] == []
    assert [u["container_id"] for u in again.status()["unserved"]] == [cid]
    assert "not trusted" in again.log()


# -- hole 3: images granted themselves shares --------------------------------------------


async def test_an_image_cannot_grant_itself_a_share(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    for image in (ENV_IMAGE, LABEL_IMAGE):
        env = await env_run(cri, "img", image=image)
        assert "GPUSHARE_MEMORY_LIMIT" not in env and "NVIDIA_VISIBLE_DEVICES" not in env
    assert "ignoring environment ALIYUN_COM_GPU_MEM_CONTAINER" in plugin.log()
    assert "ignoring container label gpushare.io/gpu-memory" in plugin.log()
    # An unrelated label of ours in an image does not stop it from running.
    env = await env_run(cri, "maint", {P + "gpu-memory": "1Gi"}, image=MAINTAINER_IMAGE)
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(GiB)


async def test_image_sources_are_opt_in_and_a_pods_opt_out_wins(containerd, start_plugin, cri):
    start_plugin(containerd, sources={"pods": {"env": True, "labels": True}})
    env = await env_run(cri, "img-env", image=ENV_IMAGE)
    assert env["GPUSHARE_MEMORY_LIMIT"] == f"{8 * GiB},{8 * GiB}"  # cGPU: every GPU
    env = await env_run(cri, "img-label", image=LABEL_IMAGE)
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(4 * GiB)
    for image in (ENV_IMAGE, LABEL_IMAGE):
        env = await env_run(cri, "opt-out", {P + "gpu-memory": "0"}, image=image)
        assert "GPUSHARE_MEMORY_LIMIT" not in env
    env = await env_run(cri, "maint", {P + "gpu-memory": "1Gi"}, image=MAINTAINER_IMAGE)
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(GiB)


async def test_namespace_allow_list(containerd, start_plugin, cri):
    start_plugin(containerd, sources={"pods": {"namespaces": ["gpu-team"]}})
    pod_id = await cri.run_pod("outsider", namespace="web", annotations={P + "gpu-memory": "1Gi"})
    with pytest.raises(GRPCError) as info:
        await cri.create_container(pod_id, "main", command=["true"])
    message = info.value.message or ""
    assert "namespace 'web' may not ask for GPU shares" in message, message
    assert "sources.pods.namespaces" in message
    await sleeper(cri, "insider", {P + "gpu-memory": "1Gi"}, namespace="gpu-team")


async def test_per_container_key_for_a_missing_container_is_reported(containerd, start_plugin, cri):
    plugin = start_plugin(containerd)
    pod_id = await cri.run_pod("typo", annotations={P + "container.mian.gpu-memory": "1Gi"})
    cid = await cri.create_container(pod_id, "main", command=["true"])
    await cri.start(cid)
    await cri.wait_exit(cid)
    await cri.stop_pod(pod_id)
    assert "gpushare.io/container.mian.* name no container of this pod (its containers: main)" in (
        plugin.log()
    )


# -- hole 4: fail-open was silent ----------------------------------------------------------


async def test_containers_created_while_the_plugin_is_down_are_reported(
    containerd, start_plugin, cri
):
    cid = await sleeper(cri, "failed-open", {P + "gpu-memory": "2Gi"})  # no plugin: fail-open
    await sleeper(cri, "no-ask")
    plugin = start_plugin(containerd, unserved="warn")
    [entry] = plugin.status()["unserved"]
    assert entry["container_id"] == cid and entry["action"] == "warned"
    assert entry["asked"] == "gpu-memory 2048Mi" and entry["pod"] == "default/failed-open"
    assert "runs without a share" in plugin.log()
    await cri.stop(cid)
    assert plugin.status()["unserved"] == []  # gone with the container


async def test_unserved_deny_ends_them(containerd, start_plugin, cri):
    cid = await sleeper(cri, "failed-open-deny", {P + "gpu-memory": "2Gi"})
    bystander = await sleeper(cri, "bystander")
    plugin = start_plugin(containerd)  # unserved: deny is the default
    status = await cri.wait_exit(cid, timeout=15)
    assert status.exit_code == 137  # SIGKILL
    assert "unserved policy deny: denied: killed" in plugin.log()
    assert (await cri.container_status(bystander)).state == ContainerState.CONTAINER_RUNNING
    # The kubelet starts the pod's container again: this time through the plugin.
    [pod_id] = [c.pod_sandbox_id for c in await cri.list_containers() if c.id == cid]
    again = await cri.create_container(pod_id, "main-again", command=["sleep", "3600"])
    await cri.start(again)
    env = (await cri.container_info(again))["runtimeSpec"]["process"]["env"]
    assert f"GPUSHARE_MEMORY_LIMIT={2 * GiB}" in env
    assert [a["container_id"] for a in plugin.status()["allocations"]] == [again]


async def test_unserved_deny_ends_a_container_started_after_synchronize(
    containerd, start_plugin, cri
):
    pod_id = await cri.run_pod("late-start", annotations={P + "gpu-memory": "2Gi"})
    cid = await cri.create_container(pod_id, "main", command=["sleep", "3600"])  # fail-open
    plugin = start_plugin(containerd, unserved="deny")
    [entry] = plugin.status()["unserved"]
    assert entry["container_id"] == cid  # created, not started: no process to end yet
    await cri.start(cid)  # as the kubelet would, a moment later
    status = await cri.wait_exit(cid, timeout=15)
    assert status.exit_code == 137
    assert "unserved policy deny: denied: killed" in plugin.log()
