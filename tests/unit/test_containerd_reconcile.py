"""nri_gpushare.host.containerd.reconcile without containerd: a fake client factory
(a scripted containerd: namespaces, tasks, one subscription per connection,
failures on cue), a recording owner, a fake clock for the grace and a fake
sleep for the period and the backoff.  Nothing waits on real time: the tests
step the event loop until the reconciler has done what they look for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    ContainerdClient,
    ContainerdUnavailable,
    Event,
    TaskInfo,
)
from nri_gpushare.host.containerd.reconcile import TOPICS, LocalRef, Reconciler

NOW = 1_800_000_000.0
OLD = NOW - 3600  # placed long ago: past any grace
PERIOD = 1000.0  # told apart from the backoff's delays by the fake sleep
BACKOFF = (0.5, 4.0)
NS = "default"


def stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def exit_(
    cid: str, pid: int, *, ns: str = NS, at: float = NOW, process: str | None = None
) -> Event:
    return Event(
        ns, TASK_EXIT, cid, pid=pid, exit_status=137, process_id=process or cid, timestamp=stamp(at)
    )


def delete(cid: str, pid: int, *, ns: str = NS, at: float = NOW) -> Event:
    return Event(
        ns, TASK_DELETE, cid, pid=pid, exit_status=137, process_id=cid, timestamp=stamp(at)
    )


def cdelete(cid: str, *, ns: str = NS, at: float = NOW) -> Event:
    return Event(ns, CONTAINER_DELETE, cid, timestamp=stamp(at))


def running(cid: str, pid: int) -> TaskInfo:
    return TaskInfo(cid, pid, "running")


# --- fakes -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Sleep:
    """Backoff delays are recorded and pass at once; a period waits for tick()."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.periods = 0  # period sleeps begun
        self.ticks = 0  # period sleeps ended by tick()
        self._ticks: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        if seconds == PERIOD:
            self.periods += 1
            await self._ticks.get()
        else:
            self.delays.append(seconds)
            await asyncio.sleep(0)

    def tick(self) -> None:
        self.ticks += 1
        self._ticks.put_nowait(None)


class Stream:
    """One subscription: what the test pushes, in order; an exception ends it."""

    def __init__(self, filters: list[str]) -> None:
        self.filters = filters
        self.closed = False
        self._items: asyncio.Queue[Any] = asyncio.Queue()

    def push(self, *items: Any) -> None:
        for item in items:
            self._items.put_nowait(item)

    def end(self, error: BaseException | None = None) -> None:
        self.push(error or ContainerdUnavailable("containerd ended the event stream"))

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        item = await self._items.get()
        if isinstance(item, BaseException):
            raise item
        return item


class Containerd:
    """What the fake clients see.  `tasks` maps each namespace that exists to
    its tasks; `fail` names calls ("connect", "subscribe", "namespaces",
    "tasks NS") that raise ContainerdUnavailable, once per count; `during` runs
    a function each time a call is made (before it answers)."""

    def __init__(self, tasks: dict[str, list[TaskInfo]] | None = None) -> None:
        self.tasks: dict[str, list[TaskInfo]] = tasks if tasks is not None else {NS: []}
        self.calls: list[str] = []
        self.fail: dict[str, int] = {}
        self.error: Callable[[str], Exception] = lambda what: ContainerdUnavailable(what)
        self.during: dict[str, Callable[[], None]] = {}
        self.streams: list[Stream] = []
        self.closed = 0

    def call(self, what: str) -> None:
        self.calls.append(what)
        hook = self.during.get(what)
        if hook is not None:
            hook()
        if self.fail.get(what, 0) > 0:
            self.fail[what] -= 1
            raise self.error(f"{what} failed")

    @property
    def stream(self) -> Stream:
        return self.streams[-1]

    def factory(self, socket_path: str) -> Client:
        assert socket_path == "/test/containerd.sock"
        return Client(self)


