"""Blocking calls (NVML, procfs, the kernel module's control file) on one
worker thread, awaited from the event loop under a timeout.

- One thread, one queue: calls run one at a time in the order they were
  asked, so a call asked after another runs after it, even when the first
  one's caller gave up waiting.
- Each await gives up after `timeout` seconds with `WorkerTimeout`; a caller
  that is cancelled gives up the same way.  A running call cannot be
  interrupted: it goes on, so a caller treats a timed-out call as possibly
  done.  One that had not started yet is dropped, except `must_run` calls,
  which always run.
- While one call has been running for longer than `timeout`, the worker is
  stuck: new calls fail at once with `WorkerStuck` instead of each waiting
  out its timeout (`must_run` calls are still queued), so a hung driver or
  kernel costs a caller at most one timeout.
- `strict` (the kernel module's rules): a cancelled caller's call is dropped
  too when it has not started, and a running call whose caller timed out
  makes the worker stuck at once.  Without it (NVML, procfs reads), a
  cancelled caller's call still runs, and the worker is stuck only once a
  call has run past the timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple["concurrent.futures.Future[Any]", Callable[[], Any], str]


class WorkerStuck(TimeoutError):
    """A call was not waited for: the worker's running call (`running`) has
    taken `seconds`, past the timeout.  `queued`: it will still run (a
    `must_run` call), else it was not attempted."""

    def __init__(self, name: str, seconds: float, running: str, what: str, queued: bool) -> None:
        outcome = "will run when it does" if queued else "was not attempted"
        super().__init__(f"{name} has not answered for {seconds:.1f} s; {what} {outcome}")
        self.seconds, self.running, self.what, self.queued = seconds, running, what, queued


class WorkerTimeout(TimeoutError):
    """A call did not finish within the timeout.  `attempted`: it had started
    (or must run), so it may still take effect; else it was dropped unstarted."""

    def __init__(self, name: str, timeout: float, what: str, attempted: bool) -> None:
        super().__init__(f"{name} did not answer within {timeout:g} s ({what})")
        self.timeout, self.what, self.attempted = timeout, what, attempted


class BlockingWorker:
    """One daemon thread running blocking calls in order (see the module's
    docstring); `name` names the thread and the errors' messages."""

    def __init__(self, name: str, timeout: float = 0.5, *, strict: bool = False) -> None:
        self.name = name
        self.timeout = timeout
        self.strict = strict
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._started: float | None = None  # monotonic start of the running call
        self._running = ""  # what it is doing
        self._current: concurrent.futures.Future[Any] | None = None  # the running call
        self._overdue: concurrent.futures.Future[Any] | None = None  # its caller timed out
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread after the calls already queued."""
        self._jobs.put(None)

    def stuck_for(self) -> float | None:
        """Seconds the running call has taken, when that is more than `timeout`
        (or, `strict`, its caller already gave up on it); None when the worker
        is not stuck."""
        started, current = self._started, self._current
        if started is None or current is None:
            return None
        age = time.monotonic() - started
        overdue = self.strict and current is self._overdue
        return age if age > self.timeout or overdue else None

    async def call(self, fn: Callable[[], T], what: str, *, must_run: bool = False) -> T:
        """`fn()`'s result, run on the thread; `what` says what it does."""
        stuck = self.stuck_for()
        if stuck is not None and not must_run:
            raise WorkerStuck(self.name, stuck, self._running, what, queued=False)
        job: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((job, fn, what))
        if stuck is not None:
            raise WorkerStuck(self.name, stuck, self._running, what, queued=True)
        waiter = asyncio.wrap_future(job)
        try:
            done, _ = await asyncio.wait({waiter}, timeout=self.timeout)
        except asyncio.CancelledError:
            # The caller went away: `strict`, a call that has not started is
            # dropped, like one whose caller timed out; else it still runs.
            waiter.add_done_callback(_ignore_outcome)
            if self.strict and not must_run:
                job.cancel()
            raise
        if waiter in done:
            return waiter.result()
        waiter.add_done_callback(_ignore_outcome)
        self._overdue = job
        dropped = not must_run and job.cancel()
        raise WorkerTimeout(self.name, self.timeout, what, attempted=not dropped)

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
