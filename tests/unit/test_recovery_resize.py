"""Recovery after a resize the daemon did not finish: which side wins
(`records.module_wins`), registrations written in place (`KernelLink.keep`),
and a Synchronize that waits for the resizes in flight."""

import asyncio
import logging

from nri_gpushare.share import records, recovery
from nri_gpushare.share.kernel import GpuQuota, Registration
from nri_gpushare.share.kmod_link import KernelLink
from nri_gpushare.share.model import Allocation, ContainerInfo, GpuShare, NodePolicy
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus
from tests.unit.test_resize import P, create, live, pod, service

GPUS = make_gpus(2, 16 * GiB)
C = ContainerInfo(id="c1", name="main")


def record(**kw):
    shares = tuple(GpuShare(g.index, g.uuid, GiB, 30) for g in GPUS)
    return Allocation("c1", "main", "", shares, **kw)


def registration(*quotas):
    return Registration("c1", tuple(GpuQuota(*q) for q in quotas))


def test_the_module_wins_its_numbers_and_the_record_the_rest():
    rec = record(isolation="memory", interposer=True, origin="runc", namespace="ns")
    got = records.module_wins(
        C, rec, registration((1, 3 * GiB, 0, True), (0, 2 * GiB, 0, True)), GPUS
    )
    assert [(s.index, s.memory_bytes, s.core_percent) for s in got.shares] == [
        (0, 2 * GiB, 30),  # the record's GPU order; no compute limit: the record's core
        (1, 3 * GiB, 30),
    ]
    assert got.priority == "high"
    assert (got.isolation, got.interposer, got.origin, got.namespace) == (
        "memory",
        True,
        "runc",
        "ns",
    )
    assert got.assigned == records.created_with(rec)  # what the container was created with


def test_gpus_that_disagree_on_priority_give_the_recorded_one():
    got = records.module_wins(
        C, record(), registration((0, 2 * GiB, 50, True), (1, GiB, 30, False)), GPUS
    )
    assert got.priority == "normal"
    assert [(s.memory_bytes, s.core_percent) for s in got.shares] == [(2 * GiB, 50), (GiB, 30)]
    alone = records.from_registration(C, registration((0, GiB, 0, True), (1, GiB, 0, False)), GPUS)
    assert alone is not None and alone.priority == "normal"


def test_a_share_with_isolation_none_keeps_its_record():
    rec = record(isolation="none")
    assert records.module_wins(C, rec, registration((0, 2 * GiB, 0)), GPUS) is rec


async def test_keep_writes_a_differing_registration_in_place():
    kmod = FakeKernelModule()
    link = KernelLink(GPUS, "required", Inline(kmod))
    alloc = record()
    await link.register(alloc, "c1")
    kmod.update_quota("c1", GpuQuota(1, 2 * GiB, 30, True))
    kmod.calls.clear()
    assert await link.keep(alloc, kmod.regs["c1"])
    assert [m for m, _ in kmod.calls] == ["update_quota"]
    assert kmod.regs["c1"].quotas[1] == GpuQuota(1, GiB, 30, False)
    assert "c1" in link.registered


async def test_keep_gives_up_a_registration_of_other_gpus_or_one_gone():
    kmod = FakeKernelModule()
    link = KernelLink(GPUS, "required", Inline(kmod))
    await link.ready()
    kmod.register(registration((1, GiB, 30)))
    one_gpu = Allocation("c1", "main", "", (GpuShare(0, GPUS[0].uuid, GiB, 30),))
    assert not await link.keep(one_gpu, kmod.regs["c1"])
    assert "c1" not in kmod.regs and "c1" not in link.registered
    stale = registration((0, 2 * GiB, 30))  # read before the container went
    assert not await link.keep(one_gpu, stale)


async def test_a_kill_after_a_memory_resize_of_a_hand_started_container_keeps_the_modules():
    from nri_gpushare.daemon.local_api import LocalApiHandler
    from tests.unit.test_local_api import Labels, make
    from tests.unit.test_local_api import create as local_create

    store = MemoryStore()
    svc, kmod = await make(store=store)
    labels = Labels({("default", "c1"): {"gpushare.io/gpu-memory": "1Gi"}})
    assert (await LocalApiHandler(svc, labels)(local_create())).ok
    q = kmod.regs["c1"].quotas[0]
    kmod.update_quota("c1", GpuQuota(q.gpu_index, 3 * GiB, q.core_percent, False))  # killed
    kmod.calls.clear()
    again, _ = await make(kmod=kmod, store=store)
    await again.recovery.recover_local()
    alloc = again.allocations["c1"]
    assert (alloc.origin, alloc.namespace, alloc.shares[0].memory_bytes) == (
        "runc",
        "default",
        3 * GiB,
    )
    assert [m for m, _ in kmod.calls if m in ("register", "unregister", "update_quota")] == []
    assert again.ledger.usage[q.gpu_index].memory_bytes == 3 * GiB


async def test_synchronize_reads_the_module_once_the_resize_is_done():
    """On the module's real worker: the resize is answered, and Synchronize
    rebuilds the table from its result."""
    from nri_gpushare.host.kmod_worker import OffLoopKernelModule

    kmod = OffLoopKernelModule(FakeKernelModule(), timeout=2.0)
    try:
        svc = ShareService(make_gpus(2, 16 * GiB), NodePolicy(), kmod, FakeDevices(), MemoryStore())
        await svc.start()
        c = pod("c1", {P + "gpu-memory": "1Gi", P + "gpu-count": "2"})
        plan = await svc.lifecycle.create_container(c)
        grow = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="2Gi")))
        await asyncio.sleep(0)
        await svc.recovery.synchronize([live(c, plan)])
        assert grow.done()
        alloc, changed = grow.result()
        assert changed and svc.allocations["c1"] == alloc
        assert [s.memory_bytes for s in alloc.shares] == [2 * GiB, 2 * GiB]
    finally:
        kmod.close()


def test_synchronize_waits_for_a_resize_a_bounded_time(monkeypatch, caplog):
    monkeypatch.setattr(recovery, "RESIZE_WAIT", 0.05)
    svc, kmod = service()
    c, plan = create(svc, "c1", gpu_memory="1Gi")
    svc.resizing.add("c1")  # a resize that never ends

    async def sync():
        await svc.recovery.synchronize([live(c, plan)])

    with caplog.at_level(logging.WARNING):
        asyncio.run(sync())
    assert "resizes still in flight" in caplog.text
    assert svc.allocations["c1"].shares[0].memory_bytes == GiB


def test_synchronize_without_a_resize_in_flight_does_not_wait():
    svc, kmod = service()
    c, plan = create(svc, "c1", gpu_memory="1Gi")
    done(svc.recovery.synchronize([live(c, plan)]))  # completes without a turn of the loop
    assert "c1" in svc.allocations
