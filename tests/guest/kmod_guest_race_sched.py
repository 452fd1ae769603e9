"""The compute scheduler under concurrency, inside the guest: processes of 4
containers on 2 GPUs (root and not) ACQUIRE (blocking, interrupted by
alarms, or NOWAIT), hold, RELEASE with any report, ask INFO and close,
while the test writes every live setting (policy, prio_ratio, max_inst,
slice_us, weight, highprio), deletes and re-adds the containers, stops and
continues workers (stopped holders) and SIGKILLs them, and reads every
gputime file.  Every answer is checked (allowed errno, outputs in range,
until after the call); the guest panics on an oops
(slub_debug is on).  Afterwards, quiet, each container is granted the GPU
again (nothing is left holding or waiting), the files read, and the module
unloads once everything is deleted.  Last, blocked waiters and a holder
exit all at once while rmmod is tried again and again.

A fixed number of operations: GPUSHARE_RANDOM_SEED replays the choices
(not the interleaving)."""

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
    fork,
    gputimes,
    granted_now,
    label,
    mark,
    need_two_cpus,
    open_dev,
    wait_all,
    walk,
)
from tests.guest.kmod_support import (
    DEV,
    NOBODY,
    ROOT,
    enter,
    load,
    loaded,
    ok,
    refcount,
    registered,
    unload,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "4242")
IDS = ("S0", "S1", "S2", "S3")
WORKERS_PER_ID = 2
CONTROL_OPS = 300  # the test's; the workers run until it has done them
KILL_EVERY = 60  # control operations
MakeCgroup = Callable[[str], Path]
U64_MAX = (1 << 64) - 1
SLICES_US = (1000, 2000, 5000, 20000)


def spec(rng: random.Random) -> str:
    return ",".join(f"{g}:1000:{rng.choice([0, 10, 20])}:{rng.randrange(2)}" for g in (0, 1))


def check_state(state: abi.SchedState) -> str | None:
    """What is wrong with an answer's outputs, if anything.  (gputime's
    monotony is checked by the core's unit test, kmod/tests/test_sched.c:
    here containers are deleted and added again under the same IDs.)"""
    if state.policy > abi.POLICY_MAX:
        return f"policy {state.policy}"
    if state.out_flags != (abi.SCHED_NATIVE if state.policy == 5 else 0):
        return f"out_flags {state.out_flags} under policy {state.policy}"
    if not abi.SLICE_US_MIN * 1000 <= state.slice_ns <= abi.SLICE_US_MAX * 1000:
        return f"slice_ns {state.slice_ns}"
    if state.weight > abi.WEIGHT_MAX or state.highprio > 1:
        return f"weight {state.weight} highprio {state.highprio}"
    if state.gputime_ns >= 1 << 62:
        return f"gputime {state.gputime_ns}"
    return None


def worker(seed: int, stop_fd: int, stats_fd: int) -> int:
    """Random scheduler calls until stop_fd reads EOF.  Exit status: how
    many answers were wrong (at most 99)."""
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, lambda *_: None)  # interrupts, no restart
    fd: int | None = None
    tally = Tally(f"sched worker {os.getpid()} (seed {seed})")
    while not select.select([stop_fd], [], [], 0)[0]:
        if fd is None:
            fd = open_dev(tally, 0.01)
            if fd is None:
                continue
        gpu = rng.randrange(2)
        r = rng.random()
        used, flags = 0, 0
        if r < 0.4:
            op = abi.SCHED_ACQUIRE
            if rng.random() < 0.3:
                flags = abi.SCHED_NOWAIT
            else:
                signal.setitimer(signal.ITIMER_REAL, rng.choice([0.02, 0.1, 0.3]))
        elif r < 0.75:
            op = abi.SCHED_RELEASE
            used = rng.choice([0, 1000, 10**6, 10**8, U64_MAX])
        elif r < 0.85:
            op = abi.SCHED_INFO
        elif r < 0.95:
            time.sleep(rng.choice([0.001, 0.01, 0.05]))  # "work", maybe holding
            continue
        else:
            os.close(fd)
            fd = None
            tally.counts["close"] += 1
            continue
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        try:
            state: abi.SchedState | None = abi.sched(fd, op, gpu, used, flags=flags)
            err = 0
        except abi.SchedError as e:
            err, state = e.errno or -1, e.state
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        name = {abi.SCHED_ACQUIRE: "acquire", abi.SCHED_RELEASE: "release"}.get(op, "info")
        if flags:
            name += "-nowait"
        tally.counts[f"{name} {label(err)}"] += 1
        allowed = {0, errno.ENOENT}
        if op == abi.SCHED_ACQUIRE:
            allowed |= {errno.EAGAIN} if flags else {errno.EINTR}
        if err not in allowed:
            tally.wrong(f"{name} on GPU {gpu}: {label(err)}")
        if state is None:
            # Only root's descriptor opened in a cgroup whose container was
            # deleted acts for none (and so has nothing to answer).
            if err != errno.ENOENT or os.getuid() != 0:
                tally.wrong(f"{name}: no answer with {label(err)}")
        else:
            problem = check_state(state)
            if problem:
                tally.wrong(f"{name}: {problem}")
            if op == abi.SCHED_ACQUIRE and err in (0, errno.EAGAIN) and state.until <= before:
                tally.wrong(f"{name}: until {state.until} is not after {before}")
        if err == errno.ENOENT and rng.random() < 0.5:
            os.close(fd)
            fd = None
    if fd is not None:
        os.close(fd)
    return tally.send(stats_fd)


