"""ABI 4 of the compute scheduler against the real module, inside the guest:
EXTEND heartbeats that hold the GPU while a holder drains (and the waiter
that sleeps through them, woken at once by the release), a drainer that
stops and loses the GPU a grace after its last heartbeat, drain_us (set
through procfs) bounding the drain, EARLY renewal (granted alone, refused
at once when another container is due), and a 64-byte (ABI 3) caller
served as before.  Times are the module's clock as the caller sees it
(until, CLOCK_MONOTONIC), so the bounds are exact where the module decides
and carry GUEST_SLACK_NS where a process must wake."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_race_support import fork
from tests.guest.kmod_support import DEV, ROOT, MakeContainer, enter, ok, value, write

pytestmark = pytest.mark.usefixtures("kmod")

MS = 1_000_000
Send = Callable[[dict[str, Any]], None]
Body = Callable[[Send], dict[str, Any]]
GUEST_SLACK_NS = 40 * MS  # a wake-up and a process switch in the TCG guest
WOKEN_NS = GUEST_SLACK_NS + 60 * MS  # a waiter woken by a release, at most


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def sleep_until(t: int) -> None:
    time.sleep(max(0, t - now_ns()) / 1e9)


def forced(gpu: int = 0) -> int:
    return value(ROOT / f"{gpu}/forced_ends")


class Child:
    """fn() in a forked child in cgroup cg; it may send(dict) along the way
    (the parent reads each with next()); its return value is the last.
    Whatever is left running is killed after the test (its files closed
    before the module unloads)."""

    running: list[Child] = []

    def __init__(self, cg: Path, fn: Body) -> None:
        r, w = os.pipe()

        def run() -> int:
            os.close(r)
            enter(cg, None)

            def send(d: dict[str, Any]) -> None:
                os.write(w, (json.dumps(d) + "\n").encode())

            send(fn(send))
            return 0

        self.pid = fork(run)
        os.close(w)
        self.out = os.fdopen(r)
        Child.running.append(self)

    def next(self) -> dict[str, Any]:
        line = self.out.readline()
        assert line, "the child failed (see stderr)"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def kill(self) -> None:
        Child.running.remove(self)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.out.close()

    def wait(self) -> None:
        Child.running.remove(self)
        _, status = os.waitpid(self.pid, 0)
        self.out.close()
        assert os.waitstatus_to_exitcode(status) == 0, "the child failed"


@pytest.fixture(autouse=True)
def _children(kmod: None, cgroups: object) -> Iterator[None]:
    """Torn down before the cgroups are removed and the module unloaded."""
    yield
    while Child.running:
        Child.running[-1].kill()


def drainer(lead_ns: int, past_ns: int, every_s: float, release: bool) -> Body:
    """A holder: ACQUIRE, then from lead_ns past its slice's end heartbeats
    (EXTEND every every_s) until past_ns past it or the first EAGAIN; then
    RELEASE, or stay without releasing (the parent kills it)."""

    def run(send: Send) -> dict[str, Any]:
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        g = abi.sched(fd, abi.SCHED_ACQUIRE, 0)
        send({"until": g.until, "slice": g.slice_ns})
        sleep_until(g.until + lead_ns)
        beats: list[list[int]] = []
        refused = None
        while (t := now_ns()) < g.until + past_ns:
            try:
                st = abi.sched(fd, abi.SCHED_EXTEND, 0)
                beats.append([t, st.until, st.drain_ns or 0, now_ns()])
            except abi.SchedError as e:
                assert e.errno == errno.EAGAIN and e.state and e.state.until == 0, e
                refused = t
                break
            time.sleep(every_s)
        out = {"beats": beats, "refused": refused, "released": None}
        if not release:
            send(out)
            while True:
                signal.pause()
        out["released"] = now_ns()
        abi.sched(fd, abi.SCHED_RELEASE, 0, 1)
        return out

    return run


def waiter(send: Send) -> dict[str, Any]:
    """A blocking ACQUIRE: when it was asked and granted, and the CPU time
    the wait cost (a busy loop of retries would cost about all of it)."""
    fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), now_ns()
    abi.sched(fd, abi.SCHED_ACQUIRE, 0)
    t1, r1 = now_ns(), resource.getrusage(resource.RUSAGE_SELF)
    abi.sched(fd, abi.SCHED_RELEASE, 0, 1)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return {"asked": t0, "granted": t1, "cpu_ns": int(cpu * 1e9)}


def test_extend_holds_the_gpu_until_release_and_the_waiter_wakes_at_once(
    container: MakeContainer,
) -> None:
    """Heartbeats past a 1 s slice hold the GPU (each until is a grace from
    the call, 250 ms); the blocked waiter sleeps through them without
    spinning and is granted as the holder releases, long before the last
    forced end it was told; nothing ends by force; the drain is charged."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", "1000000") == 0
    assert write(ROOT / "0/drain_us", "2000000") == 0
    h, w = container("dh", "0:100:50"), container("dw", "0:100:50")
    holder = Child(h, drainer(50 * MS, 600 * MS, 0.02, release=True))
    g = holder.next()
    wait = Child(w, waiter)
    r, got = holder.next(), wait.next()
    holder.wait()
    wait.wait()
    grace = g["slice"] // 4
    for t, until, drain, t1 in r["beats"]:
        assert t + grace <= until <= t1 + grace and drain == 2000 * MS, (t, until, t1)
    assert r["refused"] is None and forced() == 0
    # Held through the drain, then woken by the release, not by a timeout.
    assert r["released"] <= got["granted"] <= r["released"] + WOKEN_NS, (r, got)
    assert got["granted"] < r["beats"][-1][1], "woken only at the forced end"
    assert got["cpu_ns"] < (got["granted"] - got["asked"]) // 4, got
    start = g["until"] - g["slice"]
    assert value(ROOT / "0/dh/gputime") >= r["released"] - start


