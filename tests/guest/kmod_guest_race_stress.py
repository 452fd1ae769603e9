"""General stress of gpushare.ko: random registry operations from several
threads (gpu, add, del, bind by path and by id, procfs writes, the dump, and
QUERY through /dev/gpushare via nri_gpushare.kmod.abi), reload cycles, and
the books checked every second with the world paused:

- the registry (the inst_ctl dump) is exactly what was added minus deleted;
- /sys/module/gpushare/refcnt is the number of registered containers, plus
  one per open /dev/gpushare descriptor if the module counts those;
- on every GPU free_memsize = total_memsize - the containers' memsize,
  free_weight = 100 - their weights, nr_inst = their number;
- one cgroup is bound to at most one container.

20 s in CI; $GPUSHARE_STRESS_S sets the length for long local runs.
"""

from __future__ import annotations

import collections
import errno
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_race_support import mark, need_two_cpus, seconds
from tests.guest.kmod_support import CGROUP2, CTL, DEV, ROOT, ctl, load, ok, read, unload, write

pytestmark = pytest.mark.usefixtures("kmod")

MakeCgroup = Callable[[str], Path]
GPUS = {0: 4000, 1: 4000, 2: 2000}
WORKERS = 4
IDS_PER_WORKER = 4
REFCNT = Path("/sys/module/gpushare/refcnt")
SELF_CGROUP = "gs-st-self"  # this process's cgroup: QUERY finds what is bound to it
CGROUPS = ("gs-st-0", "gs-st-1", "gs-st-2", SELF_CGROUP)
OUR_ID = re.compile(r"s[0-9]+-[0-9]+")


