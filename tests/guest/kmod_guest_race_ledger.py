"""The memory ledger under concurrency, inside the guest: processes of 3
containers (root and not) reserve, release and close concurrently while the
test deletes and re-adds their containers, rewrites memsize, redeclares
the GPUs smaller and larger (admission against orphaned bytes), SIGKILLs
workers and reads meminfo and the GPUs' books.  Every answer the module
gives is one consistent state (used never over the quota, the file's
holding exactly what the worker counted); afterwards every ledger is back at
zero and nothing is left orphaned.  Last, the last closes race rmmod.

The guest has two CPUs (test_kmod.py boots it with -smp 2).  A fixed number
of operations, not a duration: GPUSHARE_RANDOM_SEED replays the choices
(not the interleaving)."""

from __future__ import annotations

import collections
import errno
import os
import random
import select
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.readings import parse_meminfo
from tests.guest.kmod_race_support import (
    Tally,
    Workers,
    add_bound,
    add_counted,
    del_counted,
    fork,
    label,
    mark,
    need_two_cpus,
    open_dev,
    wait_all,
)
from tests.guest.kmod_support import (
    DEV,
    NOBODY,
    ROOT,
    ctl,
    load,
    loaded,
    ok,
    read,
    refcount,
    registered,
    unload,
    value,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or "7117")
GPUS = {0: 100_000, 1: 100_000}
IDS = ("L0", "L1", "L2")
SPEC = "0:1000,1:1000"
MEMSIZES = (200, 500, 1000, 2000, 3000)  # the most a container ever has: 3000
# A GPU redeclared this small refuses (ENOSPC) what the containers' memsizes
# and orphaned bytes would not leave room for: adds and memsize writes too.
TOTALS = (100_000, 9_000, 6_000, 3_500)
WORKERS_PER_ID = 2
CONTROL_OPS = 600  # the test's; the workers run until it has done them
KILL_EVERY = 100  # control operations
MakeCgroup = Callable[[str], Path]


def worker(seed: int, stop_fd: int, stats_fd: int) -> int:
    """Reserve, release, read and close at random on /dev/gpushare until
    stop_fd reads EOF; every answer is checked against this process's own
    count of what its file holds.  Exit status: how many answers were wrong
    (at most 99)."""
    rng = random.Random(seed)
    fd: int | None = None
    mine = {0: 0, 1: 0}
    tally = Tally(f"worker {os.getpid()} (seed {seed})")
    while not select.select([stop_fd], [], [], 0)[0]:
        if fd is None:
            fd = open_dev(tally)
            if fd is None:
                continue
            mine = {0: 0, 1: 0}
        gpu = rng.randrange(2)
        r = rng.random()
        if r < 0.5:
            op, n = abi.MEM_RESERVE, rng.choice([1, 100, 300, 600])
        elif r < 0.85:
            op, n = abi.MEM_RELEASE, rng.randint(0, mine[gpu])
        elif r < 0.9:
            op, n = abi.MEM_INFO, 0
        else:
            os.close(fd)
            fd = None
            tally.counts["close"] += 1
            continue
        try:
            state: abi.MemState | None = abi.mem(fd, op, gpu, n)
            err = 0
        except abi.MemError as e:
            err, state = e.errno or -1, e.state
        name = {abi.MEM_RESERVE: "reserve", abi.MEM_RELEASE: "release"}.get(op, "info")
        tally.counts[f"{name} {label(err)}"] += 1
        allowed = {0, errno.ENOENT} | ({errno.EDQUOT} if op == abi.MEM_RESERVE else set())
        if err not in allowed:
            tally.wrong(f"{name} {n} on GPU {gpu}: {errno.errorcode.get(err, err)}")
        if err == 0 and op == abi.MEM_RESERVE:
            mine[gpu] += n
        elif err == 0 and op == abi.MEM_RELEASE:
            mine[gpu] -= n
        if state is None:
            if err != errno.ENOENT:
                tally.wrong(f"{name}: no state with {errno.errorcode.get(err, err)}")
            if any(mine.values()):
                tally.wrong(f"{name}: a file that holds bytes acts for no container")
        else:
            if state.mine != mine[gpu] or state.mine > state.used:
                tally.wrong(f"{name} {n} on GPU {gpu}: mine {state.mine}, counted {mine[gpu]}")
            if state.quota and state.used > state.quota:
                tally.wrong(f"{name}: used {state.used} over the quota {state.quota}")
            # quota 0: the container was deleted; only a release still works.
            deleted = err == errno.ENOENT or (err == 0 and op == abi.MEM_RELEASE)
            if (state.quota == 0 and not deleted) or (err == errno.ENOENT and state.quota):
                tally.wrong(f"{name}: quota {state.quota} with {errno.errorcode.get(err, err)}")
        if err == errno.ENOENT and rng.random() < 0.5:
            os.close(fd)  # give the deleted container's bytes back
            fd = None
    if fd is not None:
        os.close(fd)
    return tally.send(stats_fd)


def check_meminfo(cid: str, gpu: int) -> bool:
    """meminfo of a container that may be deleted meanwhile: within the most
    memsize it ever had (a used over memsize would wrap Free around)."""
    try:
        info = parse_meminfo(read(ROOT / f"{gpu}/{cid}/meminfo"))
    except OSError as e:
        assert e.errno in (errno.ENOENT, errno.EIO), e
        return False
    assert info.free <= max(MEMSIZES), info
    assert info.free + sum(info.processes.values()) <= max(MEMSIZES), info
    return True


