"""Live resizes under concurrency, inside the guest (issue 29, part 2): two
writers at once rewrite a container's memsize, weight and highprio while
its processes reserve and release memory (GPUSHARE_IOC_MEM) and QUERY
their quota, and while the processes of three containers take turns on the
GPU (GPUSHARE_IOC_SCHED).  The module's side of a resize: memsize is
stored under gs_lock and gs_mem_lock, where every reservation checks it;
weight and highprio also under the GPU's sched_lock, where every turn reads
them (kmod/README.md, Locking).

Every answer is checked as it comes (a reservation never leaves used over
the quota it answers with, a memsize below what one process holds all
along is always EBUSY, one past the GPU's room always ENOSPC, a weight 0
never refused, a QUERY shows only memsizes that were accepted); afterwards,
quiet, the GPU's books are exact (free_memsize, free_weight, meminfo,
memused) and every container is granted the GPU again.  The guest runs
with slub_debug and panics on an oops.  A fixed number of writes:
GPUSHARE_RANDOM_SEED replays the choices (not the interleaving)."""

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
from nri_gpushare.kmod.readings import parse_meminfo
from tests.guest.kmod_race_support import (
    Tally,
    Workers,
    add_bound,
    fork,
    granted_now,
    label,
    mark,
    need_two_cpus,
    open_dev,
    wait_all,
)
from tests.guest.kmod_support import (
    NOBODY,
    ROOT,
    Agent,
    meminfo,
    ok,
    read,
    value,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "2929")
MakeCgroup = Callable[[str], Path]
TOTAL = 100_000
OTHER = 50_000  # the other container's memsize: the most M can have is the rest
HELD = 2_000  # held by one process of M all along
MEMSIZES = (1, HELD - 1, HELD, HELD + 1, 3_000, 5_000, 10_000, 50_000, 50_001, 10**18)
WRITES = 250  # per writer


def mem_worker(seed: int, stop_fd: int, stats_fd: int) -> int:
    """Reserve, release, INFO and QUERY at random until stop_fd reads EOF,
    each answer checked against this file's own count; exit status: the
    wrong answers (at most 99)."""
    rng = random.Random(seed)
    tally = Tally(f"mem worker {os.getpid()} (seed {seed})")
    fd = open_dev(tally)
    mine = 0
    while fd is not None and not select.select([stop_fd], [], [], 0)[0]:
        r = rng.random()
        if r < 0.1:
            q = abi.query()
            got = q.quotas[0].memory_bytes if q and q.quotas else None
            tally.counts["query"] += 1
            if got not in MEMSIZES or got < HELD or got > TOTAL - OTHER:
                tally.wrong(f"QUERY shows memsize {got}")
            continue
        if r < 0.55:
            op, n = abi.MEM_RESERVE, rng.choice([1, 100, 500, 1_500])
        elif r < 0.95:
            op, n = abi.MEM_RELEASE, rng.randint(0, mine)
        else:
            op, n = abi.MEM_INFO, 0
        try:
            state: abi.MemState | None = abi.mem(fd, op, 0, n)
            err = 0
        except abi.MemError as e:
            err, state = e.errno or -1, e.state
        name = {abi.MEM_RESERVE: "reserve", abi.MEM_RELEASE: "release"}.get(op, "info")
        tally.counts[f"{name} {label(err)}"] += 1
        if err not in ({0, errno.EDQUOT} if op == abi.MEM_RESERVE else {0}):
            tally.wrong(f"{name} {n}: {label(err)}")
        if err == 0:
            mine += n if op == abi.MEM_RESERVE else -n if op == abi.MEM_RELEASE else 0
        if state is None:
            tally.wrong(f"{name}: no state")
        elif state.mine != mine or state.used > state.quota or state.used < HELD + mine:
            tally.wrong(f"{name} {n}: {state}, this file counted {mine}")
    if fd is not None:
        os.close(fd)
    return tally.send(stats_fd)