def read_gputimes() -> int:
    """Every container's gputime on every GPU that is there now; files read."""
    return sum(len(gputimes(g, IDS)) for g in (0, 1))


def test_scheduler_races_settings_del_add_close_and_kills(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    rng = random.Random(SEED)
    ok("gpu 0 100000")
    ok("gpu 1 100000")
    cgs = {cid: cgroups(f"gs-{cid}") for cid in IDS}
    for cid in IDS:
        add_bound(cid, spec(rng))
    for g in (0, 1):
        assert write(ROOT / f"{g}/slice_us", "2000") == 0
    workers = Workers(worker, cgs, SEED)
    for cid in IDS:
        for i in range(WORKERS_PER_ID):
            workers.spawn(cid, NOBODY if i % 2 else None)
    mark(f"sched race: {len(workers.live)} workers, seed {SEED}")
    ops: collections.Counter[str] = collections.Counter()
    kills = 0
    for step in range(CONTROL_OPS):
        workers.check()
        if step % KILL_EVERY == KILL_EVERY - 1:
            workers.kill(rng)
            kills += 1
            continue
        cid, g = rng.choice(IDS), rng.randrange(2)
        r = rng.random()
        if r < 0.08:
            del_counted(cid, ops)
        elif r < 0.18:
            add_counted(cid, spec(rng), ops)
        elif r < 0.3:
            err = write(ROOT / f"{g}/policy", str(rng.randrange(6)))
            assert err == 0, os.strerror(err)
            ops["policy"] += 1
        elif r < 0.36:
            err = write(ROOT / f"{g}/prio_ratio", str(rng.choice([20, 50, 99])))
            assert err == 0, os.strerror(err)
            ops["prio_ratio"] += 1
        elif r < 0.42:
            err = write(ROOT / f"{g}/max_inst", str(rng.choice([1, 4, 16, 25])))
            assert err in (0, errno.ENOSPC), os.strerror(err)
            ops[f"max_inst {label(err)}"] += 1
        elif r < 0.5:
            err = write(ROOT / f"{g}/slice_us", str(rng.choice(SLICES_US)))
            assert err == 0, os.strerror(err)
            ops["slice_us"] += 1
        elif r < 0.6:
            err = write(ROOT / f"{g}/{cid}/weight", str(rng.choice([0, 10, 30, 60])))
            assert err in (0, errno.ENOSPC, errno.ENOENT, errno.EIO), os.strerror(err)
            ops[f"weight {label(err)}"] += 1
        elif r < 0.68:
            err = write(ROOT / f"{g}/{cid}/highprio", str(rng.randrange(2)))
            assert err in (0, errno.ENOENT, errno.EIO), os.strerror(err)
            ops[f"highprio {label(err)}"] += 1
        elif r < 0.78:
            ops[workers.stop_or_continue(rng)] += 1
        else:
            ops["gputime read"] += read_gputimes()
            ops["files read"] += walk(ROOT)
        time.sleep(0.01)
    codes, seen = workers.finish()
    mark(f"sched race done: workers {dict(seen)}, test {dict(ops)}, {kills} kills")
    assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"

    # Quiet: nothing holds or waits any more, so every container is served.
    for g in (0, 1):
        assert write(ROOT / f"{g}/policy", "2") == 0
        assert write(ROOT / f"{g}/max_inst", "25") == 0
    for cid in IDS:
        if cid not in registered():
            add_bound(cid, spec(rng))
    for cid in IDS:
        for g in (0, 1):
            assert granted_now(cgs[cid], g) == 0, (cid, g)
    assert read_gputimes() == 2 * len(IDS)
    assert refcount() == len(registered())
    for outcome in ("acquire OK", "acquire EINTR", "acquire-nowait OK", "release OK", "info OK"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
    assert seen["acquire-nowait EAGAIN"] and seen["info ENOENT"] + seen["acquire ENOENT"]
    assert ops["del OK"] and ops["add OK"] and ops["SIGSTOP"], dict(ops)
    assert kills == CONTROL_OPS // KILL_EVERY
    for cid in registered():
        ok(f"del {cid}")


def test_waiters_and_holder_exit_race_rmmod(cgroups: MakeCgroup) -> None:
    """Processes blocked in ACQUIRE behind a holder, of a container being
    deleted, all exit at once while rmmod is tried again and again: it
    fails (EAGAIN) until the last file is released, then succeeds."""
    need_two_cpus()
    ok("gpu 0 100000")
    ok("add rs 0:1000:50")
    cg = cgroups("gs-rs")
    ok("bind rs /gs-rs")
    assert write(ROOT / "0/slice_us", "1000000") == 0
    ready_r, ready_w = os.pipe()

    def client() -> int:
        os.close(ready_r)
        enter(cg, None)
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        os.write(ready_w, b"r")
        while True:  # the first holds; the others wait behind it, then ENOENT
            try:
                abi.sched(fd, abi.SCHED_ACQUIRE, 0)
            except abi.SchedError as e:
                if e.errno == errno.ENOENT:
                    time.sleep(0.01)
                    continue
                raise

    pids = [fork(client) for _ in range(6)]
    os.close(ready_w)
    got = b""
    while len(got) < len(pids):
        got += os.read(ready_r, 8)
    os.close(ready_r)
    time.sleep(0.2)
    ok("del rs")
    assert refcount() == len(pids)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    refused = 0
    while (err := unload()) != 0:
        assert err == errno.EAGAIN, os.strerror(err)
        refused += 1
    assert not loaded() and not ROOT.exists()
    assert all(code == -signal.SIGKILL for code in wait_all(pids))
    load()  # for the fixture, which unloads again
    assert refcount() == 0 and refused >= 0
