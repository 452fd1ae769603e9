"""Resizing a running container's share: the domain (share/resize.py) over
the fake kernel module: validation, placement against free room, the
module applied GPU by GPU and rolled back, the kubelet's and standalone
refusals, the records after a restart, the decision line."""

import json
import logging

import pytest

from nri_gpushare.names import KUBELET_ANNOTATIONS, MEMORY
from nri_gpushare.share import records
from nri_gpushare.share.kernel import GpuQuota, Registration
from nri_gpushare.share.model import ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, Gated, GiB, Inline, MiB, done, make_gpus

P = "gpushare.io/"


def pod(cid, annotations, name="main"):
    return ContainerInfo(
        id=cid,
        name=name,
        pod_name=f"pod-{cid}",
        pod_namespace="ns",
        pod_uid=f"uid-{cid}",
        pod_annotations=annotations,
        cgroups_path=f"/k8s/{cid}",
    )


def service(kmod=None, store=None, gpus=2, **policy):
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        make_gpus(gpus, 16 * GiB), NodePolicy(**policy), Inline(kmod), FakeDevices(), store
    )
    done(svc.start())
    return svc, kmod


def create(svc, cid, **keys):
    c = pod(cid, {P + k.replace("_", "-"): v for k, v in keys.items()})
    plan = done(svc.lifecycle.create_container(c))
    return c, plan


def resize(svc, ref, **ask):
    return done(svc.resizer.resize(ref, ResizeAsk(**ask)))


def refused(svc, ref, **ask) -> ShareRefused:
    with pytest.raises(ShareRefused) as info:
        resize(svc, ref, **ask)
    return info.value


def books(svc, kmod):
    """Everything a refusal must leave as it was."""
    return (
        dict(svc.allocations),
        {
            i: (u.memory_bytes, u.core_percent, set(u.high_priority))
            for i, u in svc.ledger.usage.items()
        },
        dict(kmod.regs),
        svc.store.load(),
    )


def quota(kmod, cid, gpu):
    return next(q for q in kmod.regs[cid].quotas if q.gpu_index == gpu)


# -- validation: like a new request ----------------------------------------------------------


@pytest.mark.parametrize(
    ("ask", "says"),
    [
        ({"memory": "3Gx"}, "memory '3Gx'"),
        ({"memory": "0"}, "cannot be resized to 0 bytes"),
        ({"memory": "1Gi,1Gi"}, "gives 2 values, and the share has 1 GPU"),
        ({"memory": "1Gi,"}, "empty value in the list"),
        ({"core": "7"}, "multiple of 5 between 5 and 100"),
        ({"core": "105"}, "multiple of 5"),
        ({"priority": "urgent"}, "must be one of normal, high"),
        ({}, "nothing to change"),
    ],
)
def test_a_bad_value_is_refused_like_a_new_request_and_changes_nothing(ask, says):
    svc, kmod = service()
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    before = books(svc, kmod)
    e = refused(svc, "c1", **ask)
    assert e.reason == "invalid" and says in str(e), str(e)
    assert books(svc, kmod) == before
    assert not any(m == "update_quota" for m, _ in kmod.calls)


def test_core_on_a_memory_only_share_and_high_priority_where_the_node_forbids_it():
    svc, kmod = service(max_high_priority_per_gpu=0)
    create(svc, "c1", gpu_memory="1Gi", isolation="memory")
    assert "isolation memory, which has no compute limit" in str(refused(svc, "c1", core="20"))
    assert "allows no high-priority" in str(refused(svc, "c1", priority="high"))


def test_the_container_is_found_by_id_prefix_or_name_and_a_vague_one_is_refused():
    svc, _ = service()
    create(svc, "abc111", gpu_memory="1Gi")
    create(svc, "abc222", gpu_memory="1Gi")
    assert resize(svc, "abc1", memory="2Gi")[0].container_id == "abc111"
    e = refused(svc, "abc", memory="2Gi")
    assert "names 2 containers by name or ID prefix (abc111 'main', abc222 'main')" in str(e)
    assert "no container holding a share" in str(refused(svc, "zzz", memory="2Gi"))
    svc2, _ = service()
    create(svc2, "x1", gpu_memory="1Gi")
    assert resize(svc2, "ns/pod-x1/main", memory="2Gi")[0].container_id == "x1"


# -- applied live in the module ----------------------------------------------------------------


def test_growing_memory_and_core_changes_the_module_the_books_and_status():
    svc, kmod = service()
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    alloc, changed = resize(svc, "c1", memory="2Gi", core="60", priority="high")
    assert changed
    assert quota(kmod, "c1", alloc.shares[0].index) == GpuQuota(
        alloc.shares[0].index, 2 * GiB, 60, True
    )
    used = svc.ledger.usage[alloc.shares[0].index]
    assert (used.memory_bytes, used.core_percent, used.high_priority) == (2 * GiB, 60, {"c1"})
    [entry] = svc.status()["allocations"]
    assert entry["gpus"][0]["memory"] == 2 * GiB and entry["gpus"][0]["core"] == 60
    assert entry["priority"] == "high" and entry["resized"] is True
    # Asked again: already so, nothing written.
    calls = len(kmod.calls)
    assert resize(svc, "c1", memory="2Gi") == (alloc, False)
    assert len(kmod.calls) == calls


