"""The one worker for blocking calls (nri_gpushare.host.worker): its own
errors, under the kernel module's rules (`strict`) and as the NVML and
meminfo readers have it; the kernel module's adapter over it is tested in
test_kmod_worker.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nri_gpushare.host.worker import BlockingWorker, WorkerStuck, WorkerTimeout


async def test_a_hung_call_times_out_then_fails_the_next_at_once() -> None:
    release = threading.Event()
    worker = BlockingWorker("test-nvml", timeout=0.1, strict=True)
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


@pytest.mark.parametrize(("strict", "runs"), [(True, ["after"]), (False, ["queued", "after"])])
async def test_a_cancelled_callers_call_runs_unless_strict(strict: bool, runs: list[str]) -> None:
    """Strict (the kernel module's), a cancelled caller's unstarted call is
    dropped; otherwise it still runs, as before the one worker: a
    StartContainer whose caller went away still sets the driver's memory
    limit it had asked for."""
    release, ran = threading.Event(), []
    worker = BlockingWorker("test", timeout=5, strict=strict)
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
    assert ran == runs
    worker.close()


@pytest.mark.parametrize("strict", [False, True])
async def test_a_caller_giving_up_makes_it_stuck_only_when_strict(strict: bool) -> None:
    release = threading.Event()
    # A timeout no loaded machine reaches: only the caller giving up counts here.
    worker = BlockingWorker("test", timeout=30.0, strict=strict)
    try:
        call = asyncio.create_task(worker.call(lambda: release.wait(2.0), "hang"))
        await asyncio.sleep(0.05)
        worker._overdue = worker._current  # its caller gave up on it (as a timeout does)
        assert (worker.stuck_for() is not None) is strict
        release.set()
        assert await call is True
    finally:
        release.set()
        worker.close()
