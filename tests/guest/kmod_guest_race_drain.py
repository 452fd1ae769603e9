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
import json
import os
import random
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_race_support import fork, mark, need_two_cpus, poll, wait_all
from tests.guest.kmod_support import DEV, NOBODY, ROOT, ctl, enter, ok, refcount, registered, write

pytestmark = pytest.mark.usefixtures("kmod")

SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "4343")
IDS = ("D0", "D1", "D2")
CONTROL_OPS = 250
KILL_EVERY = 50
U64_MAX = (1 << 64) - 1
SLICES_US = ("1000", "2000", "5000", "20000")
DRAINS_US = (str(abi.DRAIN_US_MIN), "2000", "20000", str(abi.DRAIN_US_DEFAULT))
MakeCgroup = Callable[[str], Path]


def label(err: int) -> str:
    return errno.errorcode.get(err, "OK") if err else "OK"


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
    bad = 0
    counts: collections.Counter[str] = collections.Counter()
    forced: dict[int, int] = {}

    def wrong(message: str) -> None:
        nonlocal bad
        bad += 1
        os.write(2, f"drain worker {os.getpid()} (seed {seed}): {message}\n".encode())

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
        counts[f"{name} {label(err)}"] += 1
        allowed = {0, errno.ENOENT}
        if op == abi.SCHED_EXTEND or flags:
            allowed.add(errno.EAGAIN)
        elif op == abi.SCHED_ACQUIRE:
            allowed.add(errno.EINTR)
        if err not in allowed:
            wrong(f"{name} on GPU {gpu}: {label(err)}")
        if state is None:
            if err != errno.ENOENT or os.getuid() != 0:
                wrong(f"{name}: no answer with {label(err)}")
            return err
        if (why := problem(state, size, forced, gpu)) is not None:
            wrong(f"{name}: {why}")
        granted = err == 0 and op in (abi.SCHED_ACQUIRE, abi.SCHED_EXTEND)
        if granted and state.policy != 5 and state.until <= before:
            wrong(f"{name}: until {state.until} is not after {before}")
        return err

    while not select.select([stop_fd], [], [], 0)[0]:
        if fd is None:
            try:
                fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                counts["open ENOENT"] += 1  # its container is deleted just now
                time.sleep(0.01)
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
            counts["close"] += 1
            continue
        if err == errno.ENOENT and rng.random() < 0.5:
            os.close(fd)
            fd = None
    if fd is not None:
        os.close(fd)
    os.write(stats_fd, (json.dumps(counts) + "\n").encode())
    return min(bad, 99)


def spawn(cg: Path, uid: int | None, seed: int, pipes: tuple[int, int, int, int]) -> int:
    stop_r, stop_w, stats_r, stats_w = pipes

    def run() -> int:
        os.close(stop_w)
        os.close(stats_r)
        enter(cg, uid)
        return worker(seed, stop_r, stats_w)

    return fork(run)


def read_gpu_files(last: dict[int, int]) -> int:
    """forced_ends (never going down) and every gputime on both GPUs."""
    n = 0
    for g in (0, 1):
        ends = int((ROOT / f"{g}/forced_ends").read_text())
        assert ends >= last.get(g, 0), (g, ends, last)
        last[g] = ends
        for cid in IDS:
            try:
                assert int((ROOT / f"{g}/{cid}/gputime").read_text()) < 1 << 62
                n += 1
            except OSError as e:
                assert e.errno in (errno.ENOENT, errno.EIO), e
    return n


def granted_now(cg: Path, gpu: int) -> int:
    """A blocking ACQUIRE (given 5 s), an EXTEND and a RELEASE in a process
    of cg; 0 or the first errno."""

    def run() -> int:
        enter(cg, None)
        signal.signal(signal.SIGALRM, lambda *_: None)
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        try:
            abi.sched(fd, abi.SCHED_ACQUIRE, gpu)
            signal.setitimer(signal.ITIMER_REAL, 0)
            abi.sched(fd, abi.SCHED_EXTEND, gpu)
            abi.sched(fd, abi.SCHED_RELEASE, gpu, 1)
        except OSError as e:
            return e.errno or 1
        return 0

    return wait_all([fork(run)])[0]


