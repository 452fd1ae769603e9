"""ShareService: injection plans, kernel-module modes, release, recovery."""

import dataclasses
import errno
import json
import logging

import pytest

from nri_gpushare.names import ASSIGNED
from nri_gpushare.share.kernel import (
    AlreadyRegistered,
    GpuQuota,
    KmodError,
    ModuleNotLoaded,
    OverCommitted,
    Registration,
)
from nri_gpushare.share.model import (
    STANDALONE_SOURCES,
    ContainerInfo,
    DeviceNode,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"


def ctr(cid, annotations=None, env=None, cgroups_path="", name=None, pod_annotations=None):
    return ContainerInfo(
        id=cid,
        name=name or cid,
        pod_name=f"pod-{cid}",
        pod_namespace="ns",
        pod_uid=f"uid-{cid}",
        pod_annotations=pod_annotations if pod_annotations is not None else annotations or {},
        env=env or {},
        cgroups_path=cgroups_path,
    )


def make(kmod_mode="optional", kmod=None, gpus=None, devices=None, **policy):
    kmod = kmod if kmod is not None else FakeKernelModule()
    policy.setdefault("pod_sources", STANDALONE_SOURCES)
    svc = ShareService(
        gpus or make_gpus(2),
        NodePolicy(kmod_mode=kmod_mode, **policy),
        Inline(kmod),
        devices or FakeDevices(),
    )
    done(svc.start())
    return svc, kmod


def live(c: ContainerInfo, plan) -> ContainerInfo:
    """The container as Synchronize reports it: with the adjustment's annotations."""
    return ContainerInfo(
        id=c.id,
        name=c.name,
        pod_name=c.pod_name,
        pod_namespace=c.pod_namespace,
        pod_uid=c.pod_uid,
        pod_annotations=c.pod_annotations,
        annotations={**c.annotations, **plan.annotations},
        labels=c.labels,
        env={**c.env, **plan.env},
        cgroups_path=c.cgroups_path,
    )


REQ = {P + "gpu-memory": "2Gi", P + "gpu-core": "30"}


# -- injection -------------------------------------------------------------------------------


async def test_plan_devices_env_and_annotation():
    svc, kmod = make(gpus=make_gpus(4), devices=FakeDevices(uvm=True))
    plan = await svc.lifecycle.create_container(
        ctr("c1", {P + "gpu-memory": "2Gi,1Gi", P + "gpu-core": "30", P + "gpu-devices": "3,1"})
    )
    assert [d.path for d in plan.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia3",
        "/dev/nvidia1",
        "/dev/gpushare",
    ]
    assert plan.devices[3] == DeviceNode("/dev/nvidia3", "c", 195, 3)
    uuids = f"{svc.gpus[3].uuid},{svc.gpus[1].uuid}"
    assert plan.env == {
        "NVIDIA_VISIBLE_DEVICES": uuids,
        "GPUSHARE_GPU_UUIDS": uuids,
        "GPUSHARE_MEMORY_LIMIT": f"{2 * GiB},{GiB}",
        "GPUSHARE_CORE_LIMIT": "30,30",
        "GPUSHARE_PRIORITY": "normal",
        "GPUSHARE_ISOLATION": "full",
    }
    assigned = json.loads(plan.annotations[ASSIGNED])
    assert assigned == {
        "version": 1,
        "gpus": [
            {"index": 3, "uuid": svc.gpus[3].uuid, "memory": 2 * GiB, "core": 30},
            {"index": 1, "uuid": svc.gpus[1].uuid, "memory": GiB, "core": 30},
        ],
        "priority": "normal",
        "isolation": "full",
    }
    assert kmod.regs["c1"] == Registration(
        "c1", (GpuQuota(3, 2 * GiB, 30, False), GpuQuota(1, GiB, 30, False))
    )


async def test_no_core_limit_means_no_core_env():
    svc, _ = make()
    plan = await svc.lifecycle.create_container(
        ctr("c1", {P + "gpu-memory": "1Gi", P + "priority": "high"})
    )
    assert "GPUSHARE_CORE_LIMIT" not in plan.env
    assert plan.env["GPUSHARE_PRIORITY"] == "high"


async def test_not_managed_gives_no_plan():
    svc, kmod = make()
    assert await svc.lifecycle.create_container(ctr("c1")) is None
    assert await svc.lifecycle.create_container(ctr("c2", {P + "gpu-memory": "0"})) is None
    assert svc.allocations == {} and kmod.regs == {}


async def test_create_twice_is_idempotent():
    svc, kmod = make()
    c = ctr("c1", REQ)
    assert await svc.lifecycle.create_container(c) == await svc.lifecycle.create_container(c)
    assert svc.status()["gpus"][0]["memory_allocated"] == 2 * GiB
    assert len([x for x in kmod.calls if x[0] == "register"]) == 1


async def test_isolation_none_is_accounted_not_registered():
    svc, kmod = make()
    plan = await svc.lifecycle.create_container(ctr("c1", {**REQ, P + "isolation": "none"}))
    assert kmod.regs == {}
    assert "/dev/gpushare" not in [d.path for d in plan.devices]
    assert plan.env["GPUSHARE_ISOLATION"] == "none"
    assert plan.env["GPUSHARE_CORE_LIMIT"] == "30"
    assert svc.status()["gpus"][0]["core_allocated"] == 30


async def test_isolation_memory_registers_without_compute():
    svc, kmod = make()
    plan = await svc.lifecycle.create_container(
        ctr("c1", {P + "gpu-memory": "1Gi", P + "isolation": "memory"})
    )
    assert kmod.regs["c1"].quotas == (GpuQuota(0, GiB, 0, False),)
    assert "GPUSHARE_CORE_LIMIT" not in plan.env


# -- kernel-module modes -----------------------------------------------------------------------


async def test_required_without_module_refuses_and_reserves_nothing():
    svc, kmod = make("required", FakeKernelModule(loaded=False))
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert "kernel module is not loaded" in str(info.value)
    assert "kmod: required" in str(info.value)
    assert info.value.reason == "kmod"
    assert svc.allocations == {}
    assert svc.status()["gpus"][0]["memory_allocated"] == 0


async def test_required_with_no_client_refuses():
    svc, _ = make("required", kmod=None)
    svc.link.kmod = None
    with pytest.raises(ShareRefused):
        await svc.lifecycle.create_container(ctr("c1", REQ))


async def test_optional_without_module_places_and_says_unenforced(caplog):
    caplog.set_level(logging.WARNING)
    svc, kmod = make("optional", FakeKernelModule(loaded=False))
    assert "isolation is not enforced" in caplog.text
    caplog.clear()
    plan = await svc.lifecycle.create_container(ctr("c1", REQ))
    assert plan is not None
    assert "isolation is not enforced" in caplog.text
    assert "/dev/gpushare" not in [d.path for d in plan.devices]
    assert plan.env["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    assert svc.status()["allocations"][0]["registered"] is False


async def test_optional_with_no_client_at_all():
    svc = ShareService(make_gpus(1), NodePolicy(), None, FakeDevices())
    assert await svc.lifecycle.create_container(ctr("c1", REQ)) is not None
    assert await svc.lifecycle.release("c1")


async def test_off_never_touches_the_module(caplog):
    caplog.set_level(logging.WARNING)
    svc, kmod = make("off")
    assert "isolation is not enforced" in caplog.text
    await svc.lifecycle.create_container(ctr("c1", REQ, cgroups_path="/kubepods/c1"))
    await svc.lifecycle.start_container(ctr("c1", REQ, cgroups_path="/kubepods/c1"))
    await svc.lifecycle.release("c1")
    await svc.recovery.synchronize([])
    assert kmod.calls == []


async def test_module_refusal_rolls_back_placement():
    svc, kmod = make()
    kmod.fail_next["register"] = OverCommitted("GPU 0: memory over-committed")
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert "kernel module refused" in str(info.value)
    assert f"errno {errno.ENOSPC}" in str(info.value)
    assert info.value.reason == "kmod"
    assert svc.allocations == {} and kmod.regs == {}
    assert svc.status()["gpus"][0]["memory_allocated"] == 0
    assert await svc.lifecycle.create_container(ctr("c1", REQ)) is not None  # nothing left behind


async def test_module_refuses_overcommit_on_its_own():
    # the module holds a registration the service does not know about
    svc, kmod = make(gpus=make_gpus(1))
    kmod.regs["ghost"] = Registration("ghost", (GpuQuota(0, 31 * GiB, 0),))
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert "over-committed" in str(info.value)
    assert svc.allocations == {}


async def test_optional_module_unloaded_during_register():
    svc, kmod = make()
    kmod.fail_next["register"] = ModuleNotLoaded("gone")
    assert await svc.lifecycle.create_container(ctr("c1", REQ)) is not None
    assert "c1" not in svc.registered


async def test_required_module_unloaded_during_register():
    svc, kmod = make("required")
    kmod.fail_next["register"] = ModuleNotLoaded("gone")
    with pytest.raises(ShareRefused):
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert svc.allocations == {}


async def test_stale_registration_is_replaced():
    svc, kmod = make()
    kmod.regs["c1"] = Registration("c1", (GpuQuota(1, GiB, 0),))
    await svc.lifecycle.create_container(ctr("c1", REQ))
    assert kmod.regs["c1"].quotas == (GpuQuota(0, 2 * GiB, 30, False),)


async def test_gpus_declared_when_module_appears():
    kmod = FakeKernelModule(loaded=False)
    svc, _ = make(kmod=kmod)
    kmod.load()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    assert kmod.gpus == {0: 32 * GiB, 1: 32 * GiB}
    assert "c1" in kmod.regs


# -- start, release ----------------------------------------------------------------------------


async def test_start_binds_cgroup():
    svc, kmod = make()
    c = ctr("c1", REQ, cgroups_path="/kubepods/pod1/c1")
    await svc.lifecycle.create_container(c)
    await svc.lifecycle.start_container(c)
    assert kmod.cgroups == {"c1": "/kubepods/pod1/c1"}


async def test_start_bind_failure_optional_is_logged(caplog):
    svc, kmod = make()
    c = ctr("c1", REQ, cgroups_path="/x")
    await svc.lifecycle.create_container(c)
    kmod.fail_next["bind_cgroup"] = KmodError("no such cgroup", errno.ENOENT)
    await svc.lifecycle.start_container(c)
    assert "could not bind cgroup /x" in caplog.text


async def test_start_bind_failure_required_raises():
    svc, kmod = make("required")
    c = ctr("c1", REQ, cgroups_path="/x")
    await svc.lifecycle.create_container(c)
    kmod.fail_next["bind_cgroup"] = KmodError("no such cgroup", errno.ENOENT)
    with pytest.raises(ShareRefused):
        await svc.lifecycle.start_container(c)


async def test_start_of_unmanaged_container_does_nothing():
    svc, kmod = make()
    await svc.lifecycle.start_container(ctr("c9", cgroups_path="/x"))
    assert [c for c in kmod.calls if c[0] == "bind_cgroup"] == []


async def test_release_is_idempotent():
    svc, kmod = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    assert await svc.lifecycle.release("c1") is True  # StopContainer
    assert await svc.lifecycle.release("c1") is False  # RemoveContainer
    assert await svc.lifecycle.release("never-seen") is False
    assert kmod.regs == {} and svc.allocations == {}
    assert [c for c in kmod.calls if c[0] == "unregister"] == [("unregister", "c1")]
    assert svc.status()["gpus"][0]["memory_allocated"] == 0


async def test_failed_unregister_is_retried_on_next_release():
    svc, kmod = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    kmod.fail_next["unregister"] = KmodError("busy", errno.EBUSY)
    assert await svc.lifecycle.release("c1") is True
    assert "c1" in kmod.regs
    assert await svc.lifecycle.release("c1") is False
    assert kmod.regs == {}


async def test_release_when_module_already_lost_it():
    svc, kmod = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    kmod.unload()
    assert await svc.lifecycle.release("c1") is True


# -- recovery ------------------------------------------------------------------------------------


async def restart(svc, kmod, live_containers, store=None):
    """A new service (a restarted daemon) on the old one's records, synchronized."""
    store = store if store is not None else MemoryStore(svc.store.load())
    fresh = ShareService(svc.gpus, svc.policy, Inline(kmod), FakeDevices(), store)
    await fresh.recovery.synchronize(live_containers)
    return fresh


async def test_restart_leaves_identical_allocations():
    svc, kmod = make(gpus=make_gpus(4))
    containers = []
    for i, ann in enumerate(
        [
            REQ,
            {P + "gpu-memory": "3Gi,1Gi", P + "gpu-count": "3"},
            {P + "gpu-memory": "1Gi", P + "priority": "high", P + "isolation": "none"},
            {P + "gpu-memory": "5Gi", P + "isolation": "memory", P + "gpu-devices": "3"},
        ]
    ):
        c = ctr(f"c{i}", ann, cgroups_path=f"/cg/c{i}")
        containers.append(live(c, await svc.lifecycle.create_container(c)))
    regs_before = dict(kmod.regs)
    before = svc.status()
    calls = len(kmod.calls)
    fresh = await restart(svc, kmod, containers)
    assert fresh.status() == before
    assert kmod.regs == regs_before
    assert [c[0] for c in kmod.calls[calls:]] == ["declare_gpus", "registrations"]


async def test_restart_never_double_allocates():
    svc, kmod = make(gpus=make_gpus(1))
    c = ctr("c1", {P + "gpu-memory": "32Gi"})
    lc = live(c, await svc.lifecycle.create_container(c))
    fresh = await restart(svc, kmod, [lc])
    with pytest.raises(ShareRefused):
        await fresh.lifecycle.create_container(ctr("c2", {P + "gpu-memory": "1Gi"}))
    # CreateContainer replayed for the live one is answered from the table
    assert (await fresh.lifecycle.create_container(c)).annotations == lc.annotations
    assert fresh.status()["gpus"][0]["memory_allocated"] == 32 * GiB


async def test_recovery_without_module_uses_the_records():
    svc, kmod = make(kmod=FakeKernelModule(loaded=False))
    c = ctr("c1", REQ)
    lc = live(c, await svc.lifecycle.create_container(c))
    fresh = await restart(svc, kmod, [lc])
    assert fresh.status()["allocations"] == svc.status()["allocations"]


async def test_without_records_or_module_nothing_is_recovered_and_it_is_unserved():
    svc, kmod = make(kmod=FakeKernelModule(loaded=False))
    c = ctr("c1", REQ)
    lc = live(c, await svc.lifecycle.create_container(c))
    fresh = await restart(svc, kmod, [lc], store=MemoryStore())
    assert fresh.allocations == {}
    assert [u["container_id"] for u in fresh.status()["unserved"]] == ["c1"]


async def test_orphan_registrations_are_removed():
    svc, kmod = make()
    for cid in ("c1", "c2"):
        await svc.lifecycle.create_container(ctr(cid, REQ))
    c3 = ctr("c3", REQ)
    lc3 = live(c3, await svc.lifecycle.create_container(c3))
    fresh = await restart(svc, kmod, [lc3])
    assert set(kmod.regs) == {"c3"}
    assert set(fresh.allocations) == {"c3"}
    assert fresh.status()["gpus"][0]["memory_allocated"] == 2 * GiB


async def test_lost_registrations_are_registered_again_and_bound():
    svc, kmod = make()
    c = ctr("c1", REQ, cgroups_path="/cg/c1")
    lc = live(c, await svc.lifecycle.create_container(c))
    kmod.unload()
    kmod.load()  # module reloaded: it forgot everything
    fresh = await restart(svc, kmod, [lc])
    assert kmod.gpus == {0: 32 * GiB, 1: 32 * GiB}
    assert kmod.regs["c1"].quotas == (GpuQuota(0, 2 * GiB, 30, False),)
    assert kmod.cgroups == {"c1": "/cg/c1"}
    assert "c1" in fresh.registered


async def test_differing_registration_wins_over_the_record(caplog):
    svc, kmod = make()
    c = ctr("c1", REQ)
    lc = live(c, await svc.lifecycle.create_container(c))
    kmod.regs["c1"] = Registration("c1", (GpuQuota(1, GiB, 0),))
    fresh = await restart(svc, kmod, [lc])
    assert kmod.regs["c1"].quotas == (GpuQuota(1, GiB, 0),)
    assert fresh.allocations["c1"].describe_shares() == "GPU 1 1024Mi"
    assert "the module's wins" in caplog.text


async def test_without_records_a_live_share_is_recovered_from_the_module():
    svc, kmod = make()
    kmod.declare_gpus([])
    kmod.gpus.update({0: 32 * GiB, 1: 32 * GiB})
    kmod.regs["c1"] = Registration("c1", (GpuQuota(1, 4 * GiB, 20, True),))
    c1 = ContainerInfo(id="c1", name="c1", annotations={ASSIGNED: "{}"})  # what we gave it
    fresh = await restart(svc, kmod, [c1], store=MemoryStore())
    alloc = fresh.allocations["c1"]
    assert [(s.index, s.memory_bytes, s.core_percent) for s in alloc.shares] == [(1, 4 * GiB, 20)]
    assert alloc.priority == "high"
    assert "c1" in fresh.registered


async def test_a_recorded_container_created_without_the_adjustment_holds_nothing(caplog):
    """containerd gave up on a slow CreateContainer and created the container
    without the plugin's adjustment: the record (and registration) must not make
    it look served."""
    svc, kmod = make()
    c = ctr("c1", REQ)
    await svc.lifecycle.create_container(c)  # recorded and registered, but the answer was lost
    fresh = await restart(svc, kmod, [c])  # c carries no gpushare.io/assigned
    assert fresh.allocations == {}
    assert [u["container_id"] for u in fresh.status()["unserved"]] == ["c1"]
    assert kmod.regs == {}  # the registration of a share it never got is removed
    assert "created without the plugin's adjustment" in caplog.text


async def test_stopped_containers_and_duplicates_hold_nothing_twice():
    svc, kmod = make(kmod_mode="off", gpus=make_gpus(1))
    c = ctr("c1", {P + "gpu-memory": "16Gi"})
    lc = live(c, await svc.lifecycle.create_container(c))
    fresh = await restart(svc, kmod, [lc, lc])
    assert fresh.status()["gpus"][0]["memory_allocated"] == 16 * GiB
    await fresh.lifecycle.release("c1")
    assert fresh.status()["gpus"][0]["memory_allocated"] == 0
    stopped = dataclasses.replace(lc, running=False)
    again = await restart(svc, kmod, [stopped])
    assert again.allocations == {}


FORGED = json.dumps(
    {"version": 1, "gpus": [{"index": 0, "uuid": "GPU-0", "memory": 32 * GiB, "core": 100}]}
)


@pytest.mark.parametrize(
    "annotation",
    [FORGED, "{not json", '{"gpus":[{"memory": Infinity}]}', "[" * 100_000, "x" * 1_000_000],
)
async def test_a_containers_assigned_annotation_is_never_trusted(annotation):
    svc, kmod = make(kmod_mode="off")
    forged = ContainerInfo(id="c1", name="c1", annotations={ASSIGNED: annotation})
    fresh = await restart(svc, kmod, [forged])
    assert fresh.allocations == {}
    assert fresh.status()["unserved"] == []  # it asked for nothing


ADD = (
    '{"add":{"container_id":"c1","name":"c1","pod":"ns/pod-c1","priority":"normal",'
    '"isolation":"full","gpus":[{"index":0,"uuid":"GPU-0","memory":%s,"core":0}]}}'
)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[" * 100_000,
        '{"version":1}\n' + ADD % "Infinity",
        '{"version":1}\n' + ADD % "1e400",
        '{"version":1}\n' + ADD % '"x"',
        '{"version":1}\n{"add":"x"}\n{"del":7}\nnull\n1\n[]\n{"add":{"gpus":"x"}}',
        '{"version":2}\n' + ADD % "1073741824",
        '{"version":1}\n' + (ADD % "1073741824")[:-20],  # torn by a crash
    ],
)
async def test_bad_records_are_logged_and_synchronize_goes_on(text, caplog):
    svc, kmod = make(kmod_mode="off")
    fresh = await restart(svc, kmod, [ctr("c1", REQ), ctr("c2", REQ)], store=MemoryStore(text))
    assert fresh.allocations == {}
    assert {u["container_id"] for u in fresh.status()["unserved"]} == {"c1", "c2"}
    assert "record" in caplog.text
    # and the plugin still serves
    assert await fresh.lifecycle.create_container(ctr("c3", REQ)) is not None


async def test_a_record_for_another_container_name_is_ignored(caplog):
    svc, kmod = make(kmod_mode="off")
    c = ctr("c1", REQ)
    lc = live(c, await svc.lifecycle.create_container(c))
    impostor = ContainerInfo(id="c1", name="other", pod_name=c.pod_name, pod_namespace="ns")
    fresh = await restart(svc, kmod, [impostor])
    assert fresh.allocations == {}
    assert "not this container" in caplog.text
    assert lc.id == impostor.id


async def test_forged_annotation_on_input_is_removed_and_overwritten(caplog):
    svc, _ = make(kmod_mode="off")
    c1 = ContainerInfo(id="c1", name="c1", pod_name="p", annotations={ASSIGNED: FORGED})
    plan = await svc.lifecycle.create_container(c1)
    assert plan is not None and plan.remove_annotations == (ASSIGNED,) and not plan.env
    c2 = ContainerInfo(
        id="c2", name="c2", pod_name="p", pod_annotations=REQ, annotations={ASSIGNED: FORGED}
    )
    plan2 = await svc.lifecycle.create_container(c2)
    assert json.loads(plan2.annotations[ASSIGNED])["gpus"][0]["memory"] == 2 * GiB
    assert "ignoring the gpushare.io/assigned" in caplog.text


async def test_recovered_shares_over_capacity_are_kept(caplog):
    svc, kmod = make(kmod_mode="off", gpus=make_gpus(1))
    c = ctr("c1", {P + "gpu-memory": "32Gi"})
    lc = live(c, await svc.lifecycle.create_container(c))
    fresh = ShareService(
        svc.gpus,
        NodePolicy(kmod_mode="off", memory_reserve_bytes=GiB),
        None,
        FakeDevices(),
        svc.store,
    )
    await fresh.recovery.synchronize([lc])
    assert "over capacity" in caplog.text
    assert fresh.status()["gpus"][0]["memory_free"] == 0
    with pytest.raises(ShareRefused):
        await fresh.lifecycle.create_container(ctr("c2", {P + "gpu-memory": "1Mi"}))


async def test_synchronize_replaces_the_table():
    svc, kmod = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    await svc.recovery.synchronize([])
    assert svc.allocations == {} and kmod.regs == {}
    assert svc.status()["gpus"][0]["memory_allocated"] == 0


async def test_already_registered_error_type_from_module():
    # the module's EEXIST for a replayed registration is not surfaced as a refusal
    svc, kmod = make()
    kmod.fail_next["register"] = AlreadyRegistered("exists")
    assert await svc.lifecycle.create_container(ctr("c1", REQ)) is not None
    assert "c1" in kmod.regs


async def test_status_is_json():
    svc, _ = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    status = svc.status()
    assert json.loads(json.dumps(status)) == status
    gpu0 = status["gpus"][0]
    assert gpu0["containers"] == ["c1"]
    assert gpu0["memory_free"] == 30 * GiB
    assert gpu0["core_free"] == 70
    assert status["allocations"][0]["pod"] == "ns/pod-c1"
    assert status["kmod"] == {"mode": "optional", "loaded": True, "problem": ""}


async def test_memory_dev_mismatch_is_only_logged(caplog):
    svc, _ = make()
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "2", "ALIYUN_COM_GPU_MEM_DEV": "15"}
    assert await svc.lifecycle.create_container(ctr("c1", env=env)) is not None
    assert "ALIYUN_COM_GPU_MEM_DEV=15 GiB but GPU 0 has 32.0 GiB" in caplog.text