def write_memsize(rng: random.Random, tally: Tally) -> None:
    size = rng.choice(MEMSIZES)
    err = write(ROOT / "0/M/memsize", str(size))
    tally.counts[f"memsize {label(err)}"] += 1
    if size < HELD:
        want = {errno.EBUSY}
    elif size > TOTAL - OTHER:
        want = {errno.ENOSPC}
    else:
        want = {0, errno.EBUSY}
        if err == errno.EBUSY:
            tally.counts["memsize EBUSY above HELD"] += 1  # workers' bytes in the way
    if err not in want:
        tally.wrong(f"memsize {size}: {label(err)}")
    info = parse_meminfo(read(ROOT / "0/M/meminfo"))
    if info.free + sum(info.processes.values()) > TOTAL - OTHER:
        tally.wrong(f"meminfo {info} past the most M can have")


def writer(seed: int, stats_fd: int, files: tuple[str, ...]) -> int:
    """WRITES live writes of files (memsize, weight, highprio) of container M
    on GPU 0 and, for weight and highprio, of the others; each answer
    checked.  Exit status: the wrong answers (at most 99)."""
    rng = random.Random(seed)
    tally = Tally(f"writer {os.getpid()} (seed {seed})")
    for _ in range(WRITES):
        name = rng.choice(files)
        if name == "memsize":
            write_memsize(rng, tally)
            continue
        cid = rng.choice(("M", "S0", "S1", "S2")) if "S0" in files else "M"
        if name == "weight":
            w = rng.choice([0, 10, 30, 60, 100])
            err = write(ROOT / f"0/{cid}/weight", str(w))
            if err not in ({0} if w == 0 else {0, errno.ENOSPC}):
                tally.wrong(f"weight {w}: {label(err)}")
        else:
            err = write(ROOT / f"0/{cid}/highprio", str(rng.randrange(2)))
            if err:
                tally.wrong(f"highprio: {label(err)}")
        tally.counts[f"{name} {label(err)}"] += 1
        if not 0 <= value(ROOT / "0/free_weight") <= 100:
            tally.wrong(f"free_weight {read(ROOT / '0/free_weight')!r}")
    return tally.send(stats_fd)


def run_writers(seed: int, files: tuple[str, ...]) -> collections.Counter[str]:
    """Two writers at once (the guest's two CPUs); their summed tallies."""
    r, w = os.pipe()

    def one(s: int) -> Callable[[], int]:
        return lambda: writer(s, w, files)

    pids = [fork(one(seed * 10 + i)) for i in range(2)]
    os.close(w)
    codes = wait_all(pids)
    seen: collections.Counter[str] = collections.Counter()
    with os.fdopen(r) as f:
        for line in f:
            seen.update(json.loads(line))
    assert codes == [0, 0], f"a writer got a wrong answer (see its stderr): {dict(seen)}"
    return seen