class Client:
    def __init__(self, cd: Containerd) -> None:
        self.cd = cd

    async def __aenter__(self) -> Client:
        self.cd.call("connect")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cd.closed += 1

    @contextlib.asynccontextmanager
    async def subscribe(self, filters: Iterable[str] = ()) -> AsyncIterator[Stream]:
        self.cd.call("subscribe")
        stream = Stream(list(filters))
        self.cd.streams.append(stream)
        try:
            yield stream
        finally:
            stream.closed = True

    async def namespaces(self) -> list[str]:
        self.cd.call("namespaces")
        return sorted(self.cd.tasks)

    async def tasks(self, namespace: str) -> list[TaskInfo]:
        self.cd.call(f"tasks {namespace}")
        return list(self.cd.tasks.get(namespace, []))


class Owner:
    """Holds refs by (namespace, container ID); a release drops one and is
    recorded (also when it then raises, for the IDs in `broken`)."""

    def __init__(self, *refs: LocalRef) -> None:
        self.refs = {(r.namespace, r.container_id): r for r in refs}
        self.released: list[tuple[str, str, str]] = []
        self.adopted: list[tuple[str, str, int]] = []
        self.broken: set[str] = set()
        self.listing_fails = False
        self.asked = 0

    def local_allocations(self) -> list[LocalRef]:
        self.asked += 1
        if self.listing_fails:
            raise RuntimeError("owner bug")
        return list(self.refs.values())

    async def release_local(self, namespace: str, container_id: str, why: str) -> None:
        await asyncio.sleep(0)  # a real owner awaits something
        self.released.append((namespace, container_id, why))
        if container_id in self.broken:
            raise RuntimeError(f"cannot release {container_id}")
        self.refs.pop((namespace, container_id), None)

    async def adopt_local(self, namespace: str, container_id: str, pid: int) -> None:
        await asyncio.sleep(0)
        self.adopted.append((namespace, container_id, pid))
        if container_id in self.broken:
            raise RuntimeError(f"cannot adopt {container_id}")
        ref = self.refs[(namespace, container_id)]
        self.refs[(namespace, container_id)] = LocalRef(namespace, container_id, pid, ref.since)

    def ids(self) -> list[str]:
        return [cid for _, cid, _ in self.released]


async def until(check: Callable[[], object], what: str) -> None:
    """Step the event loop until check() holds (a bounded number of steps)."""
    for _ in range(20_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


class Harness:
    def __init__(self, owner: Owner, cd: Containerd, **kwargs: Any) -> None:
        self.owner, self.cd = owner, cd
        self.clock, self.sleep = Clock(), Sleep()
        self.reconciler = Reconciler(
            "/test/containerd.sock",
            owner,
            period=PERIOD,
            backoff=BACKOFF,
            clock=self.clock,
            client_factory=cd.factory,
            sleep=self.sleep,
            **kwargs,
        )
        self.passes = 0

    def state(self) -> dict[str, Any]:
        return self.reconciler.state()

    def count(self, call: str) -> int:
        return self.cd.calls.count(call)

    async def synced(self, connections: int = 1) -> None:
        """Until the n-th connection has finished its first pass (and waits for a period)."""
        await until(
            lambda: (
                self.sleep.periods - self.sleep.ticks >= connections and self.state()["connected"]
            ),
            f"connection {connections} reconciled",
        )

    async def tick(self) -> None:
        """One periodic pass, finished."""
        before = self.sleep.periods
        self.sleep.tick()
        await until(lambda: self.sleep.periods > before, "a periodic pass")

    async def settle(self, canary: str) -> None:
        """Until every event pushed so far is handled: one more, for the
        canary ref (exit of pid 1), must release it."""
        self.cd.stream.push(exit_(canary, 1))
        await until(lambda: canary in self.owner.ids(), f"canary {canary} released")


@pytest.fixture
def harness_factory(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[..., Any]]:
    caplog.set_level(logging.DEBUG, logger="nri_gpushare.host.containerd.reconcile")

    @contextlib.asynccontextmanager
    async def make(owner: Owner, cd: Containerd, **kwargs: Any) -> AsyncIterator[Harness]:
        h = Harness(owner, cd, **kwargs)
        task = asyncio.create_task(h.reconciler.run())
        try:
            yield h
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.cancelled(), "run() ended by itself"

    yield make


# --- connecting, and the first pass -------------------------------------------


async def test_subscribes_first_then_lists(harness_factory: Any) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD), LocalRef("other", "b", 11, OLD))
    cd = Containerd({NS: [running("a", 10)], "other": [running("b", 11)], "k8s.io": []})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert cd.calls == ["connect", "subscribe", "namespaces", f"tasks {NS}", "tasks other"]
        assert cd.stream.filters == ContainerdClient.topic_filters(TOPICS)
        assert owner.released == []
        state = h.state()
        assert state == {
            "connected": True,
            "last_error": None,
            "last_reconcile": NOW,
            "released": 0,
            "reconnects": 0,
        }
        json.dumps(state)
    assert cd.stream.closed and cd.closed == 1  # cancelling run() ends both