async def test_policy_validation():
    for bad in (
        dict(max_inst=0),
        dict(max_inst=26),
        dict(default_placement="x"),
        dict(kmod_mode="maybe"),
        dict(memory_reserve_bytes=-1),
        dict(max_high_priority_per_gpu=-1),
    ):
        with pytest.raises(ValueError):
            NodePolicy(**bad)


# -- kernel-module trouble (from review) ---------------------------------------------------


class LandsThenTimesOut(FakeKernelModule):
    """A registration whose write reaches the module after the client gave up."""

    def register(self, registration):
        super().register(registration)
        raise KmodError("gpushare.ko did not answer within 1 s", errno.ETIMEDOUT)


async def test_registration_that_lands_after_a_timeout_is_undone():
    kmod = LandsThenTimesOut()
    svc, _ = make(kmod=kmod)
    with pytest.raises(ShareRefused, match="errno 110"):
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert kmod.regs == {} and svc.allocations == {}


async def test_module_reloaded_between_calls_gets_the_gpus_declared_again():
    svc, kmod = make()
    await svc.lifecycle.create_container(ctr("c1", REQ))
    await svc.lifecycle.release("c1")
    kmod.unload()
    kmod.load()  # forgot the GPUs; the service has not noticed yet
    await svc.lifecycle.create_container(ctr("c2", REQ))
    assert set(kmod.regs) == {"c2"} and kmod.gpus == {0: 32 * GiB, 1: 32 * GiB}