def test_memsize_and_weight_writes_race_reservations(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    ok(f"gpu 0 {TOTAL}")
    cg = cgroups("gs-M")
    cgroups("gs-N")
    add_bound("M", "0:10000:30")
    add_bound("N", f"0:{OTHER}:0")
    with Agent.spawn(cg, NOBODY) as holder:
        fh = holder.open()
        assert holder.reserve(fh, 0, HELD) == (0, (10_000, HELD, HELD))
        workers = Workers(mem_worker, {"M": cg}, SEED)
        for i in range(3):
            workers.spawn("M", NOBODY if i % 2 else None)
        mark(f"resize race (memory): seed {SEED}")
        try:  # stopped whatever happens, or their files keep the module loaded
            wrote = run_writers(SEED, ("memsize",) * 7 + ("weight", "weight", "highprio"))
            workers.check()
        finally:
            codes, seen = workers.finish()
        mark(f"resize race (memory) done: writers {dict(wrote)}, workers {dict(seen)}")
        assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"
        for outcome in ("memsize OK", "memsize EBUSY", "memsize ENOSPC", "weight OK"):
            assert wrote[outcome], f"no {outcome}: {dict(wrote)}"
        assert wrote["memsize EBUSY above HELD"], "no write met the workers' bytes"
        assert seen["reserve OK"] and seen["reserve EDQUOT"] and seen["query"], dict(seen)

        # Quiet: only the holder holds; the books are exact.
        assert write(ROOT / "0/M/memsize", "10000") == 0
        assert write(ROOT / "0/M/weight", "40") == 0
        assert value(ROOT / "0/free_memsize") == TOTAL - 10_000 - OTHER
        assert value(ROOT / "0/free_weight") == 60
        assert value(ROOT / "0/M/memused") == HELD
        assert meminfo(0, "M") == (10_000 - HELD, {holder.pid: HELD})
        assert holder.info(fh, 0) == (0, (10_000, HELD, HELD))
        assert holder.reserve(fh, 0, 10_000 - HELD + 1)[0] == errno.EDQUOT
    assert meminfo(0, "M") == (10_000, {})
    for cid in ("M", "N"):
        ok(f"del {cid}")


OPS = ((abi.SCHED_ACQUIRE, "acquire"), (abi.SCHED_INFO, "info"), (abi.SCHED_RELEASE, "release"))


def sched_worker(seed: int, stop_fd: int, stats_fd: int) -> int:
    """Turns on GPU 0 (ACQUIRE, a little "work", RELEASE) until stop_fd
    reads EOF; every answer in range, and its container's gputime never
    goes down.  Exit status: the wrong answers (at most 99)."""
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, lambda *_: None)  # interrupts, no restart
    tally = Tally(f"sched worker {os.getpid()} (seed {seed})")
    fd = open_dev(tally)
    last = 0
    while fd is not None and not select.select([stop_fd], [], [], 0)[0]:
        nowait = rng.random() < 0.3
        if not nowait:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
        answers: list[tuple[str, int, abi.SchedState | None]] = []
        for op, op_name in OPS:
            try:
                flags = abi.SCHED_NOWAIT if nowait and op == abi.SCHED_ACQUIRE else 0
                st = abi.sched(fd, op, 0, rng.choice([0, 10**5, 10**6]), flags=flags)
                answers.append((op_name, 0, st))
            except abi.SchedError as e:
                answers.append((op_name, e.errno or -1, e.state))
            signal.setitimer(signal.ITIMER_REAL, 0)
            if op == abi.SCHED_ACQUIRE:
                time.sleep(rng.choice([0.0, 0.001, 0.003]))
        for op_name, err, st in answers:
            tally.counts[f"{op_name} {label(err)}"] += 1
            if err not in (0, errno.EAGAIN, errno.EINTR):
                tally.wrong(f"op {op_name}: {label(err)}")
            if st is None:
                tally.wrong(f"op {op_name}: no state with {label(err)}")
            elif st.weight not in (0, 10, 30, 60, 100) or st.highprio > 1 or st.policy != 2:
                tally.wrong(f"op {op_name}: {st}")
            elif st.gputime_ns < last:
                tally.wrong(f"gputime went down: {st.gputime_ns} < {last}")
            else:
                last = st.gputime_ns
    if fd is not None:
        os.close(fd)
    return tally.send(stats_fd)


def test_weight_and_highprio_writes_race_turns(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    ok(f"gpu 0 {TOTAL}")
    assert write(ROOT / "0/slice_us", "2000") == 0
    ids = ("M", "S0", "S1", "S2")
    cgs = {cid: cgroups(f"gs-{cid}") for cid in ids}
    for cid, w in zip(ids, (30, 30, 10, 0), strict=True):
        add_bound(cid, f"0:1000:{w}")
    workers = Workers(sched_worker, cgs, SEED + 1)
    for cid in ids:
        workers.spawn(cid, None)
        workers.spawn(cid, NOBODY)
    mark(f"resize race (sched): seed {SEED + 1}")
    try:
        wrote = run_writers(SEED + 1, ("weight", "weight", "highprio"))
        workers.check()
    finally:
        codes, seen = workers.finish()
    mark(f"resize race (sched) done: writers {dict(wrote)}, workers {dict(seen)}")
    assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"
    assert wrote["weight OK"] and wrote["weight ENOSPC"] and wrote["highprio OK"], dict(wrote)
    assert seen["acquire OK"] and seen["acquire EAGAIN"], dict(seen)

    # Quiet: the books match the files, and every container is served.
    weights = {cid: value(ROOT / f"0/{cid}/weight") for cid in ids}
    assert value(ROOT / "0/free_weight") == 100 - sum(weights.values()), weights
    for cid in ids:
        assert granted_now(cgs[cid], 0) == 0, cid
    for cid in ids:
        ok(f"del {cid}")
