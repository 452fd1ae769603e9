"""The kernel module off the event loop: a blocking `KernelModuleClient` run on
one worker thread, awaited under a timeout.

- One thread, one queue: accesses run one at a time in the order they were
  asked, so an unregistration asked after a registration runs after it, even
  when the registration's caller gave up waiting.
- Each await gives up after `timeout` seconds with `KmodError` (ETIMEDOUT).
  A caller that is cancelled gives up the same way.
  A file access cannot be interrupted: a running one goes on, so a caller
  treats a timed-out request as possibly done (the share domain undoes a
  registration that timed out).  One that had not started yet is dropped,
  except unregistrations, which always run.
- While one access has been running for longer than `timeout`, the module is
  stuck: new requests fail at once instead of each waiting out its timeout
  (unregistrations are still queued), so a stuck kernel costs one
  CreateContainer at most one timeout, far inside containerd's 2 s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nri_gpushare.share.kernel import (
    GpuDeclaration,
    KernelModuleClient,
    KmodError,
    Registration,
)

DEFAULT_TIMEOUT = 0.5  # seconds per access; real ones take microseconds
T = TypeVar("T")

_Job = tuple["concurrent.futures.Future[Any]", Callable[[], Any], str]


class OffLoopKernelModule:
    """`KernelModule` over a blocking client, on one daemon thread."""

    def __init__(self, client: KernelModuleClient, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.client = client
        self.timeout = timeout
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._started: float | None = None  # monotonic start of the running access
        self._running = ""  # what it is doing
        self._current: concurrent.futures.Future[Any] | None = None  # the running access
        self._overdue: concurrent.futures.Future[Any] | None = None  # its caller timed out
        self._thread = threading.Thread(target=self._work, name="gpushare-kmod", daemon=True)
        self._thread.start()

    # -- KernelModule ---------------------------------------------------------------------

    async def loaded(self) -> bool:
        return await self._call(self.client.loaded, "checking whether gpushare.ko is loaded")

    async def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        listed = ", ".join(str(g.index) for g in gpus)
        await self._call(
            lambda: self.client.declare_gpus(gpus), f"declaring GPUs {listed} to gpushare.ko"
        )

    async def register(self, registration: Registration) -> None:
        cid = registration.container_id
        await self._call(lambda: self.client.register(registration), f"registering container {cid}")

    async def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        await self._call(
            lambda: self.client.bind_cgroup(container_id, cgroup_path),
            f"binding container {container_id} to cgroup {cgroup_path}",
        )

    async def unregister(self, container_id: str) -> None:
        await self._call(
            lambda: self.client.unregister(container_id),
            f"unregistering container {container_id}",
            must_run=True,
        )

    async def registrations(self) -> list[Registration]:
        return await self._call(self.client.registrations, "reading gpushare.ko's registry")

    # -- the worker ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker after the accesses already queued."""
        self._jobs.put(None)

    def stuck_for(self) -> float | None:
        """Seconds the running access has taken, when that is more than `timeout`
        (or its caller already gave up on it); None when the module is not stuck."""
        started, current = self._started, self._current
        if started is None or current is None:
            return None
        age = time.monotonic() - started
        return age if age > self.timeout or current is self._overdue else None

    async def _call(self, fn: Callable[[], T], what: str, *, must_run: bool = False) -> T:
        stuck = self.stuck_for()
        if stuck is not None and not must_run:
            raise KmodError(
                f"gpushare.ko has not answered for {stuck:.1f} s ({self._running}), so it was"
                f" not asked ({what}); the kernel may be stuck, see dmesg",
                errno.ETIMEDOUT,
            )
        job: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((job, fn, what))
        if stuck is not None:
            raise KmodError(
                f"gpushare.ko has not answered for {stuck:.1f} s ({self._running}); {what}"
                " will run when it does",
                errno.ETIMEDOUT,
            )
        waiter = asyncio.wrap_future(job)
        try:
            done, _ = await asyncio.wait({waiter}, timeout=self.timeout)
        except asyncio.CancelledError:
            # Our caller went away (the runtime closed the connection): a request
            # that has not started is dropped, like one whose caller timed out.
            waiter.add_done_callback(_ignore_outcome)
            if not must_run:
                job.cancel()
            raise
        if waiter in done:
            return waiter.result()
        waiter.add_done_callback(_ignore_outcome)
        self._overdue = job
        if not must_run and job.cancel():
            raise KmodError(
                f"gpushare.ko did not answer within {self.timeout:g} s (an earlier request"
                f" was still running; {what} was not attempted); the kernel may be stuck,"
                " see dmesg",
                errno.ETIMEDOUT,
            )
        raise KmodError(
            f"gpushare.ko did not answer within {self.timeout:g} s ({what});"
            " the kernel may be stuck, see dmesg",
            errno.ETIMEDOUT,
        )

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, fn, what = item
            if not job.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            self._running, self._started, self._current = what, time.monotonic(), job
            try:
                job.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                job.set_exception(e)
            finally:
                self._started = self._current = None


def _ignore_outcome(f: asyncio.Future[Any]) -> None:
    """Nobody reads the outcome now; keep asyncio from logging it as lost."""
    if not f.cancelled():
        f.exception()
