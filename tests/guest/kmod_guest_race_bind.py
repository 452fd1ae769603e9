"""`bind <id> <cgroup-path>` racing the creation and removal of that cgroup.

cgroup_create() links the new cgroup's kernfs node (so cgroup_get_from_path()
finds it) before it sets cgrp->kn and cgrp->self.parent; gpushare.ko up to
ff15b10 then read cgrp->kn->id through NULL in inst_ctl_write (`BUG: kernel
NULL pointer dereference`, the guest panics).  Every bind must instead end
bound to a fully built cgroup (one the mkdir side saw) or with ESRCH, never
an oops, EINVAL or another error.

Two tests: a stress that just loops mkdir/rmdir against binds for a while
(it crashed the old module within a few seconds), and a deterministic one
with tests/guest/kprobe_widen/gs_widen.ko, which busy-waits 20 ms right after
kernfs_create_dir_ns() returns for our cgroup, so the first mkdir opens the
window wide.
"""

from __future__ import annotations

import collections
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest.kmod_race_support import (
    delete_module,
    finit_module,
    fork,
    mark,
    names,
    need_two_cpus,
    poll,
    seconds,
)
from tests.guest.kmod_support import CGROUP2, CTL, ROOT, ok, read

pytestmark = pytest.mark.usefixtures("kmod")

BIND_OK = {0, errno.ESRCH}
WIDEN_PREFIX = "gswiden"
WIDEN_MS = 20


def churn(path: Path, until: float, rounds: int, log: Path, pause: float = 0.0) -> int:
    """mkdir/rmdir path until `until` or for `rounds`; logs each cgroup's id and
    how long its mkdir took."""
    ids = []
    done = 0
    while done < rounds and time.monotonic() < until:
        started = time.monotonic()
        os.mkdir(path)
        ids.append(f"{os.stat(path).st_ino} {time.monotonic() - started:.6f}")
        os.rmdir(path)
        done += 1
        time.sleep(pause)
    log.write_text("".join(f"{line}\n" for line in ids))
    return 0


def churn_fast(path: Path, until: float) -> int:
    """mkdir/rmdir path as fast as Python can until `until`."""
    mkdir, rmdir, now = os.mkdir, os.rmdir, time.monotonic
    while now() < until:
        for _ in range(100):
            mkdir(path)
            rmdir(path)
    return 0


def bind_while(pid: int, cid: str, path: str) -> tuple[collections.Counter[int], list[int], int]:
    """Bind cid to path until the child pid exits, as fast as one descriptor
    allows: (errno counts, the cgroup ids bound, the child's exit status)."""
    counts: collections.Counter[int] = collections.Counter()
    bound = []
    command = f"bind {cid} {path}\n".encode()
    fd = os.open(CTL, os.O_WRONLY)
    cgroup = os.open(ROOT / f"0/{cid}/cgroup", os.O_RDONLY)
    try:
        while (status := poll(pid)) is None:
            for _ in range(50):
                try:
                    os.write(fd, command)
                    counts[0] += 1
                    bound.append(int(os.pread(cgroup, 64, 0)))
                except OSError as e:
                    counts[e.errno or -1] += 1
    finally:
        os.close(cgroup)
        os.close(fd)
    return counts, bound, status


def check_bindings(counts: collections.Counter[int], bound: list[int], made: set[int]) -> None:
    """Every bind ESRCH or bound to one of the cgroups made (0: the module
    may drop a binding the moment its cgroup dies)."""
    assert set(counts) <= BIND_OK, f"bind outcomes: {names(counts)}"
    strays = sorted({cg for cg in bound if cg and cg not in made})
    assert not strays, f"bound to cgroups never made here: {strays[:5]}"


def cgroup_id(path: Path) -> int:
    """A new cgroup's id (its inode number); the cgroup is removed again."""
    path.mkdir()
    try:
        return path.stat().st_ino
    finally:
        path.rmdir()


def test_bind_path_racing_mkdir_rmdir() -> None:
    """The plain race, no help, for several times what it took to crash ff15b10."""
    need_two_cpus()
    ok("gpu 0 1000")
    ok("add race 0:10")
    path = CGROUP2 / "gs-bind-race"
    first = cgroup_id(path)
    until = time.monotonic() + seconds("GPUSHARE_RACE_S", 20)
    pid = fork(lambda: churn_fast(path, until))
    mark("bind race: mkdir/rmdir against bind")
    counts, bound, status = bind_while(pid, "race", f"/{path.name}")
    last = cgroup_id(path)
    assert status == 0, "the mkdir/rmdir child failed (see stderr)"
    # Cgroup ids grow: those made meanwhile lie between the two made here.
    check_bindings(counts, bound, set(range(first + 1, last)))
    print(f"bind race: {names(counts)}; about {last - first} cgroups made")
    assert counts[0] and counts[errno.ESRCH], f"the race was not exercised: {names(counts)}"
    ok("del race")


@pytest.fixture
def widen() -> Iterator[Path]:
    """gs_widen.ko loaded for cgroups named gswiden*; its hit counter."""
    ko = os.environ.get("GPUSHARE_WIDEN_KO")
    assert ko, "GPUSHARE_WIDEN_KO must name the built kprobe_widen/gs_widen.ko (test_kmod.py)"
    err = finit_module(ko, f"prefix={WIDEN_PREFIX} delay_ms={WIDEN_MS}")
    assert err == 0, f"insmod {ko}: {os.strerror(err)}"
    try:
        yield Path("/sys/module/gs_widen/parameters/hits")
    finally:
        err = delete_module("gs_widen")
        assert err == 0, f"rmmod gs_widen: {os.strerror(err)}"


def test_bind_path_in_the_widened_window(widen: Path, tmp_path: Path) -> None:
    """With the window 20 ms wide, binds land in it at every mkdir: the old
    module oopsed on the first one."""
    need_two_cpus()
    rounds = 8
    ok("gpu 0 1000")
    ok("add wide 0:10")
    path = CGROUP2 / f"{WIDEN_PREFIX}-bind"
    log = tmp_path / "made"
    other = CGROUP2 / "gs-not-widened"
    other.mkdir()  # another name: not delayed
    other.rmdir()
    assert int(read(widen)) == 0
    pid = fork(lambda: churn(path, time.monotonic() + 60, rounds, log, pause=0.02))
    mark("widened bind race: mkdir/rmdir against bind")
    counts, bound, status = bind_while(pid, "wide", f"/{path.name}")
    assert status == 0, "the mkdir/rmdir child failed (see stderr)"
    lines = [line.split() for line in log.read_text().splitlines()]
    check_bindings(counts, bound, {int(ino) for ino, _ in lines})
    mkdir_s = [float(t) for _, t in lines]
    took = f"{min(mkdir_s):.3f}..{max(mkdir_s):.3f} s"
    print(f"widened bind race: {names(counts)}; mkdir took {took}")
    # The kretprobe's own count proves each window was widened; mkdir's
    # duration is only printed (mdelay under TCG is not wall-clock exact).
    assert int(read(widen)) == rounds, "the kretprobe did not widen every mkdir"
    # The binder kept going through every window (ESRCH or bound meanwhile).
    assert sum(counts.values()) >= 2 * rounds, names(counts)
    ok("del wide")
