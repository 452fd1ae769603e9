"""Concurrent writers, readers and rmmod against gpushare.ko inside the guest:
no crash (the guest panics on any oops), no deadlock, and afterwards the
accounting and the refcount still agree with the registry."""

from __future__ import annotations

import errno
import os
import random
import select
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_support import (
    CTL,
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
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

GPUS = {0: 1000, 1: 1000}
IDS = [f"k{i}" for i in range(8)]


def worker(seed: int, rounds: int) -> int:
    rng = random.Random(seed)
    unexpected = 0
    allowed = {0, errno.EEXIST, errno.ENOENT, errno.ENOSPC, errno.EIO}
    for _ in range(rounds):
        cid, gpu = rng.choice(IDS), rng.choice(list(GPUS))
        op = rng.randrange(5)
        if op == 0:
            err = ctl(f"add {cid} {gpu}:{rng.choice([50, 200, 400])}:{rng.choice([0, 20, 40])}")
        elif op == 1:
            err = ctl(f"del {cid}")
        elif op == 2:
            name = rng.choice(["memsize", "weight"])
            v = rng.choice([1, 30, 300] if name == "memsize" else [0, 30, 60])
            err = write(ROOT / f"{gpu}/{cid}/{name}", str(v))
        elif op == 3:
            try:
                read(ROOT / f"{gpu}/{cid}/meminfo")
                err = 0
            except OSError as e:
                err = e.errno or -1
        else:
            read(CTL)
            err = 0
        if err not in allowed:
            unexpected += 1
            os.write(
                2, f"worker {seed}: op {op} on {cid}/{gpu}: {errno.errorcode.get(err)}\n".encode()
            )
    return unexpected


def test_concurrent_writers_keep_the_books() -> None:
    for g, mem in GPUS.items():
        ok(f"gpu {g} {mem}")
    pids = []
    for seed in range(3):
        pid = os.fork()
        if pid == 0:
            code = 100
            try:
                code = min(worker(seed, 300), 99)
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0, 0, 0], "a worker got an unexpected errno"

    regs = [line.split() for line in read(CTL).splitlines() if line.startswith("add ")]
    assert refcount() == len(regs)
    for g, total in GPUS.items():
        quotas = [item.split(":") for _, _, spec in regs for item in spec.split(",")]
        mine = [(int(m), int(w)) for gi, m, w, _ in quotas if int(gi) == g]
        assert int(read(ROOT / f"{g}/free_memsize")) == total - sum(m for m, _ in mine)
        assert int(read(ROOT / f"{g}/free_weight")) == 100 - sum(w for _, w in mine)
        assert int(read(ROOT / f"{g}/nr_inst")) == len(mine)
    for _, cid, _ in regs:
        ok(f"del {cid}")


def test_rmmod_racing_registrations() -> None:
    """rmmod succeeds only in a moment with nothing registered; a registration
    racing it either pins the module first or is refused with ENODEV/ENOENT."""
    ok("gpu 0 1000")

    fine = (0, errno.ENOENT, errno.ENODEV, errno.EEXIST, errno.EIO)

    def churn() -> bool:
        for _ in range(400):
            for cmd in ("add r 0:10", "del r"):
                if ctl(cmd) not in fine:
                    return False
            if not loaded():
                break
        return True

    pid = os.fork()
    if pid == 0:
        os._exit(0 if churn() else 1)
    while unload() != 0:
        pass
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert not loaded() and not ROOT.exists()
    load()
    assert refcount() == 0


VARIANT_A = "0:1000:10,1:1000:10"
VARIANT_B = "0:3000:20:1"


def fork_child(fn: Callable[[], object], cgroup: Path | None = None, uid: int | None = None) -> int:
    """Run fn() in a child (moved into `cgroup`, switched to `uid`); exits 0
    when fn() returns True.  Returns the pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text("0\n")
            if uid is not None:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            code = 0 if fn() is True else 1
        except BaseException as e:  # noqa: BLE001 - report, never return into pytest
            os.write(2, f"child failed: {e!r}\n".encode())
        finally:
            os._exit(code)
    return pid


def consistent(r: abi.QueryResult, ino: int) -> bool:
    quotas = [(q.gpu_index, q.memory_bytes, q.core_percent, q.high_priority) for q in r.quotas]
    a = len(quotas) == 2 and quotas[1] == (1, 1000, 10, False) and quotas[0][1] in (1000, 2000)
    a = a and quotas[0][0] == 0 and quotas[0][2:] == (10, False)
    b = quotas == [(0, 3000, 20, True)]
    return r.container_id == "q" and r.cgroup_id == ino and (a or b)


def test_queries_race_commands(cgroups: Callable[[str], Path]) -> None:
    """QUERY walks the registry under RCU while add, bind, per-file writes,
    unbind and del run: every answer is ENOENT or one state the registration
    really had, and the books balance afterwards."""
    ok("gpu 0 100000")
    ok("gpu 1 100000")
    cg = cgroups("gs-cq")
    sub = cgroups("gs-cq/w")
    ino = os.stat(cg).st_ino
    # The writer holds the only write end: its exit makes stop_r readable (EOF).
    stop_r, stop_w = os.pipe()

    def stopped() -> bool:
        return bool(select.select([stop_r], [], [], 0)[0])

    def writer() -> bool:
        rng = random.Random(7)
        for i in range(150):
            spec = VARIANT_A if i % 2 else VARIANT_B
            assert ctl(f"add q {spec}") == 0
            assert ctl(f"bind q {rng.choice(['/gs-cq', str(ino)])}") == 0
            if spec == VARIANT_A:
                assert write(ROOT / "0/q/memsize", "2000") == 0
            if rng.random() < 0.3:
                assert ctl("bind q 0") == 0
            assert ctl("del q") == 0
        return True

    def reader() -> bool:
        """Root (may always open): every answer ENOENT or consistent."""
        os.close(stop_w)
        while not stopped():
            r = abi.query()
            if r is not None and not consistent(r, ino):
                os.write(2, f"inconsistent answer: {r}\n".encode())
                return False
        return True

    def nobody_reader() -> bool:
        os.close(stop_w)
        while not stopped():
            try:
                r = abi.query()
            except OSError as e:
                os.write(2, f"nobody: {e!r}\n".encode())
                return False
            if r is not None and not consistent(r, ino):
                return False
        return True

    readers = [
        fork_child(reader, sub),
        fork_child(reader, cg),
        fork_child(nobody_reader, sub, NOBODY),
    ]
    w = fork_child(writer)
    os.close(stop_w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in [w, *readers]]
    os.close(stop_r)
    assert codes == [0, 0, 0, 0]
    assert registered() == [] and refcount() == 0
    assert read(ROOT / "0/free_memsize") == "100000\n"
