"""Attack: the journal is compacted (every `COMPACT_AFTER` changes, a
snapshot of `table.allocations`) while a resize waits for the module.  The
review found the table already held the resize's new share then, so the
snapshot recorded a share the module then refused (and after a restart
without the module's registry the records win).  The table now keeps the
old share until the module says yes."""

import asyncio

import pytest

from nri_gpushare.share import records
from nri_gpushare.share.model import NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, Gated, GiB, make_gpus
from tests.unit.test_resize import P, pod


async def test_a_compaction_during_a_refused_resize_records_the_refused_share():
    kmod = FakeKernelModule()
    gated = Gated(kmod)
    store = MemoryStore()
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), gated, FakeDevices(), store)
    await svc.start()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    kmod.held["c1", 0] = 3 * GiB
    svc.journal.changes = records.COMPACT_AFTER  # the next append compacts
    shrink = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="1Gi")))
    await asyncio.sleep(0)
    await svc.lifecycle.create_container(pod("c2", {P + "gpu-memory": "1Gi"}))
    gated.gate.set()
    with pytest.raises(ShareRefused, match="hold 3072Mi"):
        await shrink
    recorded = records.decode(store.load(), svc.gpus)["c1"].shares[0].memory_bytes
    assert recorded == 4 * GiB, f"the records say {recorded >> 20}Mi after a refused shrink"