async def test_an_exit_during_the_listing_is_not_lost(harness_factory: Any) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD))
    cd = Containerd({NS: [running("a", 10)]})  # the listing predates the exit
    cd.during[f"tasks {NS}"] = lambda: cd.stream.push(exit_("a", 10))
    async with harness_factory(owner, cd) as h:
        await until(lambda: owner.released, "a released")
        assert owner.ids() == ["a"]
        assert "/tasks/exit" in owner.released[0][2]
        assert h.state()["released"] == 1


async def test_the_listing_releases_what_is_gone(harness_factory: Any) -> None:
    refs = [
        LocalRef(NS, "no-task", 10, OLD),
        LocalRef(NS, "stopped", 11, OLD),
        LocalRef(NS, "new-pid", 12, OLD),
        LocalRef("gone-ns", "in-a-gone-namespace", 13, OLD),
        LocalRef(NS, "stopped-pid-unknown", 0, OLD),
        # kept:
        LocalRef(NS, "running", 20, OLD),
        LocalRef(NS, "running-pid-unknown", 0, OLD),
        LocalRef(NS, "created", 21, OLD),
        LocalRef(NS, "paused", 22, OLD),
        LocalRef(NS, "pausing", 23, OLD),
        LocalRef(NS, "shim-not-answering", 24, OLD),  # status unknown, pid 0
        LocalRef(NS, "unknown-same-pid", 25, OLD),
    ]
    tasks = [
        TaskInfo("stopped", 11, "stopped"),
        TaskInfo("new-pid", 99, "running"),
        TaskInfo("stopped-pid-unknown", 30, "stopped"),
        running("running", 20),
        running("running-pid-unknown", 31),
        TaskInfo("created", 21, "created"),
        TaskInfo("paused", 22, "paused"),
        TaskInfo("pausing", 23, "pausing"),
        TaskInfo("shim-not-answering", 0, "unknown"),
        TaskInfo("unknown-same-pid", 25, "unknown"),
        running("not-ours", 40),
    ]
    owner = Owner(*refs)
    async with harness_factory(owner, Containerd({NS: tasks, "k8s.io": []})) as h:
        await h.synced()
        why = {cid: w for _, cid, w in owner.released}
        assert sorted(why) == [
            "in-a-gone-namespace",
            "new-pid",
            "no-task",
            "stopped",
            "stopped-pid-unknown",
        ]
        assert "no task" in why["no-task"] and "no task" in why["in-a-gone-namespace"]
        assert "stopped" in why["stopped"]
        assert "99" in why["new-pid"] and "12" in why["new-pid"]
        assert h.state()["released"] == 5
        # Only namespaces that hold something are asked for their tasks.
        assert "tasks k8s.io" not in h.cd.calls and "tasks gone-ns" not in h.cd.calls
        # What runs with no pid known (recovered after a restart that missed
        # its start) is given its task's pid, once.
        assert owner.adopted == [(NS, "running-pid-unknown", 31)]
        await h.tick()
        assert owner.adopted == [(NS, "running-pid-unknown", 31)]


