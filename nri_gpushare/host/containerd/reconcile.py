"""Follows containerd so that a local allocation outlives neither its task nor
its container.

Containers started by hand (ctr, nerdctl, docker) get their GPU share through
a hook or the runc wrapper: a "local allocation", keyed by containerd
namespace + container ID.  The hook that should give it back may never run
(it crashed, a shim was killed with SIGKILL, containerd was down, a task was
deleted behind our back), so the Reconciler

- subscribes to /tasks/exit, /tasks/delete and /containers/delete FIRST,
- then lists the namespaces and the tasks of those that hold allocations, and
  releases every allocation older than ``grace`` whose container has no task,
  whose task is stopped, or whose task's pid is not the allocation's (a new
  incarnation: it asks for its own share) -- the same pass runs every
  ``period`` seconds while connected, so the allocations too young for one
  pass (a container being created has no task yet) are checked by a later one,
- gives the owner the pid of each running task whose allocation's pid is not
  known (0): one the owner recovered after a restart that fell between the
  container's create and its start, so that nobody told it the start;
- and, while connected, releases an allocation on an event about it: the
  init process's /tasks/exit (an exec'd process has its own ID), /tasks/delete
  or /containers/delete -- of this incarnation, not an earlier one: with the
  allocation's pid known the event's pid must be it; where either pid is not
  known (0: the allocation's not told yet; an event's from containerd's clean-up
  after a shim that died without telling), the event must be no older than
  the allocation.

When the stream ends or containerd cannot be reached, it logs once per outage,
waits (exponential backoff, bounded), reconnects and reconciles again:
containerd does not replay what a subscriber missed.  A pass that cannot list
everything it needs releases nothing and reconnects.  Nothing here raises for
containerd's trouble, nor for the owner's: a release_local that fails is
logged and the loop goes on.

Events and passes are handled one at a time, in the order they come (events
that arrive during a pass wait for it), so a release never races another.

An `observer` (the daemon's unserved list) is told the same events and, once
per connection right after subscribing, the tasks of its namespace;
`following` is set from then until the connection ends, and `retry_now()`
cuts a reconnection's backoff short.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    ContainerdClient,
    ContainerdError,
    Event,
    TaskInfo,
)
from nri_gpushare.host.containerd.reconcile_roles import ContainerdAPI, LocalOwner, TaskObserver
from nri_gpushare.host.containerd.verdicts import event_verdict, listing_verdict
from nri_gpushare.share.model import LocalRef

__all__ = ["TOPICS", "ContainerdAPI", "LocalOwner", "LocalRef", "Reconciler", "TaskObserver"]

log = logging.getLogger(__name__)

TOPICS = (TASK_EXIT, TASK_DELETE, CONTAINER_DELETE)
# How much of a container ID or namespace a log line quotes.
_QUOTE = 120


class _Tick:
    """Time for a periodic pass."""


@dataclass(frozen=True)
class _Ended:
    """The event stream ended, with this error."""

    error: Exception


class _StreamEnded(Exception):
    """The subscription's iterator stopped (a real one never does)."""