class Pause:
    """Workers run each operation under shared(); exclusive() waits until none
    runs and holds new ones back, so the checker sees a quiescent module."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = 0
        self.paused = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self.cond:
            while self.paused:
                self.cond.wait()
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self.cond:
            self.paused = True
            while self.active:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.paused = False
                self.cond.notify_all()


class Stress:
    def __init__(self, cgroup_ids: list[int], seed: int) -> None:
        self.model: dict[str, set[int]] = {}  # id -> its GPUs; a worker owns its ids
        self.cgroup_ids = cgroup_ids
        self.pause = Pause()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.ops: collections.Counter[str] = collections.Counter()
        self.seed = seed

    def declare(self) -> None:
        for g, total in GPUS.items():
            ok(f"gpu {g} {total}")

    def worker(self, w: int) -> None:
        rng = random.Random(self.seed * 100 + w)
        try:
            while not self.stop.is_set():
                with self.pause.shared():
                    self.one(rng, f"s{w}-{rng.randrange(IDS_PER_WORKER)}")
        except BaseException as e:  # noqa: BLE001 - the checker reports it
            self.errors.append(f"worker {w}: {e!r}")

    def one(self, rng: random.Random, cid: str) -> None:
        gpus = self.model.get(cid)
        known = gpus is not None
        gone = {errno.ENOENT}
        r = rng.random()
        if r < 0.25:
            op = "add"
            chosen = rng.sample(sorted(GPUS), rng.randint(1, 2))
            spec = ",".join(
                f"{g}:{rng.choice([100, 300, 700])}:{rng.choice([0, 5, 20])}:{rng.randrange(2)}"
                for g in chosen
            )
            err = ctl(f"add {cid} {spec}")
            expect = {errno.EEXIST} if known else {0, errno.ENOSPC}
            if err == 0:
                self.model[cid] = set(chosen)
        elif r < 0.42:
            op = "del"
            err = ctl(f"del {cid}")
            expect = {0} if known else gone
            if err == 0:
                del self.model[cid]
        elif r < 0.52:
            op = "bind-path"
            err = ctl(f"bind {cid} /{rng.choice(CGROUPS)}")
            expect = {0, errno.EBUSY} if known else gone
        elif r < 0.57:
            op = "bind-id"
            err = ctl(f"bind {cid} {rng.choice([0, *self.cgroup_ids])}")
            expect = {0, errno.EBUSY} if known else gone
        elif r < 0.72:
            op = "container-file"
            g = rng.choice(sorted(GPUS))
            name, v = rng.choice(
                [
                    ("memsize", rng.choice([50, 200, 600])),
                    ("weight", rng.choice([0, 10, 30])),
                    ("highprio", rng.randrange(2)),
                ]
            )
            err = write(ROOT / f"{g}/{cid}/{name}", str(v))
            expect = {0, errno.ENOSPC} if gpus is not None and g in gpus else gone
        elif r < 0.77:
            op = "gpu-file"
            g = rng.choice(sorted(GPUS))
            name, v = rng.choice(
                [
                    ("max_inst", rng.choice([4, 16, 25])),
                    ("policy", rng.randrange(6)),
                    ("prio_ratio", rng.choice([20, 50, 99])),
                ]
            )
            err = write(ROOT / f"{g}/{name}", str(v))
            expect = {0, errno.ENOSPC}
        elif r < 0.8:
            op = "gpu"
            g = rng.choice(sorted(GPUS))
            err = ctl(f"gpu {g} {GPUS[g] * rng.choice([1, 2])}")
            expect = {0, errno.ENOSPC}
        elif r < 0.93:
            op = "query"
            result = abi.query()
            err, expect = 0, {0}
            if result is not None and not OUR_ID.fullmatch(result.container_id):
                self.errors.append(f"QUERY answered {result}")
        else:
            op = "dump"
            read(CTL)
            err, expect = 0, {0}
        self.ops[op] += 1
        if err not in expect:
            self.errors.append(
                f"{op} {cid} (registered: {known}): {errno.errorcode.get(err, err)},"
                f" expected {sorted(errno.errorcode.get(e, str(e)) for e in expect)}"
            )

    def check(self, pin: int) -> None:
        """The books, with no operation running."""
        adds: dict[str, list[list[int]]] = {}
        binds: dict[str, int] = {}
        for line in read(CTL).splitlines():
            word, cid, rest = line.split()
            if word == "add":
                adds[cid] = [[int(x) for x in q.split(":")] for q in rest.split(",")]
            elif word == "bind":
                binds[cid] = int(rest)
        assert sorted(adds) == sorted(self.model), "registry != added minus deleted"
        for cid, quotas in adds.items():
            assert {q[0] for q in quotas} == self.model[cid], cid
        assert set(binds) <= set(adds)
        assert len(set(binds.values())) == len(binds), f"a cgroup bound twice: {binds}"
        assert int(REFCNT.read_text()) == len(adds), "refcnt != registered containers"
        fd = os.open(DEV, os.O_RDONLY)
        try:
            assert int(REFCNT.read_text()) == len(adds) + pin, "refcnt with a handle open"
        finally:
            os.close(fd)
        for g in GPUS:
            mine = [q for quotas in adds.values() for q in quotas if q[0] == g]
            total = int(read(ROOT / f"{g}/total_memsize"))
            assert int(read(ROOT / f"{g}/free_memsize")) == total - sum(q[1] for q in mine)
            assert int(read(ROOT / f"{g}/free_weight")) == 100 - sum(q[2] for q in mine)
            assert int(read(ROOT / f"{g}/nr_inst")) == len(mine)

    def reload(self) -> None:
        """Delete everything, unload (must succeed: nothing holds it), load again."""
        for cid in list(self.model):
            ok(f"del {cid}")
            del self.model[cid]
        err = unload()
        assert err == 0, f"rmmod with nothing registered: {os.strerror(err)}"
        load()
        self.declare()


def handle_pins() -> int:
    """1 if an open /dev/gpushare holds a module reference, else 0."""
    before = int(REFCNT.read_text())
    fd = os.open(DEV, os.O_RDONLY)
    try:
        pin = int(REFCNT.read_text()) - before
    finally:
        os.close(fd)
    assert pin in (0, 1), pin
    return pin


def test_random_operations_threads_and_reloads(cgroups: MakeCgroup) -> None:
    need_two_cpus()
    duration = seconds("GPUSHARE_STRESS_S", 20)
    seed = int(os.environ.get("GPUSHARE_RANDOM_SEED") or random.randrange(1 << 30))
    cgroup_ids = [cgroups(name).stat().st_ino for name in CGROUPS]
    stress = Stress(cgroup_ids, seed)
    stress.declare()
    pin = handle_pins()
    (CGROUP2 / SELF_CGROUP / "cgroup.procs").write_text("0\n")
    threads = [threading.Thread(target=stress.worker, args=(w,)) for w in range(WORKERS)]
    mark(f"stress: {WORKERS} threads for {duration:g} s, seed {seed}")
    checks = reloads = 0
    try:
        for t in threads:
            t.start()
        until = time.monotonic() + duration
        while time.monotonic() < until and not stress.errors:
            time.sleep(1)
            with stress.pause.exclusive():
                stress.check(pin)
                checks += 1
                if checks % 4 == 0:
                    stress.reload()
                    reloads += 1
    finally:
        stress.stop.set()
        for t in threads:
            t.join()
        (CGROUP2 / "cgroup.procs").write_text("0\n")
    assert not stress.errors, f"seed {seed}: " + "; ".join(stress.errors[:10])
    stress.check(pin)
    print(f"stress seed {seed}: {checks} checks, {reloads} reloads, {dict(stress.ops)}")
    assert checks >= duration // 2 and reloads >= 1
    for op in ("add", "del", "bind-path", "bind-id", "container-file", "query"):
        assert stress.ops[op], f"no {op} ran: {dict(stress.ops)}"
    for cid in list(stress.model):
        ok(f"del {cid}")