def test_drain_paths_race_settings_del_add_and_kills(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    rng = random.Random(SEED)
    ok("gpu 0 100000")
    ok("gpu 1 100000")
    cgs = {cid: cgroups(f"gs-{cid}") for cid in IDS}
    for cid in IDS:
        ok(f"add {cid} {spec(rng)}")
        ok(f"bind {cid} /gs-{cid}")
    for g in (0, 1):
        assert write(ROOT / f"{g}/slice_us", "2000") == 0
        assert write(ROOT / f"{g}/drain_us", "2000") == 0
    stop_r, stop_w = os.pipe()
    stats_r, stats_w = os.pipe()
    pipes = (stop_r, stop_w, stats_r, stats_w)
    live: dict[int, tuple[str, int | None]] = {}
    stopped: set[int] = set()
    seeds = iter(range(SEED * 1000, SEED * 1000 + 1000))
    for cid in IDS:
        for uid in (None, NOBODY):
            live[spawn(cgs[cid], uid, next(seeds), pipes)] = (cid, uid)
    mark(f"drain race: {len(live)} workers, seed {SEED}")
    ops: collections.Counter[str] = collections.Counter()
    last: dict[int, int] = {}
    for step in range(CONTROL_OPS):
        for pid in list(live):
            code = poll(pid)
            assert code is None, f"worker {pid} exited with {code} (see its stderr)"
        if step % KILL_EVERY == KILL_EVERY - 1:
            pid = rng.choice(sorted(live))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            stopped.discard(pid)
            victim, uid = live.pop(pid)
            live[spawn(cgs[victim], uid, next(seeds), pipes)] = (victim, uid)
            ops["SIGKILL"] += 1
            continue
        cid, g, r = rng.choice(IDS), rng.randrange(2), rng.random()
        if r < 0.08:
            err = ctl(f"del {cid}")
            assert err in (0, errno.ENOENT)
            ops[f"del {label(err)}"] += 1
        elif r < 0.18:
            err = ctl(f"add {cid} {spec(rng)}")
            assert err in (0, errno.EEXIST, errno.ENOSPC)
            if err == 0:
                ok(f"bind {cid} /gs-{cid}")
            ops[f"add {label(err)}"] += 1
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
            pid = rng.choice(sorted(live))
            if pid in stopped:
                os.kill(pid, signal.SIGCONT)
                stopped.discard(pid)
                ops["SIGCONT"] += 1
            else:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
                ops["SIGSTOP"] += 1
        else:
            ops["gpu files read"] += read_gpu_files(last)
        time.sleep(0.01)
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)
    os.close(stop_w)
    codes = wait_all(live)
    os.close(stop_r)
    os.close(stats_w)
    seen: collections.Counter[str] = collections.Counter()
    with os.fdopen(stats_r) as f:
        for line in f:
            seen.update(json.loads(line))
    mark(f"drain race done: workers {dict(seen)}, test {dict(ops)}, forced ends {last}")
    assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"

    # Quiet: nothing holds or waits, so every container is served again.
    for g in (0, 1):
        assert write(ROOT / f"{g}/policy", "2") == 0
        assert write(ROOT / f"{g}/slice_us", "200000") == 0  # EXTEND well inside it
        assert write(ROOT / f"{g}/drain_us", str(abi.DRAIN_US_DEFAULT)) == 0
    for cid in IDS:
        if cid not in registered():
            ok(f"add {cid} {spec(rng)}")
            ok(f"bind {cid} /gs-{cid}")
    for cid in IDS:
        for g in (0, 1):
            assert granted_now(cgs[cid], g) == 0, (cid, g)
    assert read_gpu_files(last) == 2 * len(IDS)
    assert refcount() == len(registered())
    for outcome in ("extend OK", "extend EAGAIN", "acquire-early EAGAIN"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
    assert seen["acquire OK"] and seen["release OK"] and seen["acquire EINTR"], dict(seen)
    assert ops["del OK"] and ops["add OK"] and ops["drain_us"] and ops["SIGSTOP"], dict(ops)
    for cid in registered():
        ok(f"del {cid}")
    assert refcount() == 0  # every worker's file is released: nothing pins it
