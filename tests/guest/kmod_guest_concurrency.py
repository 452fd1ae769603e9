"""Concurrent writers, readers and rmmod against gpushare.ko inside the guest:
no crash (the guest panics on any oops), no deadlock, and afterwards the
accounting and the refcount still agree with the registry."""

from __future__ import annotations

import errno
import os
import random

import pytest

from tests.guest.kmod_support import (
    CTL,
    ROOT,
    ctl,
    load,
    loaded,
    ok,
    read,
    refcount,
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