def test_a_resize_is_refused_when_the_gpu_has_no_free_room_and_a_shrink_always_fits():
    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="4Gi", gpu_core="50")
    create(svc, "c2", gpu_memory="10Gi", gpu_core="40")
    before = books(svc, kmod)
    e = refused(svc, "c1", memory="7Gi")
    assert e.reason == "capacity"
    assert "memory 7168Mi exceeds the 6144Mi it can have" in str(e) and "by 1024Mi" in str(e)
    e = refused(svc, "c1", core="65")
    assert "core 65% exceeds the 60% it can have by 5%" in str(e)
    assert books(svc, kmod) == before
    assert resize(svc, "c1", memory="6Gi", core="60")[1]  # exactly the free room
    assert resize(svc, "c1", memory="1Gi", core="5")[1]
    assert svc.ledger.usage[0].memory_bytes == 11 * GiB


def test_a_shrink_below_what_the_processes_hold_names_the_amount_held():
    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="2Gi")
    kmod.held["c1", 0] = 1536 * MiB
    before = books(svc, kmod)
    e = refused(svc, "c1", memory="1Gi")
    assert e.reason == "capacity"
    assert "its processes hold 1536Mi on GPU 0; it cannot shrink below that" in str(e)
    assert "(asked 1024Mi)" in str(e)
    assert books(svc, kmod) == before
    assert resize(svc, "c1", memory="1536Mi")[1]


def test_a_multi_gpu_share_changes_on_all_its_gpus_or_none():
    svc, kmod = service()
    create(svc, "c1", gpu_memory="2Gi", gpu_count="2")
    kmod.held["c1", 1] = 3 * GiB // 2
    before = books(svc, kmod)
    e = refused(svc, "c1", memory="1Gi")
    assert "hold 1536Mi on GPU 1" in str(e)
    # GPU 0 was changed first, then (with GPU 1, in reverse) changed back when GPU 1 refused.
    updates = [arg for m, arg in kmod.calls if m == "update_quota"]
    assert [(q.gpu_index, q.memory_bytes) for _, q in updates] == [
        (0, GiB),
        (1, GiB),
        (1, 2 * GiB),
        (0, 2 * GiB),
    ]
    assert books(svc, kmod) == before


def test_the_module_refusing_room_the_daemon_does_not_see_rolls_back_the_other_gpus():
    svc, kmod = service()
    create(svc, "c1", gpu_memory="2Gi", gpu_count="2")
    # Memory the module counts and the daemon does not (orphaned by a deleted container).
    kmod.regs["orphan"] = Registration("orphan", (GpuQuota(1, 13 * GiB, 0),))
    before = books(svc, kmod)
    e = refused(svc, "c1", memory="4Gi")
    assert e.reason == "capacity" and "kernel module has no room" in str(e)
    assert books(svc, kmod) == before


# -- refusals of principle ---------------------------------------------------------------------


def test_a_share_the_kubelet_accounted_keeps_its_memory_and_core_but_may_change_priority():
    svc, kmod = service()
    c = ContainerInfo(
        id="k1",
        name="main",
        pod_name="p",
        pod_namespace="ns",
        pod_uid="u",
        annotations={KUBELET_ANNOTATIONS[MEMORY]: "0-1"},
    )
    done(svc.lifecycle.create_container(c))
    before = books(svc, kmod)
    e = refused(svc, "k1", memory="4Gi")
    assert e.reason == "forbidden"
    assert "resources.limits (gpushare.io/gpu-memory)" in str(e)
    assert "recreating it with new resources.limits" in str(e)
    assert "in-place pod resize does not cover extended resources" in str(e)
    assert books(svc, kmod) == before
    assert resize(svc, "k1", priority="high")[0].priority == "high"


@pytest.mark.parametrize("mode", ["off", "optional-unloaded"])
def test_without_the_module_nothing_changes_live_and_the_refusal_says_so(mode):
    if mode == "off":
        svc, kmod = service(kmod_mode="off")
    else:
        svc, kmod = service(kmod=FakeKernelModule(loaded=False))
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    before = books(svc, kmod)
    for ask in ({"memory": "2Gi"}, {"core": "40"}, {"priority": "high"}):
        e = refused(svc, "c1", **ask)
        assert e.reason == "kmod"
        assert "runs standalone" in str(e) and "GPUSHARE_MEMORY_LIMIT" in str(e)
        assert "cannot change while it runs; nothing was changed" in str(e)
        assert books(svc, kmod) == before
    # What could never fit is said first: room is checked before the module.
    assert refused(svc, "c1", memory="99Gi").reason == "capacity"
    assert books(svc, kmod) == before


