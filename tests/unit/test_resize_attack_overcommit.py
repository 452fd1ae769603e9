"""Attack: a shrink that the module refuses, raced by a placement that would
take the room the shrink frees while the module answers.

The review found `Resizer._resize` put the *new* (smaller) share in the
ledger before the module was asked, so a create (or another resize) placed
meanwhile took the room freed, and the refusal put the *old* share back
without a check: the GPU held more than its capacity.  Now the ledger books
the larger of the two until the module answers: the racing placement is
refused, and the ledger never goes over capacity."""

import asyncio

import pytest

from nri_gpushare.share.model import NodePolicy, ShareRefused
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, Gated, GiB, make_gpus
from tests.unit.test_resize import P, pod


def over(svc):
    return {
        i: (u.memory_bytes, svc.ledger.capacity(i))
        for i, u in svc.ledger.usage.items()
        if u.memory_bytes > svc.ledger.capacity(i) or u.core_percent > 100
    }


async def _svc(**policy):
    kmod = FakeKernelModule()
    gated = Gated(kmod)
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(**policy), gated, FakeDevices())
    await svc.start()
    return svc, kmod, gated


async def test_a_refused_shrink_raced_by_an_unregistered_create_over_commits_the_ledger():
    """isolation none is never registered, so the module cannot catch it."""
    svc, kmod, gated = await _svc()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    kmod.held["c1", 0] = 2 * GiB  # the shrink will be EBUSY
    shrink = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="1Gi")))
    await asyncio.sleep(0)
    # The 3Gi the shrink would free is not free until the module says yes.
    with pytest.raises(ShareRefused) as e:
        await svc.lifecycle.create_container(
            pod("c2", {P + "gpu-memory": "15Gi", P + "isolation": "none"})
        )
    assert e.value.reason == "capacity"
    gated.gate.set()
    with pytest.raises(ShareRefused, match="hold 2048Mi"):
        await shrink
    assert over(svc) == {}, f"ledger over capacity: {over(svc)} ({svc.allocations})"


async def test_a_refused_shrink_raced_by_a_create_over_commits_the_nodes_reserve():
    """With memory_reserve the module (declared the GPUs' whole memory) has
    room the ledger does not: only the ledger can keep the reserve."""
    svc, kmod, gated = await _svc(memory_reserve_bytes=1 * GiB)
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    await svc.lifecycle.create_container(pod("c0", {P + "gpu-memory": "11Gi"}))  # 15Gi: full
    kmod.held["c1", 0] = 4 * GiB
    shrink = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="3Gi")))
    await asyncio.sleep(0)
    with pytest.raises(ShareRefused) as e:
        await svc.lifecycle.create_container(pod("c2", {P + "gpu-memory": "1Gi"}))
    assert e.value.reason == "capacity"
    gated.gate.set()
    with pytest.raises(ShareRefused, match="hold 4096Mi"):
        await shrink
    assert over(svc) == {}, f"ledger over capacity: {over(svc)}"


async def test_a_refused_shrink_raced_by_another_resize_over_commits_the_reserve():
    svc, kmod, gated = await _svc(memory_reserve_bytes=1 * GiB)
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    await svc.lifecycle.create_container(pod("c2", {P + "gpu-memory": "11Gi"}))
    kmod.held["c1", 0] = 4 * GiB
    shrink = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="3Gi")))
    await asyncio.sleep(0)
    # The module (16Gi declared) would have room for 4 + 12: the ledger keeps the reserve.
    with pytest.raises(ShareRefused) as e:
        await svc.resizer.resize("c2", ResizeAsk(memory="12Gi"))
    assert e.value.reason == "capacity"
    gated.gate.set()
    with pytest.raises(ShareRefused, match="hold 4096Mi"):
        await shrink
    assert over(svc) == {}, f"ledger over capacity: {over(svc)}"
    assert svc.ledger.usage[0].memory_bytes == 15 * GiB  # 4 + 11: as before


async def test_a_shrink_the_module_takes_frees_its_room_then():
    svc, kmod, gated = await _svc()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    shrink = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="1Gi")))
    await asyncio.sleep(0)
    assert svc.ledger.usage[0].memory_bytes == 4 * GiB  # booked: the larger
    assert svc.allocations["c1"].shares[0].memory_bytes == 4 * GiB  # the table: the old
    gated.gate.set()
    alloc, changed = await shrink
    assert changed and svc.ledger.usage[0].memory_bytes == GiB
    assert svc.allocations["c1"] is alloc and not svc.booked


async def test_a_release_while_the_module_answers_frees_what_was_booked():
    svc, kmod, gated = await _svc()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi"}))
    grow = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="4Gi")))
    await asyncio.sleep(0)
    assert svc.ledger.usage[0].memory_bytes == 4 * GiB
    await svc.lifecycle.release("c1")
    assert svc.ledger.usage[0].memory_bytes == 0
    gated.gate.set()
    with pytest.raises(ShareRefused, match="released"):
        await grow
    assert svc.ledger.usage[0].memory_bytes == 0 and not svc.booked