# Expected trouble, logged without a traceback; anything else is a bug and gets one.
_CONTAINERD_TROUBLE = (ContainerdError, _StreamEnded)


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE else text[:_QUOTE] + "...")


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Reconciler:
    """Releases the local allocations whose task or container containerd lost
    (see the module's docstring).  ``run()`` until cancelled; ``state()`` for
    status."""

    def __init__(
        self,
        socket_path: str,
        owner: LocalOwner,
        *,
        grace: float = 30.0,
        period: float = 60.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        clock: Callable[[], float] = time.time,
        client_factory: Callable[[str], ContainerdAPI] = ContainerdClient,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        observer: TaskObserver | None = None,
    ) -> None:
        first, most = backoff
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"grace must be a finite number >= 0, not {grace!r}")
        if not (math.isfinite(period) and period > 0):
            raise ValueError(f"period must be a finite number > 0, not {period!r}")
        if not (math.isfinite(most) and 0 < first <= most):
            raise ValueError(f"backoff must be (first, most) with 0 < first <= most: {backoff!r}")
        self.socket_path = socket_path
        self.owner = owner
        self.grace = grace
        self.period = period
        self.backoff = (first, most)
        self._clock = clock
        self._factory = client_factory
        self._sleep = sleep
        self._connected = False
        self._last_error: str | None = None
        self._last_reconcile: float | None = None
        self._released = 0
        self._reconnects = 0
        # run()'s outage bookkeeping
        self._delay = first
        self._synced = False  # this connection got through its first pass
        self._ever_synced = False
        self._in_outage = False
        self.observer = observer
        #: Set while subscribed, from the observer's listing on.
        self.following = asyncio.Event()
        self._retry = asyncio.Event()

    def state(self) -> dict[str, Any]:
        """For `status` (JSON-able): connected (subscribed now), last_error
        (the last reason containerd could not be followed, kept after
        recovery), last_reconcile (clock() at the end of the last complete
        pass), released (allocations released), reconnects (connections after
        the first)."""
        return {
            "connected": self._connected,
            "last_error": self._last_error,
            "last_reconcile": self._last_reconcile,
            "released": self._released,
            "reconnects": self._reconnects,
        }

    # -- the connection loop ----------------------------------------------

    async def run(self) -> None:
        """Follow containerd until cancelled."""
        self._delay = self.backoff[0]
        while True:
            self._synced = False
            # A retry asked for from here on (this attempt may fail) ends the
            # wait after it; one asked for before this attempt is answered by it.
            self._retry.clear()
            error: Exception
            try:
                await self._session()
                error = _StreamEnded("the session ended")  # (it never does without raising)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # containerd's trouble, or a bug: retried either way
                error = exc
            finally:
                self._connected = False
                self.following.clear()
            self._last_error = _describe(error)
            if not self._in_outage:
                self._in_outage = True
                log.warning(
                    "%s containerd's events: %s; retrying (backoff up to %gs) until it is back",
                    "lost" if self._synced else "cannot follow",
                    self._last_error,
                    self.backoff[1],
                    exc_info=None if isinstance(error, _CONTAINERD_TROUBLE) else error,
                )
            else:
                log.debug("containerd still unavailable: %s", error)
            await self._backoff()
            self._delay = min(self._delay * 2, self.backoff[1])

    def retry_now(self) -> None:
        """End the wait before the next connection attempt, if one is under way."""
        self._retry.set()

    async def _backoff(self) -> None:
        waits = [
            asyncio.ensure_future(self._sleep(self._delay)),
            asyncio.ensure_future(self._retry.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _synced_now(self) -> None:
        """The first pass of a connection is done: the outage (if any) is over."""
        self._synced = True
        if self._ever_synced:
            self._reconnects += 1
        if self._in_outage:
            log.info("following containerd's events at %s again", self.socket_path)
        self._ever_synced, self._in_outage, self._delay = True, False, self.backoff[0]

    async def _session(self) -> None:
        """One connection: subscribe, reconcile, then follow events and
        reconcile every period, until something fails (it always raises)."""
        inbox: asyncio.Queue[Event | _Tick | _Ended] = asyncio.Queue()
        helpers: list[asyncio.Task[None]] = []
        try:
            async with self._factory(self.socket_path) as cd:
                async with cd.subscribe(ContainerdClient.topic_filters(TOPICS)) as events:
                    self._connected = True
                    helpers.append(asyncio.create_task(self._read(events, inbox)))
                    await self._observe(cd)
                    await self._pass(cd)
                    self._synced_now()
                    helpers.append(asyncio.create_task(self._tick(inbox)))
                    while True:
                        item = await inbox.get()
                        if isinstance(item, _Ended):
                            raise item.error
                        if isinstance(item, _Tick):
                            await self._pass(cd)
                            helpers.append(asyncio.create_task(self._tick(inbox)))
                        else:
                            await self._on_event(item)
                        helpers = [h for h in helpers if not h.done()]
        finally:
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper

    async def _read(
        self, events: AsyncIterator[Event], inbox: asyncio.Queue[Event | _Tick | _Ended]
    ) -> None:
        try:
            async for event in events:
                inbox.put_nowait(event)
            raise _StreamEnded("the event stream ended")
        except Exception as exc:
            inbox.put_nowait(_Ended(exc))

    async def _tick(self, inbox: asyncio.Queue[Event | _Tick | _Ended]) -> None:
        await self._sleep(self.period)
        inbox.put_nowait(_Tick())

    # -- what the owner holds -----------------------------------------------

    def _holdings(self) -> list[LocalRef] | None:
        """The owner's allocations now (None, logged, if it cannot say)."""
        try:
            refs = list(self.owner.local_allocations())
        except Exception:
            log.exception("local allocations could not be listed; nothing reconciled")
            return None
        return [r for r in refs if isinstance(r, LocalRef)]

    async def _release(self, ref: LocalRef, why: str) -> None:
        log.info(
            "releasing the local allocation of %s in namespace %s: %s",
            _quote(ref.container_id),
            _quote(ref.namespace),
            why,
        )
        call = functools.partial(self.owner.release_local, ref.namespace, ref.container_id, why)
        if await self._tell(call, "releasing the local allocation", ref):
            self._released += 1

    async def _adopt(self, ref: LocalRef, pid: int) -> None:
        call = functools.partial(self.owner.adopt_local, ref.namespace, ref.container_id, pid)
        await self._tell(call, f"telling the owner the task (pid {pid})", ref)

    @staticmethod
    async def _tell(call: Callable[[], Awaitable[None]], what: str, ref: LocalRef) -> bool:
        """Await the owner's `call` about `ref`; a failure is logged with its
        traceback (a bug there must not stop the loop).  True when it went
        through."""
        try:
            await call()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "%s of %s in namespace %s failed",
                what,
                _quote(ref.container_id),
                _quote(ref.namespace),
            )
            return False
        return True

    # -- passes -------------------------------------------------------------

    async def _observe(self, cd: ContainerdAPI) -> None:
        """Give the observer its namespace's tasks; then it is followed."""
        if self.observer is not None:
            namespace = self.observer.namespace
            tasks = await cd.tasks(namespace) if namespace in await cd.namespaces() else []
            self._to_observer(self.observer.listed, tasks)
        self.following.set()

    @staticmethod
    def _to_observer(call: Callable[[Any], None], what: Any) -> None:
        try:
            call(what)
        except Exception:  # its bug must not stop the releases
            log.exception("the observer of containerd's events failed on %.300r", what)

    async def _pass(self, cd: ContainerdAPI) -> None:
        """Release what the listing shows gone, and tell the owner the pid of
        what runs with none known.  Listing errors propagate before anything
        is released."""
        now = self._clock()
        namespaces = set(await cd.namespaces())
        held = self._holdings()
        if held is None:
            return
        due = [r for r in held if not now - r.since < self.grace]
        tasks: dict[tuple[str, str], TaskInfo] = {}
        for namespace in sorted({r.namespace for r in due} & namespaces):
            for task in await cd.tasks(namespace):
                tasks[(namespace, task.id)] = task
        verdicts = [
            (ref, listing_verdict(ref, tasks.get((ref.namespace, ref.container_id)))) for ref in due
        ]
        gone = [(ref, why) for ref, why in verdicts if why is not None]
        if gone:
            # The listing took a while: release only what the owner still
            # holds as it was (not a newer incarnation placed meanwhile).
            still = self._holdings()
            for ref, why in gone:
                if still is not None and ref in still:
                    await self._release(ref, why)
        for ref, verdict in verdicts:
            running = tasks.get((ref.namespace, ref.container_id))
            if verdict is None and not ref.pid and running is not None and running.pid > 0:
                await self._adopt(ref, running.pid)
        self._last_reconcile = self._clock()

    # -- events -------------------------------------------------------------

    async def _on_event(self, event: Event) -> None:
        if self.observer is not None:
            self._to_observer(self.observer.event, event)
        try:
            found = self._match(event)
        except Exception:  # a payload nobody foresaw: the next pass still sees the truth
            log.exception("ignoring an event that could not be read: %.300r", event)
            return
        if found is not None:
            await self._release(*found)

    def _match(self, event: Event) -> tuple[LocalRef, str] | None:
        """The held allocation this event ends, and why, or None."""
        topic, namespace, cid = event.topic, event.namespace, event.container_id
        if topic not in TOPICS or not isinstance(namespace, str) or not isinstance(cid, str):
            return None
        if topic in (TASK_EXIT, TASK_DELETE) and event.process_id != cid:
            return None  # an exec'd process, or no process named
        held = self._holdings()
        if held is None:
            return None
        refs = [r for r in held if r.namespace == namespace and r.container_id == cid]
        if not refs:
            return None  # not ours (every Kubernetes container, for one)
        why = event_verdict(refs[0], event)
        return None if why is None else (refs[0], why)
