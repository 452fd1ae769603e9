"""ABI 4's paths under concurrency, inside the guest: processes of 3
containers on 2 GPUs (root and not) ACQUIRE (blocking under alarms, NOWAIT),
renew EARLY, drain with bursts of EXTEND heartbeats, RELEASE with any
report, ask INFO, with 64- and 80-byte structures, and close, while the test
writes drain_us and slice_us, deletes and re-adds the containers, stops,
continues and kills workers, and reads every forced_ends and gputime.
Every answer is checked (allowed errno, outputs in range, a forced end
after the call, the GPU's forced_ends never going down); the guest panics
on an oops (slub_debug is on).  Afterwards, quiet, each container is
granted again (nothing is left holding or waiting), forced_ends and
gputime read sane, and everything is deleted so the module unloads (no
file reference leaked).

A fixed number of operations: GPUSHARE_RANDOM_SEED replays the choices."""

from __future__ import annotations

import collections
import errno
import os
import random
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_race_support import (
    Tally,
    Workers,
    add_bound,
    add_counted,
    del_counted,
    gputimes,
    granted_now,
    label,
    mark,
    need_two_cpus,
    open_dev,
)
from tests.guest.kmod_support import NOBODY, ROOT, ok, refcount, registered, write

pytestmark = pytest.mark.usefixtures("kmod")

SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "4343")
IDS = ("D0", "D1", "D2")
CONTROL_OPS = 250
KILL_EVERY = 50
U64_MAX = (1 << 64) - 1
SLICES_US = ("1000", "2000", "5000", "20000")
DRAINS_US = (str(abi.DRAIN_US_MIN), "2000", "20000", str(abi.DRAIN_US_DEFAULT))
MakeCgroup = Callable[[str], Path]


def spec(rng: random.Random) -> str:
    return ",".join(f"{g}:1000:{rng.choice([0, 10, 30])}:{rng.randrange(2)}" for g in (0, 1))


def problem(state: abi.SchedState, size: int, seen: dict[int, int], gpu: int) -> str | None:
    """What is wrong with an answer's outputs, if anything; seen: the
    highest forced_ends each GPU answered so far (it never goes down)."""
    if state.out_flags != (abi.SCHED_NATIVE if state.policy == 5 else 0):
        return f"out_flags {state.out_flags} under policy {state.policy}"
    if not abi.SLICE_US_MIN * 1000 <= state.slice_ns <= abi.SLICE_US_MAX * 1000:
        return f"slice_ns {state.slice_ns}"
    if state.gputime_ns >= 1 << 62:
        return f"gputime {state.gputime_ns}"
    if size == abi.SCHED_SIZE_VER0:
        return None if state.drain_ns is None else "drain_ns past a 64-byte structure"
    if state.drain_ns is None or state.forced_ends is None:
        return "no ABI 4 outputs"
    if not abi.DRAIN_US_MIN * 1000 <= state.drain_ns <= abi.DRAIN_US_MAX * 1000:
        return f"drain_ns {state.drain_ns}"
    if state.forced_ends < seen.get(gpu, 0):
        return f"forced_ends went down: {seen[gpu]} -> {state.forced_ends}"
    seen[gpu] = state.forced_ends
    return None


def worker(seed: int, stop_fd: int, stats_fd: int) -> int:
    """Random calls until stop_fd reads EOF; exit status: wrong answers (<= 99)."""
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, lambda *_: None)  # interrupts, no restart
    fd: int | None = None
    tally = Tally(f"drain worker {os.getpid()} (seed {seed})")
    forced: dict[int, int] = {}

    def call(op: int, gpu: int, flags: int = 0, used: int = 0) -> int:
        size = rng.choice([abi.SCHED_SIZE_VER0, abi.SCHED.size])
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        assert fd is not None
        try:
            state: abi.SchedState | None = abi.sched(fd, op, gpu, used, flags=flags, size=size)
            err = 0
        except abi.SchedError as e:
            err, state = e.errno or -1, e.state
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        name = ("info", "acquire", "release", "extend")[op]
        name += "-early" if flags & abi.SCHED_EARLY else "-nowait" if flags else ""
        tally.counts[f"{name} {label(err)}"] += 1
        allowed = {0, errno.ENOENT}
        if op == abi.SCHED_EXTEND or flags:
            allowed.add(errno.EAGAIN)
        elif op == abi.SCHED_ACQUIRE:
            allowed.add(errno.EINTR)
        if err not in allowed:
            tally.wrong(f"{name} on GPU {gpu}: {label(err)}")
        if state is None:
            if err != errno.ENOENT or os.getuid() != 0:
                tally.wrong(f"{name}: no answer with {label(err)}")
            return err
        if (why := problem(state, size, forced, gpu)) is not None:
            tally.wrong(f"{name}: {why}")
        granted = err == 0 and op in (abi.SCHED_ACQUIRE, abi.SCHED_EXTEND)
        if granted and state.policy != 5 and state.until <= before:
            tally.wrong(f"{name}: until {state.until} is not after {before}")
        return err

    while not select.select([stop_fd], [], [], 0)[0]:
        if fd is None:
            fd = open_dev(tally, 0.01)
            if fd is None:
                continue
        gpu, r = rng.randrange(2), rng.random()
        if r < 0.25:
            flags = abi.SCHED_NOWAIT if rng.random() < 0.3 else 0
            if not flags:
                signal.setitimer(signal.ITIMER_REAL, rng.choice([0.02, 0.1]))
            err = call(abi.SCHED_ACQUIRE, gpu, flags)
        elif r < 0.4:
            extra = rng.choice([0, abi.SCHED_NOWAIT])
            err = call(abi.SCHED_ACQUIRE, gpu, abi.SCHED_EARLY | extra)
        elif r < 0.6:
            # A drain: heartbeats a millisecond or so apart, then maybe RELEASE.
            for _ in range(rng.randrange(1, 12)):
                if (err := call(abi.SCHED_EXTEND, gpu)) != 0:
                    break
                time.sleep(rng.choice([0.0005, 0.001, 0.003]))
            if rng.random() < 0.7:
                err = call(abi.SCHED_RELEASE, gpu, 0, rng.choice([0, 10**6, U64_MAX]))
        elif r < 0.8:
            err = call(abi.SCHED_RELEASE, gpu, 0, rng.choice([0, 1000, 10**7, U64_MAX]))
        elif r < 0.88:
            err = call(abi.SCHED_INFO, gpu)
        elif r < 0.96:
            time.sleep(rng.choice([0.001, 0.01]))  # "work", maybe holding
            continue
        else:
            os.close(fd)
            fd = None
            tally.counts["close"] += 1
            continue
        if err == errno.ENOENT and rng.random() < 0.5:
            os.close(fd)
            fd = None
    if fd is not None:
        os.close(fd)
    return tally.send(stats_fd)