async def test_refused_gpu_list_is_reported_as_such():
    kmod = FakeKernelModule()
    kmod.fail_next["declare_gpus"] = OverCommitted("GPU index 16 out of range", errno.EINVAL)
    svc, _ = make("required", kmod=kmod)
    assert "refused this node's GPU list" in svc.status()["kmod"]["problem"]


# -- a registration that ends some other way ---------------------------------------------


async def test_unexpected_client_error_leaves_nothing_reserved():
    # Not a KmodError (a client bug, a parse error...): the create fails, and
    # neither the ledger nor the allocation table keeps the share.
    svc, kmod = make(gpus=make_gpus(1))
    kmod.fail_next["register"] = RuntimeError("client bug")  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        await svc.lifecycle.create_container(ctr("c1", REQ))
    assert svc.allocations == {}
    assert svc.status()["gpus"][0]["memory_allocated"] == 0
    assert await svc.lifecycle.create_container(ctr("c1", REQ)) is not None  # placed afresh
    assert "c1" in kmod.regs


async def test_cancelled_create_leaves_nothing_reserved():
    # The runtime went away while the module answered: the handler is cancelled.
    import asyncio

    gate = asyncio.Event()

    class Hanging(Inline):
        async def register(self, registration):
            await gate.wait()
            await super().register(registration)

    kmod = FakeKernelModule()
    svc = ShareService(make_gpus(1), NodePolicy(kmod_mode="optional"), Hanging(kmod), FakeDevices())
    await svc.start()
    task = asyncio.ensure_future(svc.lifecycle.create_container(ctr("c1", REQ)))
    await asyncio.sleep(0)
    assert "c1" in svc.allocations  # reserved while the module answers
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.allocations == {}
    assert svc.status()["gpus"][0]["memory_allocated"] == 0
    kmod.regs["c1"] = Registration("c1", (GpuQuota(0, 2 * GiB, 30),))  # it landed after all
    await svc.lifecycle.release("c1")
    assert kmod.regs == {}


