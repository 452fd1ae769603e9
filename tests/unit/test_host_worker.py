"""The one worker for blocking calls (nri_gpushare.host.worker): its own
errors, as the NVML and meminfo readers see them; the kernel module's
adapter over it is tested in test_kmod_worker.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nri_gpushare.host.worker import BlockingWorker, WorkerStuck, WorkerTimeout


async def test_a_hung_call_times_out_then_fails_the_next_at_once() -> None:
    release = threading.Event()
    worker = BlockingWorker("test-nvml", timeout=0.1)
    try:
        with pytest.raises(WorkerTimeout, match=r"test-nvml did not answer within 0\.1 s \(hang\)"):
            await worker.call(lambda: release.wait(2.0), "hang")
        with pytest.raises(WorkerStuck, match="has not answered for .* s; next was not attempted"):
            await worker.call(lambda: 1, "next")
        with pytest.raises(WorkerStuck, match="undo will run when it does") as e:
            await worker.call(lambda: 2, "undo", must_run=True)
        assert e.value.queued and e.value.running == "hang"
    finally:
        release.set()
        worker.close()


async def test_a_cancelled_callers_call_never_runs() -> None:
    release, ran = threading.Event(), []
    worker = BlockingWorker("test-nvml", timeout=5)
    first = asyncio.create_task(worker.call(lambda: release.wait(2.0), "first"))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(worker.call(lambda: ran.append("queued"), "queued"))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    assert await first is True
    assert await worker.call(lambda: ran.append("after") or 3, "after") == 3
    assert ran == ["after"]
    worker.close()