def test_isolation_none_is_never_resized_live():
    svc, kmod = service()
    create(svc, "c1", gpu_memory="1Gi", isolation="none")
    e = refused(svc, "c1", memory="2Gi")
    assert e.reason == "kmod" and "isolation none" in str(e)


# -- recorded: a restart rebuilds the resized share ----------------------------------------------


def live(c, plan):
    return ContainerInfo(
        id=c.id,
        name=c.name,
        pod_name=c.pod_name,
        pod_namespace=c.pod_namespace,
        pod_uid=c.pod_uid,
        pod_annotations=c.pod_annotations,
        annotations={**c.annotations, **plan.annotations},
        cgroups_path=c.cgroups_path,
    )


@pytest.mark.parametrize("module_kept", [True, False])
def test_a_restart_rebuilds_the_resized_share_not_the_first_one(module_kept):
    store = MemoryStore()
    svc, kmod = service(store=store)
    c, plan = create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    resized, _ = resize(svc, "c1", memory="3Gi", core="50")
    # A new daemon: with the module's registry, or after a module reload (records only).
    kmod2 = kmod if module_kept else FakeKernelModule()
    svc2, _ = service(kmod=kmod2, store=store)
    done(svc2.recovery.synchronize([live(c, plan)]))
    assert svc2.allocations["c1"].shares == resized.shares
    assert svc2.allocations["c1"].assigned == plan.annotations[P + "assigned"]
    assert quota(kmod2, "c1", resized.shares[0].index).memory_bytes == 3 * GiB
    assert svc2.ledger.usage[resized.shares[0].index].memory_bytes == 3 * GiB
    # And again: the snapshot written at Synchronize keeps it too.
    svc3, _ = service(kmod=FakeKernelModule(), store=store)
    done(svc3.recovery.synchronize([live(c, plan)]))
    assert svc3.allocations["c1"].shares == resized.shares


def test_a_record_not_matching_what_the_container_carries_is_still_ignored():
    store = MemoryStore()
    svc, _ = service(store=store)
    c, plan = create(svc, "c1", gpu_memory="1Gi")
    resize(svc, "c1", memory="3Gi")
    svc2, _ = service(kmod=FakeKernelModule(), store=store)
    forged = ContainerInfo(
        id="c1",
        name="main",
        pod_name="pod-c1",
        pod_namespace="ns",
        pod_uid="uid-c1",
        annotations={P + "assigned": '{"gpus":[]}'},
    )
    done(svc2.recovery.synchronize([forged]))
    assert "c1" not in svc2.allocations


def test_the_journal_line_and_the_decision_line(caplog):
    svc, _ = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    with caplog.at_level(logging.INFO, logger="nri_gpushare.decisions"):
        resize(svc, "c1", memory="2Gi", core="40")
        refused(svc, "c1", memory="99Gi")
    last = json.loads(svc.store.load().splitlines()[-1])["add"]
    assert last["gpus"][0]["memory"] == 2 * GiB and last["gpus"][0]["core"] == 40
    assert "assigned" in last
    assert records.decode(svc.store.load(), svc.gpus)["c1"] == svc.allocations["c1"]
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        ln.startswith("decision=resized container=c1 pod=ns/pod-c1 name=main")
        and "memory=2048Mi core=40" in ln
        and "was_memory=1024Mi was_core=30 was_priority=normal" in ln
        for ln in lines
    ), lines
    assert any(
        ln.startswith("decision=refused container=c1") and "operation=resize reason=capacity" in ln
        for ln in lines
    ), lines
    assert svc.decisions.counts["resized"] == 1


def test_a_journal_that_cannot_be_written_undoes_the_resize():
    class Full(MemoryStore):
        def append(self, text):
            raise OSError(28, "No space left on device")

    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi")
    svc.journal.store = Full(svc.store.load())
    before = books(svc, kmod)
    e = refused(svc, "c1", memory="2Gi")
    assert e.reason == "state" and "it was undone" in str(e)
    assert books(svc, kmod) == before


# -- while the module answers --------------------------------------------------------------------


async def test_a_second_resize_or_a_release_while_the_module_answers(caplog):
    import asyncio

    kmod = FakeKernelModule()
    gated = Gated(kmod)
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), gated, FakeDevices())
    await svc.start()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi"}))
    first = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="4Gi")))
    await asyncio.sleep(0)
    assert svc.ledger.usage[0].memory_bytes == 4 * GiB  # held while the module answers
    with pytest.raises(ShareRefused, match="being created or resized"):
        await svc.resizer.resize("c1", ResizeAsk(memory="2Gi"))
    assert await svc.lifecycle.release("c1")  # stopped meanwhile
    gated.gate.set()
    with pytest.raises(ShareRefused, match="released, or the table rebuilt"):
        await first
    assert svc.allocations == {} and svc.ledger.usage[0].memory_bytes == 0
    assert kmod.regs == {}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # nothing to undo
