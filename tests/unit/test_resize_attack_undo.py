"""Attack: a resize whose change the module cannot undo.

The review found a memsize write that timed out on the module's worker
landed later, after the daemon told the operator "nothing was changed" and
put the old share back in its ledger (the undo was not attempted: the
worker was stuck and quota changes were not must_run), and an upgrade
freezing the module between two GPUs left GPU 0 resized.  Now quota changes
always run (the undo lands after what it undoes), a failed undo is answered
"may have been applied", the larger of both stays booked and no other
resize of it is taken, and `Resizer.settle` reads the module again and
settles the books on what it holds."""

import asyncio
import errno
import threading

import pytest

from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.share.model import NodePolicy, ShareRefused
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, done, make_gpus
from tests.unit.test_resize import P, create, pod, refused, service


async def refused_now(svc, ref):
    with pytest.raises(ShareRefused) as e:
        await svc.resizer.resize(ref, ResizeAsk(memory="2Gi"))
    return e.value


class SlowModule(FakeKernelModule):
    def __init__(self):
        super().__init__()
        self.stall = threading.Event()
        self.release = threading.Event()

    def update_quota(self, container_id, quota):
        if self.stall.is_set():
            self.stall.clear()
            self.release.wait(5)
        super().update_quota(container_id, quota)


async def test_a_timed_out_grow_that_lands_later_leaves_module_and_ledger_disagreeing():
    fake = SlowModule()
    kmod = OffLoopKernelModule(fake, timeout=0.05)
    try:
        svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), kmod, FakeDevices())
        await svc.start()
        await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi"}))
        fake.stall.set()
        with pytest.raises(ShareRefused, match="may have been applied") as e:
            await svc.resizer.resize("c1", ResizeAsk(memory="8Gi"))
        assert "nothing was changed" not in str(e.value)
        assert svc.ledger.usage[0].memory_bytes == 8 * GiB  # the larger, until settled
        assert (await refused_now(svc, "c1")).reason == "conflict"
        await svc.resizer.settle()  # the module is not answering yet: nothing settled
        assert "c1" in svc.resizer.unsettled
        fake.release.set()
        await asyncio.sleep(0.2)  # the stuck write finishes, then the change back
        await kmod.loaded()  # anything queued behind it ran
        await svc.resizer.settle()
        module = fake.regs["c1"].quotas[0].memory_bytes
        books = svc.allocations["c1"].shares[0].memory_bytes
        assert module == books == GiB, f"module {module >> 20}Mi, the daemon {books >> 20}Mi"
        assert svc.ledger.usage[0].memory_bytes == GiB and not svc.resizer.unsettled
        alloc, changed = await svc.resizer.resize("c1", ResizeAsk(memory="2Gi"))
        assert changed and fake.regs["c1"].quotas[0].memory_bytes == 2 * GiB
    finally:
        kmod.close()


class FreezesAfterGpu0(FakeKernelModule):
    """`nri-gpushare kmod-upgrade` exports (freezes) the module right after
    GPU 0's files were written: every later write is EBUSY (the upgrade)."""

    frozen = False

    def update_quota(self, container_id, quota):
        from nri_gpushare.share.kernel import UpgradeInProgress

        if self.frozen:
            raise UpgradeInProgress("gpushare.ko is being upgraded")
        super().update_quota(container_id, quota)
        if quota.gpu_index == 0:
            self.frozen = True


def test_an_upgrade_between_the_gpus_of_a_resize_leaves_gpu_0_resized_in_the_module():
    """The export carries GPU 0's new memsize into the next module version:
    the answer says so, the ledger books it, and settle changes it back."""

    svc, kmod = service(kmod=FreezesAfterGpu0())
    create(svc, "c1", gpu_memory="1Gi", gpu_count="2")
    e = refused(svc, "c1", memory="4Gi")
    assert "may have been applied" in str(e) and "nothing was changed" not in str(e)
    module = {q.gpu_index: q.memory_bytes for q in kmod.regs["c1"].quotas}
    booked = {i: u.memory_bytes for i, u in svc.ledger.usage.items()}
    assert all(booked[i] >= m for i, m in module.items()), f"module {module}, ledger {booked}"
    done(svc.resizer.settle())  # still frozen: the change back is refused again
    assert "c1" in svc.resizer.unsettled
    kmod.frozen = False  # the upgrade is done
    done(svc.resizer.settle())
    module = {q.gpu_index: q.memory_bytes for q in kmod.regs["c1"].quotas}
    books = {s.index: s.memory_bytes for s in svc.allocations["c1"].shares}
    booked = {i: u.memory_bytes for i, u in svc.ledger.usage.items()}
    assert module == books == booked == {0: GiB, 1: GiB}, f"module {module}, daemon {books}"


class Upgrading(FakeKernelModule):
    """A module `nri-gpushare kmod-upgrade` has frozen (/proc/gpushare/upgrade)."""

    def upgrading(self):
        return True


async def test_a_resize_is_refused_while_the_module_is_being_upgraded():
    fake = Upgrading()
    kmod = OffLoopKernelModule(fake)
    try:
        svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), kmod, FakeDevices())
        await svc.start()
        await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi"}))
        with pytest.raises(ShareRefused, match="being upgraded.*nothing was changed") as e:
            await svc.resizer.resize("c1", ResizeAsk(memory="2Gi"))
        assert e.value.reason == "kmod"
        assert not [m for m, _ in fake.calls if m == "update_quota"]
    finally:
        kmod.close()


class LandsThenTimesOut(FakeKernelModule):
    """The first write lands and its answer times out; the module then stops
    answering (the change back is not made) until `answering`."""

    answering = True

    def update_quota(self, container_id, quota):
        from nri_gpushare.share.kernel import KmodError

        if not self.answering:
            raise KmodError("gpushare.ko did not answer", errno.ETIMEDOUT)
        super().update_quota(container_id, quota)
        if quota.memory_bytes == 2 * GiB:
            self.answering = False
            raise KmodError("gpushare.ko did not answer", errno.ETIMEDOUT)


def test_a_resize_the_module_took_after_all_is_adopted_at_settle():
    svc, kmod = service(kmod=LandsThenTimesOut(), gpus=1)
    create(svc, "c1", gpu_memory="1Gi")
    assert "may have been applied" in str(refused(svc, "c1", memory="2Gi"))
    assert svc.allocations["c1"].shares[0].memory_bytes == GiB
    kmod.answering = True
    done(svc.resizer.settle())
    assert svc.allocations["c1"].shares[0].memory_bytes == 2 * GiB  # what the module holds
    assert svc.ledger.usage[0].memory_bytes == 2 * GiB and not svc.resizer.unsettled
    assert svc.status()["allocations"][0]["resized"] is True


def test_an_unsettled_resize_of_a_released_container_is_dropped():
    svc, kmod = service(kmod=FreezesAfterGpu0())
    create(svc, "c1", gpu_memory="1Gi", gpu_count="2")
    assert "may have been applied" in str(refused(svc, "c1", memory="4Gi"))
    done(svc.lifecycle.release("c1"))
    assert all(u.memory_bytes == 0 for u in svc.ledger.usage.values())  # the booking freed
    done(svc.resizer.settle())
    assert not svc.resizer.unsettled and not svc.resizing and not svc.booked