def test_a_drainer_that_stops_loses_the_gpu_a_grace_after_its_last_heartbeat(
    container: MakeContainer,
) -> None:
    """A holder that heartbeats 200 ms past its slice, then neither extends
    nor releases: the waiter is granted at the last forced end it was told
    (not at the slice's own grace), the slice counts as ended by force, and
    the holder is charged exactly up to that end, then, when its file is
    released, the time since (by the clock, drain_us at most)."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", "400000") == 0
    assert write(ROOT / "0/drain_us", "2000000") == 0
    h, w = container("sh", "0:100:50"), container("sw", "0:100:50")
    holder = Child(h, drainer(20 * MS, 220 * MS, 0.02, release=False))
    g = holder.next()
    wait = Child(w, waiter)
    r, got = holder.next(), wait.next()
    wait.wait()
    last = r["beats"][-1][1]
    grace = g["slice"] // 4
    assert last > g["until"] + grace  # extended
    assert last <= got["granted"] <= last + WOKEN_NS, (last, got)
    assert forced() == 1
    held = last - (g["until"] - g["slice"])
    assert value(ROOT / "0/sh/gputime") == held
    # Its file's release is late: charged, by the clock, from the forced
    # end to the release (its report, 0, is not taken as its tail).
    t0 = now_ns()
    holder.kill()
    t1 = now_ns()
    assert t0 - last <= value(ROOT / "0/sh/gputime") - held <= t1 - last
    assert forced() == 1


def test_drain_us_bounds_the_drain(container: MakeContainer) -> None:
    """drain_us written through procfs is every answer's drain_ns and
    bounds the heartbeats: no forced end past slice + drain_us, EAGAIN from
    there, the waiter granted then, the holder charged slice + drain."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", "400000") == 0
    assert write(ROOT / "0/drain_us", "200000") == 0
    assert value(ROOT / "0/drain_us") == 200000
    h, w = container("bh", "0:100:50"), container("bw", "0:100:50")
    holder = Child(h, drainer(10 * MS, 700 * MS, 0.01, release=False))
    g = holder.next()
    wait = Child(w, waiter)
    r, got = holder.next(), wait.next()
    wait.wait()
    bound = g["until"] + 200 * MS
    assert all(until <= bound and drain == 200 * MS for _, until, drain, _ in r["beats"])
    assert max(beat[1] for beat in r["beats"]) == bound
    assert r["refused"] is not None and r["refused"] >= bound - GUEST_SLACK_NS
    assert bound <= got["granted"] <= bound + WOKEN_NS, (bound, got)
    assert forced() == 1
    assert value(ROOT / "0/bh/gputime") == g["slice"] + 200 * MS
    holder.kill()