async def test_release_after_a_synchronize_that_could_not_read_the_module():
    # Synchronize while the module does not answer (stuck, or its registry
    # unreadable): whether the live shares are registered is unknown, so their
    # release must still unregister them, or the module keeps their quota.
    svc, kmod = make()
    c1 = ctr("c1", REQ)
    plan = await svc.lifecycle.create_container(c1)
    kmod.fail_next["registrations"] = KmodError("timed out", errno.ETIMEDOUT)
    await svc.recovery.synchronize([live(c1, plan)])
    assert "c1" in svc.allocations and "c1" in kmod.regs
    await svc.lifecycle.release("c1")
    assert kmod.regs == {}
    assert await svc.lifecycle.create_container(ctr("c2", REQ)) is not None


async def test_the_journal_replays_and_compacts():
    from nri_gpushare.share import records

    svc, kmod = make(kmod_mode="off", gpus=make_gpus(1))
    live_ones = []
    for i in range(records.COMPACT_AFTER + 10):  # forces a compaction on the way
        c = ctr(f"c{i}", {P + "gpu-memory": "1Mi"})
        plan = await svc.lifecycle.create_container(c)
        if i % 100 == 0:  # a few stay (max_inst), the rest come and go
            live_ones.append(live(c, plan))
        else:
            await svc.lifecycle.release(c.id)
    text = svc.store.load()
    assert text.count("\n") < records.COMPACT_AFTER  # compacted, not every change kept
    fresh = await restart(svc, kmod, live_ones)
    assert set(fresh.allocations) == {c.id for c in live_ones}
    assert fresh.status()["unserved"] == []


