"""Attack (fixed: Synchronize now waits for the resizes in flight before it
reads the registry): NRI's Synchronize (containerd
restarted, the plugin registering again) rebuilds the table from the
module's registry while a multi-GPU resize is being written.  On the
module's real worker (one thread, requests in order) the registry is read
between GPU 0's write and GPU 1's: the rebuilt table holds GPU 0 resized and
GPU 1 as it was; the resize then writes GPU 1, sees the table rebuilt
(`Resizer._gone`) and answers "refused" without changing anything back.
The module holds 2Gi on GPU 1, the daemon's ledger 1Gi."""

import asyncio

from nri_gpushare.share.model import NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, make_gpus
from tests.unit.test_resize import P, live, pod


async def test_a_resize_racing_a_synchronize_leaves_the_table_as_the_module_holds_it():
    """On the module's real worker (one thread, in order): a Synchronize
    that reads the registry while a two-GPU resize is being written.  The
    table it rebuilds follows the module; the resize is answered as refused
    ("the table rebuilt"): what the module then holds is what the table
    says, whatever the interleaving."""
    import threading

    from nri_gpushare.host.kmod_worker import OffLoopKernelModule

    class Slow(FakeKernelModule):
        def update_quota(self, container_id, quota):
            threading.Event().wait(0.02)
            super().update_quota(container_id, quota)

    fake = Slow()
    kmod = OffLoopKernelModule(fake, timeout=2.0)
    try:
        store = MemoryStore()
        svc = ShareService(make_gpus(2, 16 * GiB), NodePolicy(), kmod, FakeDevices(), store)
        await svc.start()
        c = pod("c1", {P + "gpu-memory": "1Gi", P + "gpu-count": "2"})
        plan = await svc.lifecycle.create_container(c)
        grow = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="2Gi")))
        await asyncio.sleep(0)
        await svc.recovery.synchronize([live(c, plan)])
        try:
            await grow
        except ShareRefused as e:
            assert "table rebuilt" in str(e)
        await kmod.loaded()
        module = {q.gpu_index: q.memory_bytes for q in fake.regs["c1"].quotas}
        table = {s.index: s.memory_bytes for s in svc.allocations["c1"].shares}
        assert module == table
        assert {i: u.memory_bytes for i, u in svc.ledger.usage.items()} == table
    finally:
        kmod.close()
