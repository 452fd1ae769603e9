"""Attack: a resize that lands while StartContainer sets the driver's memory
limits.  The review found it left the running container with no driver
limit at all: `Lifecycle.start_container` cleared the limits when
`table.allocations[cid]` was no longer the allocation it started with, and
a resize replaces the allocation object, so the check read the resize as a
release (and the resize itself skipped the limits: `limits.applied` was not
set yet).  Now a release is `cid not in allocations`, and a resize meanwhile
gets its new limits."""

import asyncio
import logging

from nri_gpushare.share.model import NodePolicy
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, make_gpus
from tests.unit.test_nvml_limits import FakeLimits
from tests.unit.test_resize import P, pod


class SlowLimits(FakeLimits):
    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()

    async def set_limit(self, gpu, cgroups_path, hard_bytes):
        await self.gate.wait()
        await super().set_limit(gpu, cgroups_path, hard_bytes)


async def test_a_resize_during_start_container_leaves_the_container_without_a_driver_limit():
    limits = SlowLimits()
    svc = ShareService(
        make_gpus(1, 16 * GiB),
        NodePolicy(),
        Inline(FakeKernelModule()),
        FakeDevices(),
        limits=limits,
    )
    await svc.start()
    c = pod("c1", {P + "gpu-memory": "1Gi"})
    await svc.lifecycle.create_container(c)
    start = asyncio.create_task(svc.lifecycle.start_container(c))
    await asyncio.sleep(0)  # StartContainer waits for NVML
    alloc, changed = await svc.resizer.resize("c1", ResizeAsk(memory="2Gi"))
    assert changed
    limits.gate.set()
    await start
    assert limits.set == {(0, "/k8s/c1"): 2 * GiB}, f"driver limits now: {limits.set}"


async def test_a_release_during_the_resizes_limits_leaves_none_and_logs_resized_first(caplog):
    limits = SlowLimits()
    limits.gate.set()
    svc = ShareService(
        make_gpus(1, 16 * GiB),
        NodePolicy(),
        Inline(FakeKernelModule()),
        FakeDevices(),
        limits=limits,
    )
    await svc.start()
    c = pod("c1", {P + "gpu-memory": "1Gi"})
    await svc.lifecycle.create_container(c)
    await svc.lifecycle.start_container(c)
    limits.gate.clear()
    caplog.set_level(logging.INFO, "nri_gpushare.decisions")
    grow = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="2Gi")))
    await asyncio.sleep(0)  # the resize waits for NVML
    await svc.lifecycle.release("c1")
    limits.gate.set()
    _, changed = await grow
    assert changed  # the module and the records took it before the release
    assert limits.set == {} and svc.limits.applied == {}
    decisions = [r.decision for r in caplog.records if hasattr(r, "decision")]
    assert decisions[-2:] == ["resized", "released"]