def read_gpu_files(last: dict[int, int]) -> int:
    """forced_ends (never going down) and every gputime on both GPUs."""
    n = 0
    for g in (0, 1):
        ends = int((ROOT / f"{g}/forced_ends").read_text())
        assert ends >= last.get(g, 0), (g, ends, last)
        last[g] = ends
        times = gputimes(g, IDS)
        assert all(t < 1 << 62 for t in times), (g, times)
        n += len(times)
    return n


def test_drain_paths_race_settings_del_add_and_kills(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    rng = random.Random(SEED)
    ok("gpu 0 100000")
    ok("gpu 1 100000")
    cgs = {cid: cgroups(f"gs-{cid}") for cid in IDS}
    for cid in IDS:
        add_bound(cid, spec(rng))
    for g in (0, 1):
        assert write(ROOT / f"{g}/slice_us", "2000") == 0
        assert write(ROOT / f"{g}/drain_us", "2000") == 0
    workers = Workers(worker, cgs, SEED)
    for cid in IDS:
        for uid in (None, NOBODY):
            workers.spawn(cid, uid)
    mark(f"drain race: {len(workers.live)} workers, seed {SEED}")
    ops: collections.Counter[str] = collections.Counter()
    last: dict[int, int] = {}
    for step in range(CONTROL_OPS):
        workers.check()
        if step % KILL_EVERY == KILL_EVERY - 1:
            workers.kill(rng)
            ops["SIGKILL"] += 1
            continue
        cid, g, r = rng.choice(IDS), rng.randrange(2), rng.random()
        if r < 0.08:
            del_counted(cid, ops)
        elif r < 0.18:
            add_counted(cid, spec(rng), ops)
        elif r < 0.38:
            assert write(ROOT / f"{g}/drain_us", rng.choice(DRAINS_US)) == 0
            ops["drain_us"] += 1
        elif r < 0.5:
            assert write(ROOT / f"{g}/slice_us", rng.choice(SLICES_US)) == 0
            ops["slice_us"] += 1
        elif r < 0.54:
            assert write(ROOT / f"{g}/policy", rng.choice(["1", "2", "2", "5"])) == 0
            ops["policy"] += 1
        elif r < 0.66:
            ops[workers.stop_or_continue(rng)] += 1
        else:
            ops["gpu files read"] += read_gpu_files(last)
        time.sleep(0.01)
    codes, seen = workers.finish()
    mark(f"drain race done: workers {dict(seen)}, test {dict(ops)}, forced ends {last}")
    assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"

    # Quiet: nothing holds or waits, so every container is served again.
    for g in (0, 1):
        assert write(ROOT / f"{g}/policy", "2") == 0
        assert write(ROOT / f"{g}/slice_us", "200000") == 0  # EXTEND well inside it
        assert write(ROOT / f"{g}/drain_us", str(abi.DRAIN_US_DEFAULT)) == 0
    for cid in IDS:
        if cid not in registered():
            add_bound(cid, spec(rng))
    for cid in IDS:
        for g in (0, 1):
            assert granted_now(cgs[cid], g, extend=True) == 0, (cid, g)
    assert read_gpu_files(last) == 2 * len(IDS)
    assert refcount() == len(registered())
    for outcome in ("extend OK", "extend EAGAIN", "acquire-early EAGAIN"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
    assert seen["acquire OK"] and seen["release OK"] and seen["acquire EINTR"], dict(seen)
    assert ops["del OK"] and ops["add OK"] and ops["drain_us"] and ops["SIGSTOP"], dict(ops)
    for cid in registered():
        ok(f"del {cid}")
    assert refcount() == 0  # every worker's file is released: nothing pins it