def test_reservations_race_del_add_close_and_kills(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    rng = random.Random(SEED)
    for g, total in GPUS.items():
        ok(f"gpu {g} {total}")
    cgs = {cid: cgroups(f"gs-{cid}") for cid in IDS}
    for cid in IDS:
        add_bound(cid, SPEC)
    workers = Workers(worker, cgs, SEED)
    for cid in IDS:
        for i in range(WORKERS_PER_ID):
            workers.spawn(cid, NOBODY if i % 2 else None)
    mark(f"ledger race: {len(workers.live)} workers, seed {SEED}")
    ops: collections.Counter[str] = collections.Counter()
    orphaned_seen = kills = 0
    for step in range(CONTROL_OPS):
        workers.check()
        if step % KILL_EVERY == KILL_EVERY - 1:
            workers.kill(rng)
            kills += 1
            continue
        cid = rng.choice(IDS)
        r = rng.random()
        if r < 0.15:
            if del_counted(cid, ops) == 0:
                orphaned_seen = max(orphaned_seen, value(ROOT / "0/orphaned_memsize"))
        elif r < 0.35:
            add_counted(cid, SPEC, ops)
        elif r < 0.55:
            gpu = rng.randrange(2)
            err = write(ROOT / f"{gpu}/{cid}/memsize", str(rng.choice(MEMSIZES)))
            allowed = (0, errno.EBUSY, errno.ENOENT, errno.EIO, errno.ENOSPC)
            assert err in allowed, os.strerror(err)
            ops[f"memsize {label(err)}"] += 1
        elif r < 0.62:
            gpu, total = rng.randrange(2), rng.choice(TOTALS)
            err = ctl(f"gpu {gpu} {total}")
            assert err in (0, errno.ENOSPC), os.strerror(err)
            if err == 0:
                assert value(ROOT / f"{gpu}/total_memsize") == total
            ops[f"gpu {label(err)}"] += 1
        else:
            ops["meminfo"] += check_meminfo(cid, rng.randrange(2))
            for g in GPUS:
                # Only this thread changes total and memsizes; the workers
                # only lower orphaned: free, then orphaned, never sum past
                # the total (a free_memsize that wrapped around would).
                total = value(ROOT / f"{g}/total_memsize")
                free = value(ROOT / f"{g}/free_memsize")
                assert free + value(ROOT / f"{g}/orphaned_memsize") <= total
    codes, seen = workers.finish()
    summary = f"workers {dict(seen)}, test {dict(ops)}, {kills} kills, orphaned {orphaned_seen}"
    mark(f"ledger race done: {summary}")
    assert codes == [0] * len(codes), "a worker got a wrong answer (see its stderr)"

    # Quiet now: every file is closed, so every ledger is empty.
    for g in GPUS:
        total = value(ROOT / f"{g}/total_memsize")
        assert value(ROOT / f"{g}/orphaned_memsize") == 0
        memsizes = [value(ROOT / f"{g}/{cid}/memsize") for cid in registered()]
        assert value(ROOT / f"{g}/free_memsize") == total - sum(memsizes)
        for cid in registered():
            memsize = value(ROOT / f"{g}/{cid}/memsize")
            assert read(ROOT / f"{g}/{cid}/meminfo") == f"Free: {memsize}\n"
            assert value(ROOT / f"{g}/{cid}/memused") == 0
    assert refcount() == len(registered())
    for outcome in ("reserve OK", "reserve EDQUOT", "reserve ENOENT", "release OK"):
        assert seen[outcome], f"no {outcome}: {dict(seen)}"
    assert ops["del OK"] and ops["add OK"] and ops["memsize OK"]
    assert ops["gpu OK"] and ops["gpu ENOSPC"], dict(ops)
    assert kills == CONTROL_OPS // KILL_EVERY
    assert orphaned_seen or seen["open ENOENT"], "del never met a held reservation"
    for cid in registered():
        ok(f"del {cid}")


def test_last_closes_race_rmmod(cgroups: MakeCgroup) -> None:
    """Holders of deleted containers exit all at once while rmmod is tried
    again and again: it fails (EAGAIN) until the last file is released, and
    then succeeds, with the ledger's memory returned first."""
    need_two_cpus()
    ok("gpu 0 100000")
    cg = cgroups("gs-rm")
    ok("add rm 0:100000")
    ok("bind rm /gs-rm")
    go_r, go_w = os.pipe()
    held_r, held_w = os.pipe()

    def holder() -> int:
        os.close(go_w)  # only the test's end, or the EOF never comes
        os.close(held_r)
        (cg / "cgroup.procs").write_text("0\n")
        fds = [os.open(DEV, os.O_RDWR | os.O_CLOEXEC) for _ in range(3)]
        for fd in fds:
            abi.mem(fd, abi.MEM_RESERVE, 0, 1000)
        os.write(held_w, b"h")
        os.read(go_r, 1)  # EOF once the test closes its end
        return 0  # exit closes the files

    pids = [fork(holder) for _ in range(8)]
    os.close(held_w)
    os.close(go_r)
    held = b""
    while len(held) < len(pids):
        held += os.read(held_r, 8)
    assert value(ROOT / "0/rm/memused") == 24_000
    ok("del rm")
    assert value(ROOT / "0/orphaned_memsize") == 24_000
    assert refcount() == 24
    os.close(go_w)  # all exit
    refused = 0
    while (err := unload()) != 0:
        assert err == errno.EAGAIN, os.strerror(err)
        refused += 1
    assert not loaded() and not ROOT.exists()
    assert wait_all(pids) == [0] * len(pids)
    os.close(held_r)
    load()  # for the fixture, which unloads again
    assert refcount() == 0 and ctl("del rm") == errno.ENOENT