# -- nothing kept per container ------------------------------------------------------------


def per_container_state(svc: ShareService) -> dict[str, int]:
    """The sizes of everything the service keeps by container or pod."""
    link, limits = svc.link, svc.limits
    return {
        "allocations": len(svc.allocations),
        "unserved": len(svc.unserved),
        "local": len(svc.local),
        "pods": len(svc.pod_containers),
        "creating": len(svc.creating),
        "registered": len(link.registered),
        "bind_later": len(link._bind_later),
        "unregister_later": len(link._unregister_later),
        "unregister_pending": len(link._unregister_pending),
        "limits": len(limits.applied) + len(limits.notes),
        "compute": len(svc.compute),
        "ledger": sum(len(u.containers) + len(u.high_priority) for u in svc.ledger.usage.values()),
    }


async def test_create_start_stop_remove_cycles_leave_nothing_behind():
    """Many lifecycles (some refused, some not asking, a pod's stop) leave no
    entry for a gone container in any of the service's tables."""
    svc, kmod = make()
    for i in range(300):
        c = ctr(f"c{i}", REQ if i % 3 else {}, cgroups_path=f"/kubepods/c{i}")
        if i % 7 == 0:  # refused: more than a GPU has
            c = ctr(f"c{i}", {P + "gpu-memory": "999Gi"})
            with pytest.raises(ShareRefused):
                await svc.lifecycle.create_container(c)
        else:
            await svc.lifecycle.create_container(c)
            await svc.lifecycle.start_container(c)
            await svc.sample_compute(now=float(i))
        await svc.lifecycle.release(c.id, "stopped")
        await svc.lifecycle.release(c.id, "removed")
        svc.lifecycle.pod_stopped(c.pod_uid, c.pod, c.pod_annotations)
    assert set(per_container_state(svc).values()) == {0}, per_container_state(svc)
    assert kmod.regs == {} and len([c for c in kmod.calls if c[0] == "register"]) > 100


async def test_pods_whose_stop_never_came_are_forgotten_oldest_first(monkeypatch):
    monkeypatch.setattr("nri_gpushare.share.lifecycle.MAX_PODS_REMEMBERED", 5)
    svc, _ = make()
    for i in range(8):
        c = ctr(f"c{i}", REQ)
        await svc.lifecycle.create_container(c)
        await svc.lifecycle.release(c.id)
    assert list(svc.pod_containers) == [f"uid-c{i}" for i in range(3, 8)]