async def test_an_adoption_that_raises_is_logged_and_retried(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(LocalRef(NS, "broken", 0, OLD), LocalRef(NS, "fine", 0, OLD))
    owner.broken = {"broken"}
    cd = Containerd({NS: [running("broken", 7), running("fine", 8)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert owner.adopted == [(NS, "broken", 7), (NS, "fine", 8)]
        await h.tick()  # broken still has no pid: asked again; fine is not
        assert owner.adopted[2:] == [(NS, "broken", 7)]
        assert owner.released == [] and h.count("connect") == 1
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed and all(r.exc_info and "'broken'" in r.getMessage() for r in failed)


async def test_young_refs_are_spared_then_checked_by_a_later_pass(harness_factory: Any) -> None:
    owner = Owner(LocalRef(NS, "young", 0, NOW - 10), LocalRef(NS, "old", 0, OLD))
    async with harness_factory(owner, Containerd({NS: []}), grace=30.0) as h:
        await h.synced()
        assert owner.ids() == ["old"]
        h.clock.now = NOW + 19  # 29 s old: still spared
        await h.tick()
        assert owner.ids() == ["old"]
        assert h.state()["last_reconcile"] == NOW + 19
        h.clock.now = NOW + 20  # 30 s old
        await h.tick()
        assert owner.ids() == ["old", "young"]
        assert h.count("connect") == 1


async def test_a_pass_releases_only_what_the_owner_still_holds(harness_factory: Any) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD), LocalRef(NS, "b", 11, OLD))
    cd = Containerd({NS: []})

    def meanwhile() -> None:  # during the listing: a released, b placed again (new incarnation)
        del owner.refs[(NS, "a")]
        owner.refs[(NS, "b")] = LocalRef(NS, "b", 0, NOW)

    cd.during[f"tasks {NS}"] = meanwhile
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert owner.released == []


# --- events --------------------------------------------------------------------

REF = LocalRef(NS, "c", 500, NOW - 100)
REF_NO_PID = LocalRef(NS, "c", 0, NOW - 100)
BEFORE, AFTER = NOW - 200, NOW - 50  # an event older / newer than the ref


@pytest.mark.parametrize(
    ("ref", "event", "released"),
    [
        (REF, exit_("c", 500), True),
        (REF, exit_("c", 499), False),  # an earlier incarnation's exit
        (REF, exit_("c", 500, process="exec-1"), False),  # an exec'd process
        (REF, delete("c", 500), True),
        (REF, delete("c", 499), False),
        (REF, cdelete("c", at=AFTER), True),
        (REF, cdelete("c", at=BEFORE), False),  # an earlier incarnation's container
        (REF_NO_PID, exit_("c", 777, at=AFTER), True),
        (REF_NO_PID, exit_("c", 777, at=BEFORE), False),
        (REF_NO_PID, delete("c", 777, at=AFTER), True),
        (REF_NO_PID, delete("c", 777, at=BEFORE), False),
        (REF_NO_PID, cdelete("c", at=AFTER), True),
        (REF_NO_PID, cdelete("c", at=BEFORE), False),
        # pid 0: containerd's clean-up after a shim that died without telling
        (REF, exit_("c", 0, at=AFTER), True),
        (REF, exit_("c", 0, at=BEFORE), False),
        (REF, exit_("c", 500, ns="k8s.io"), False),  # another namespace
        (REF, exit_("d", 500), False),  # a container the owner does not hold
        (REF, Event(NS, "/tasks/start", "c", pid=500, timestamp=stamp(AFTER)), False),
    ],
)
async def test_events(harness_factory: Any, ref: LocalRef, event: Event, released: bool) -> None:
    owner = Owner(ref, LocalRef(NS, "canary", 1, OLD))
    # With no pid known, the listing must not give it one (a shim that does
    # not answer): the event is judged against a ref with pid 0.
    c = running("c", 500) if ref.pid else TaskInfo("c", 0, "unknown")
    cd = Containerd({NS: [c, running("canary", 1)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert owner.adopted == []
        cd.stream.push(event)
        await h.settle("canary")
        assert ("c" in owner.ids()) is released
        if released:
            assert event.topic in owner.released[0][2]
        assert h.count("connect") == 1


async def test_events_apply_to_young_refs(harness_factory: Any) -> None:
    owner = Owner(LocalRef(NS, "c", 0, NOW - 1), LocalRef(NS, "canary", 1, OLD))
    cd = Containerd({NS: [running("canary", 1)]})  # c has no task yet
    async with harness_factory(owner, cd, grace=30.0) as h:
        await h.synced()
        assert owner.released == []
        cd.stream.push(exit_("c", 5, at=NOW))
        await h.settle("canary")
        assert owner.ids() == ["c", "canary"]


async def test_one_release_per_allocation(harness_factory: Any) -> None:
    owner = Owner(REF, LocalRef(NS, "canary", 1, OLD))
    cd = Containerd({NS: [running("c", 500), running("canary", 1)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        cd.stream.push(exit_("c", 500), delete("c", 500), cdelete("c", at=AFTER))
        await h.settle("canary")
        assert owner.ids() == ["c", "canary"]


def _hostile() -> list[Any]:
    huge = "x" * 1_000_000
    return [
        Event(None, TASK_EXIT, "c", pid=500, process_id="c"),  # type: ignore[arg-type]
        Event(NS, None, "c", pid=500),  # type: ignore[arg-type]
        Event(NS, TASK_EXIT, None, pid=500, timestamp=stamp(AFTER)),
        Event(NS, TASK_EXIT, "c", pid=500, process_id=None),  # no process named
        Event(NS, TASK_EXIT, 500, pid=500, process_id=500),  # type: ignore[arg-type]
        Event(NS, TASK_EXIT, "c", pid="500", process_id="c"),  # type: ignore[arg-type]
        Event(NS, TASK_EXIT, "c", pid=True, process_id="c"),  # type: ignore[arg-type]
        Event(NS, TASK_EXIT, "c", pid=-500, process_id="c"),
        Event(NS, TASK_EXIT, "c", pid=2**80, process_id="c"),
        Event(NS, TASK_EXIT, "c", pid=501.0, process_id="c"),  # type: ignore[arg-type]
        Event(NS, TASK_DELETE, "c", pid=None, process_id="c"),  # no pid, no timestamp
        Event(NS, TASK_DELETE, "c", pid=0, process_id="c", timestamp=stamp(BEFORE)),
        Event(NS, CONTAINER_DELETE, "c", timestamp="tomorrow"),  # type: ignore[arg-type]
        Event(NS, CONTAINER_DELETE, "c", timestamp=None),
        Event(NS, CONTAINER_DELETE, "c", timestamp=datetime.min),  # naive, and year 1
        Event(NS, TASK_EXIT, huge, pid=500, process_id=huge, timestamp=stamp(AFTER)),
        Event(huge, CONTAINER_DELETE, "c", timestamp=stamp(AFTER)),
        Event(NS, huge, "c", pid=500, process_id="c"),
        None,
        "not an event",
        object(),
        {"topic": TASK_EXIT, "container_id": "c"},
    ]


async def test_hostile_events_release_nothing_and_break_nothing(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(REF, LocalRef(NS, "canary", 1, OLD), LocalRef(NS, "x" * 1_000, 7, OLD))
    cd = Containerd({NS: [running("c", 500), running("canary", 1), running("x" * 1_000, 7)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        cd.stream.push(*_hostile())
        await h.settle("canary")
        assert owner.ids() == ["canary"]
        assert h.count("connect") == 1 and h.state()["connected"]
        # An event that is not one is logged, briefly.
        assert all(len(r.getMessage()) < 2000 for r in caplog.records)


# --- failures, reconnecting, backoff ----------------------------------------------


async def test_reconnects_when_the_stream_ends_and_reconciles_again(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD), LocalRef(NS, "b", 11, OLD))
    cd = Containerd({NS: [running("a", 10), running("b", 11)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        first = cd.stream
        # containerd goes; meanwhile a's task goes (no event reaches us).
        cd.tasks[NS] = [running("b", 11)]
        first.end()
        await h.synced(connections=2)
        assert first.closed and cd.stream is not first
        assert owner.ids() == ["a"]
        assert "no task" in owner.released[0][2]
        assert cd.calls[-4:] == ["connect", "subscribe", "namespaces", f"tasks {NS}"]
        state = h.state()
        assert state["reconnects"] == 1 and state["connected"]
        assert "ended the event stream" in state["last_error"]
        assert h.sleep.delays == [BACKOFF[0]]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lost containerd's events" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # containerd's trouble: no traceback


async def test_backoff_grows_is_bounded_and_resets(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cd = Containerd()
    cd.fail["connect"] = 6
    async with harness_factory(Owner(), cd) as h:
        await h.synced()
        assert h.sleep.delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        assert h.state()["reconnects"] == 0  # never connected before
        # One warning for the whole outage, one note when it is over.
        assert [r.levelno for r in caplog.records if r.levelno >= logging.INFO] == [
            logging.WARNING,
            logging.INFO,
        ]
        warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
        assert "cannot follow" in warning.getMessage()
        # A new outage starts from the shortest delay again, and is told again.
        cd.fail["connect"] = 2
        cd.stream.end()
        await h.synced(connections=2)
        assert h.sleep.delays[6:] == [0.5, 1.0, 2.0]
        assert h.state()["reconnects"] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2


@pytest.mark.parametrize("failing", ["namespaces", f"tasks {NS}", "tasks other", "subscribe"])
async def test_a_failed_listing_releases_nothing_and_reconnects(
    harness_factory: Any, failing: str
) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD), LocalRef("other", "b", 11, OLD))
    cd = Containerd({NS: [], "other": []})  # both gone
    cd.fail[failing] = 1
    seen: list[list[tuple[str, str, str]]] = []
    cd.during["connect"] = lambda: seen.append(list(owner.released))
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert h.count("connect") == 2
        assert seen == [[], []]  # nothing was released by the failed connection
        assert sorted(owner.ids()) == ["a", "b"]
        assert f"{failing} failed" in h.state()["last_error"]
        assert h.state()["reconnects"] == 0


async def test_a_release_that_raises_does_not_stop_the_loop(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(
        LocalRef(NS, "broken", 10, OLD),
        LocalRef(NS, "fine", 11, OLD),
        LocalRef(NS, "later", 12, OLD),
        LocalRef(NS, "canary", 1, OLD),
    )
    owner.broken = {"broken"}
    cd = Containerd({NS: [running("later", 12), running("canary", 1)]})
    async with harness_factory(owner, cd) as h:
        await h.synced()
        assert owner.ids() == ["broken", "fine"]
        cd.stream.push(exit_("later", 12))
        await h.settle("canary")
        assert owner.ids() == ["broken", "fine", "later", "canary"]
        assert h.state()["released"] == 3  # those that went through
        assert h.count("connect") == 1
        # broken is still held: the next pass tries again.
        await h.tick()
        assert owner.ids()[-1] == "broken"
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 2 and all(r.exc_info for r in failed)
    assert "'broken'" in failed[0].getMessage()


async def test_an_owner_that_cannot_list_stops_nothing(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD), LocalRef(NS, "canary", 1, OLD))
    owner.listing_fails = True
    async with harness_factory(owner, Containerd({NS: [running("canary", 1)]})) as h:
        await h.synced()
        assert owner.released == [] and h.state()["last_reconcile"] is None
        asked = owner.asked
        h.cd.stream.push(exit_("canary", 1))
        await until(lambda: owner.asked > asked, "the owner asked about the event")
        owner.listing_fails = False
        await h.tick()
        assert owner.ids() == ["a"]  # the event went by unmatched; the pass did its work
        assert h.count("connect") == 1
    assert sum("could not be listed" in r.getMessage() for r in caplog.records) == 2


async def test_an_unexpected_error_is_retried_with_its_traceback(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cd = Containerd()
    cd.fail["connect"] = 3
    cd.error = lambda what: TypeError(what)
    async with harness_factory(Owner(), cd) as h:
        await h.synced()
        assert h.count("connect") == 4
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.exc_info and warning.exc_info[0] is TypeError


async def test_a_stream_that_just_stops_is_a_lost_connection(harness_factory: Any) -> None:
    cd = Containerd()
    async with harness_factory(Owner(), cd) as h:
        await h.synced()
        cd.stream.push(StopAsyncIteration())  # iteration ends without an error
        await h.synced(connections=2)
        assert "stream ended" in h.state()["last_error"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grace": -1.0},
        {"grace": float("nan")},
        {"period": 0.0},
        {"period": float("inf")},
        {"backoff": (0.0, 1.0)},
        {"backoff": (2.0, 1.0)},
        {"backoff": (1.0, float("inf"))},
    ],
)
def test_settings_are_checked(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Reconciler("/s", Owner(), **kwargs)


# --- the observer (the daemon's unserved list) ---------------------------------------


class Observer:
    """Records what it is told; raises when `broken`."""

    namespace = "k8s.io"

    def __init__(self) -> None:
        self.listings: list[list[TaskInfo]] = []
        self.events: list[Event] = []
        self.broken = False

    def listed(self, tasks: list[TaskInfo]) -> None:
        if self.broken:
            raise RuntimeError("observer bug")
        self.listings.append(tasks)

    def event(self, event: Event) -> None:
        if self.broken:
            raise RuntimeError("observer bug")
        self.events.append(event)


async def test_the_observer_gets_its_namespaces_tasks_per_connection_then_every_event(
    harness_factory: Any,
) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD))
    k8s = [running("k", 5), TaskInfo("s", 6, "stopped")]
    cd = Containerd({NS: [running("a", 10)], "k8s.io": k8s})
    observer = Observer()
    async with harness_factory(owner, cd, observer=observer) as h:
        following = h.reconciler.following
        assert not following.is_set()
        await h.synced()
        assert following.is_set()
        # Subscribed first, so that no event after the listing is missed.
        assert cd.calls[:4] == ["connect", "subscribe", "namespaces", "tasks k8s.io"]
        assert observer.listings == [k8s]
        events = [exit_("x", 3, ns="k8s.io"), exit_("a", 10), cdelete("y", ns="elsewhere")]
        cd.stream.push(*events)
        await until(lambda: len(observer.events) == 3, "the events told")
        assert observer.events == events and owner.ids() == ["a"]
        cd.stream.end()
        await until(lambda: not following.is_set(), "the connection lost")
        await h.synced(connections=2)
        assert following.is_set() and observer.listings == [k8s, k8s]


async def test_an_observer_without_its_namespace_gets_an_empty_listing(
    harness_factory: Any,
) -> None:
    observer = Observer()
    async with harness_factory(Owner(), Containerd({NS: []}), observer=observer) as h:
        await h.synced()
        assert observer.listings == [[]] and "tasks k8s.io" not in h.cd.calls


async def test_an_observer_that_raises_stops_nothing(
    harness_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(LocalRef(NS, "a", 10, OLD))
    observer = Observer()
    observer.broken = True
    cd = Containerd({NS: [running("a", 10)], "k8s.io": []})
    async with harness_factory(owner, cd, observer=observer) as h:
        await h.synced()
        assert h.reconciler.following.is_set()
        cd.stream.push(exit_("a", 10))
        await until(lambda: owner.ids() == ["a"], "a released all the same")
        assert h.count("connect") == 1
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 2 and all(r.exc_info for r in failed)


def waiting_reconciler(cd: Containerd, sleep: Callable[[float], Awaitable[None]]) -> Reconciler:
    """A reconciler of `cd` whose waits are `sleep`."""
    return Reconciler(
        "/test/containerd.sock",
        Owner(),
        period=PERIOD,
        backoff=BACKOFF,
        clock=Clock(),
        client_factory=cd.factory,
        sleep=sleep,
    )


async def test_retry_now_ends_the_wait_before_reconnecting() -> None:
    cd = Containerd()
    cd.fail["connect"] = 1
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # no wait ends by itself
        waits.append(seconds)
        await asyncio.Event().wait()

    reconciler = waiting_reconciler(cd, sleep)
    task = asyncio.create_task(reconciler.run())
    try:
        await until(lambda: waits == [BACKOFF[0]], "waiting to reconnect")
        reconciler.retry_now()
        await until(lambda: waits == [BACKOFF[0], PERIOD], "connected again: a pass's period")
        assert reconciler.following.is_set() and cd.calls[:2] == ["connect", "connect"]
        reconciler.retry_now()  # connected: nothing to cut short
        await asyncio.sleep(0)
        assert cd.calls.count("connect") == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_retry_now_during_a_failing_attempt_is_not_lost() -> None:
    """A retry asked for while an attempt is under way (the plugin registering
    as containerd comes back) cuts short the wait after that attempt fails."""
    cd = Containerd()
    cd.fail["connect"] = 1

    async def sleep(seconds: float) -> None:  # no wait ends by itself
        await asyncio.Event().wait()

    reconciler = waiting_reconciler(cd, sleep)
    cd.during["connect"] = lambda: (
        reconciler.retry_now() if cd.calls.count("connect") == 1 else None
    )
    task = asyncio.create_task(reconciler.run())
    try:
        await until(lambda: reconciler.following.is_set(), "connected again without a wait")
        assert cd.calls[:2] == ["connect", "connect"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
