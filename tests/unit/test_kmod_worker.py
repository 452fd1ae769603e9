"""The kernel module off the event loop: one worker thread, a timeout per
request, order kept, and a stuck module failing requests at once."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.share.kernel import GpuDeclaration, GpuQuota, KmodError, Registration
from tests.fakes import FakeKernelModule

GiB = 1 << 30


class Hangs(FakeKernelModule):
    """Registering `hang_on` blocks (up to 2 s, until `release` is set) and
    then lands, like a kernel that answers late."""

    def __init__(self, hang_on: str) -> None:
        super().__init__()
        self.hang_on = hang_on
        self.release = threading.Event()
        self.hanging = threading.Event()  # set once the register is blocked
        self.in_register = False
        self.declare_gpus([GpuDeclaration(0, 16 * GiB)])

    def register(self, registration: Registration) -> None:
        if registration.container_id == self.hang_on:
            self.in_register = True
            self.hanging.set()
            self.release.wait(2.0)
            self.in_register = False
        super().register(registration)


def reg(cid: str) -> Registration:
    return Registration(cid, (GpuQuota(0, GiB, 0),))


async def settled(worker: OffLoopKernelModule) -> None:
    """Until the worker has caught up (nothing stuck), then one more request."""
    for _ in range(500):
        if worker.stuck_for() is None:
            break
        await asyncio.sleep(0.01)
    await worker.loaded()


async def test_a_stuck_module_fails_the_request_instead_of_blocking(tmp_path: Path) -> None:
    """Writing to a FIFO with no reader blocks in open(2), like a stuck kernel would."""
    fifo = tmp_path / "inst_ctl"
    os.mkfifo(fifo)
    worker = OffLoopKernelModule(ProcfsKernelModule(tmp_path), timeout=0.2)
    try:
        with pytest.raises(KmodError) as e:
            await worker.unregister("a")
        assert e.value.errno == errno.ETIMEDOUT
        assert "did not answer within 0.2 s (unregistering container a)" in str(e.value)
        # Stuck now: the next request is not even queued behind it.
        with pytest.raises(KmodError, match="has not answered for .* s") as e:
            await worker.register(reg("b"))
        assert e.value.errno == errno.ETIMEDOUT
        assert "registering container b" in str(e.value)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the access finish
        worker.close()


async def test_a_registration_that_lands_late_is_undone_in_order() -> None:
    kmod = Hangs("a")
    worker = OffLoopKernelModule(kmod, timeout=0.2)
    with pytest.raises(KmodError, match="did not answer within 0.2 s"):
        await worker.register(reg("a"))
    assert kmod.in_register and "a" not in kmod.regs
    # The undo is queued behind the registration, even though it cannot wait for it.
    with pytest.raises(KmodError, match="will run when it does"):
        await worker.unregister("a")
    kmod.release.set()
    await settled(worker)
    assert kmod.regs == {}
    assert [c[0] for c in kmod.calls] == ["declare_gpus", "register", "unregister"]
    worker.close()


async def test_a_quota_change_asked_while_stuck_still_runs_in_order() -> None:
    """A resize's change back is queued behind the stuck request, like an
    unregistration, and so lands after the change it undoes."""
    kmod = Hangs("a")
    worker = OffLoopKernelModule(kmod, timeout=0.2)
    with pytest.raises(KmodError, match="did not answer within 0.2 s"):
        await worker.register(reg("a"))
    with pytest.raises(KmodError, match="will run when it does"):
        await worker.update_quota("a", GpuQuota(0, 2 * GiB, 0))
    kmod.release.set()
    await settled(worker)
    assert kmod.regs["a"].quotas == (GpuQuota(0, 2 * GiB, 0),)
    assert not await worker.upgrading()  # the fake's freeze is off
    worker.close()


async def test_a_request_given_up_before_it_started_never_runs() -> None:
    kmod = Hangs("a")
    worker = OffLoopKernelModule(kmod, timeout=0.2)
    first = asyncio.create_task(worker.register(reg("a")))
    await asyncio.to_thread(kmod.hanging.wait, 5)
    with pytest.raises(KmodError, match="register.* was not attempted|not asked"):
        await worker.register(reg("b"))
    with pytest.raises(KmodError):
        await first
    kmod.release.set()
    await settled(worker)
    assert set(kmod.regs) == {"a"}  # landed late: undoing it is the caller's part
    worker.close()


async def test_answers_pass_through() -> None:
    kmod = FakeKernelModule()
    worker = OffLoopKernelModule(kmod)
    assert await worker.loaded() is True
    await worker.declare_gpus([GpuDeclaration(0, 16 * GiB)])
    await worker.register(reg("a"))
    await worker.bind_cgroup("a", "/k8s.io/a")
    assert await worker.registrations() == [reg("a")]
    with pytest.raises(KmodError, match="already registered"):
        await worker.register(reg("a"))
    await worker.unregister("a")
    assert kmod.regs == {} and kmod.cgroups == {}
    worker.close()


async def test_a_request_whose_caller_was_cancelled_never_runs() -> None:
    # The runtime closed the connection while a CreateContainer waited its turn:
    # its registration must not reach the module later, unasked for.
    kmod = Hangs("a")
    worker = OffLoopKernelModule(kmod, timeout=5)
    first = asyncio.create_task(worker.register(reg("a")))
    await asyncio.to_thread(kmod.hanging.wait, 5)
    queued = asyncio.create_task(worker.register(reg("b")))
    undo = asyncio.create_task(worker.unregister("c"))
    await asyncio.sleep(0)  # both are queued behind "a"
    queued.cancel()
    undo.cancel()
    for task in (queued, undo):
        with pytest.raises(asyncio.CancelledError):
            await task
    kmod.release.set()
    await first
    await settled(worker)
    assert set(kmod.regs) == {"a"}
    # The unregistration still ran: undoing is never dropped.
    assert [c for c in kmod.calls if c[0] != "loaded"][1:] == [
        ("register", reg("a")),
        ("unregister", "c"),
    ]
    worker.close()