def test_early_renews_alone_and_never_waits(container: MakeContainer) -> None:
    """EARLY: refused (at once) outside a slice; alone, a new slice from now
    with the hold so far charged; with another container waiting and due,
    EAGAIN at once (blocking or not), the forced end unchanged, and the
    waiter gets the GPU at the release."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", "500000") == 0
    h, w = container("eh", "0:100:50"), container("ew", "0:100:50")

    def run(send: Send) -> dict[str, Any]:
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        out: dict[str, Any] = {}

        def early(flags: int = abi.SCHED_EARLY) -> list[int]:
            t0 = now_ns()
            try:
                st, err = abi.sched(fd, abi.SCHED_ACQUIRE, 0, flags=flags), 0
            except abi.SchedError as e:
                assert e.state is not None
                st, err = e.state, e.errno or -1
            return [err, t0, now_ns(), st.until, st.gputime_ns]

        out["none"] = early()
        g = abi.sched(fd, abi.SCHED_ACQUIRE, 0)
        out["granted"] = [g.until - g.slice_ns, g.until]
        time.sleep(0.1)
        out["alone"] = early()
        send(out)
        time.sleep(0.4)  # the waiter is waiting, and due
        out["due"] = early()
        out["due_nowait"] = early(abi.SCHED_EARLY | abi.SCHED_NOWAIT)
        out["released"] = now_ns()
        abi.sched(fd, abi.SCHED_RELEASE, 0, 1)
        return out

    holder = Child(h, run)
    first = holder.next()
    wait = Child(w, waiter)
    out, got = holder.next(), wait.next()
    holder.wait()
    wait.wait()
    err, t0, t1, until, _ = out["none"]
    assert err == errno.EAGAIN and t1 - t0 < GUEST_SLACK_NS
    start, g_until = first["granted"]
    err, t0, t1, until, charged = out["alone"]
    slice_ns = g_until - start
    assert err == 0 and t0 + slice_ns <= until <= t1 + slice_ns and until > g_until
    assert t0 - start <= charged <= t1 - start
    new_until = until
    for key in ("due", "due_nowait"):
        err, t0, t1, until, _ = out[key]
        assert err == errno.EAGAIN and t1 - t0 < GUEST_SLACK_NS, out[key]
        assert until == new_until + slice_ns // 4, (key, until, new_until)
    assert out["released"] <= got["granted"] <= out["released"] + WOKEN_NS
    assert forced() == 0


def test_a_64_byte_caller_is_served_as_before(container: MakeContainer) -> None:
    """An ABI 3 caller (64-byte structure, INFO/ACQUIRE/RELEASE) is answered
    as before and nothing is written past its 64 bytes; an 80-byte caller
    gets drain_ns and forced_ends."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/drain_us", "30000") == 0
    cg = container("old", "0:100:50")

    def run(send: Send) -> dict[str, Any]:
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        buf = ctypes.create_string_buffer(abi.SCHED.size)
        out: dict[str, Any] = {}
        for name, op in (("info", 0), ("acquire", 1), ("release", 2)):
            data = abi.pack_sched(op, 0, size=abi.SCHED_SIZE_VER0) + b"\xa5" * 16
            ctypes.memmove(buf, bytes(data), len(data))
            rc = ctypes.CDLL(None, use_errno=True).ioctl(fd, abi.IOC_SCHED, buf)
            raw = buf.raw
            st = abi.unpack_sched(raw[: abi.SCHED_SIZE_VER0])
            out[name] = [rc, raw[64:].hex(), st.until, st.slice_ns, st.drain_ns]
        st = abi.sched(fd, abi.SCHED_INFO, 0, size=abi.SCHED_SIZE_VER0)
        out["v0"] = [st.drain_ns, st.forced_ends]
        st = abi.sched(fd, abi.SCHED_INFO, 0)
        out["v1"] = [st.drain_ns, st.forced_ends]
        return out

    c = Child(cg, run)
    out = c.next()
    c.wait()
    for name in ("info", "acquire", "release"):
        rc, tail, until, slice_ns, drain = out[name]
        assert rc == 0 and tail == "a5" * 16 and drain is None, (name, out[name])
        assert slice_ns == abi.SLICE_US_DEFAULT * 1000
    assert out["acquire"][2] > 0 and out["release"][2] == 0
    assert out["v0"] == [None, None]
    assert out["v1"] == [30 * MS, forced()]


def test_extend_and_early_until_are_in_the_callers_time_namespace(
    container: MakeContainer,
) -> None:
    """EXTEND's forced end and EARLY's new end are CLOCK_MONOTONIC as the
    caller sees it: in a time namespace 1000 s ahead, they are a grace
    after the grant's end and a slice after the caller's now."""
    ok("gpu 0 1000")
    assert write(ROOT / "0/slice_us", "200000") == 0
    cg = container("tn", "0:100:50")

    def run(send: Send) -> dict[str, Any]:
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x80) == 0, os.strerror(ctypes.get_errno())  # CLONE_NEWTIME
        with open("/proc/self/timens_offsets", "w") as f:
            f.write("monotonic 1000 0")
        ns = os.open("/proc/self/ns/time_for_children", os.O_RDONLY)
        assert libc.setns(ns, 0x80) == 0, os.strerror(ctypes.get_errno())
        os.close(ns)
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        g = abi.sched(fd, abi.SCHED_ACQUIRE, 0)
        ext = abi.sched(fd, abi.SCHED_EXTEND, 0)
        t0 = now_ns()
        early = abi.sched(fd, abi.SCHED_ACQUIRE, 0, flags=abi.SCHED_EARLY)
        t1 = now_ns()
        abi.sched(fd, abi.SCHED_RELEASE, 0, 1)
        return {"g": g.until, "slice": g.slice_ns, "ext": ext.until, "early": [t0, early.until, t1]}

    c = Child(cg, run)
    r = c.next()
    c.wait()
    assert r["ext"] == r["g"] + r["slice"] // 4, r
    t0, until, t1 = r["early"]
    assert t0 >= 1000 * 10**9 and t0 + r["slice"] <= until <= t1 + r["slice"], r
