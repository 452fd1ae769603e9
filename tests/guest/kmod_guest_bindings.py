"""A binding does not outlive its cgroup: once the bound cgroup is removed,
the container reads as unbound (its `cgroup` file says 0, the inst_ctl dump
has no `bind` line, so the dump replays), and the cgroup is free to be bound
again when it is recreated."""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_support import CGROUP2, CTL, ROOT, ctl, in_child, ok, read, value

pytestmark = pytest.mark.usefixtures("kmod")

MakeCgroup = Callable[[str], Path]


def answer_in(cgroup: Path) -> object:
    """The container ID QUERY gives a process in `cgroup`, or None."""

    def ask() -> object:
        r = abi.query()
        return r.container_id if r else None

    return in_child(ask, cgroup=cgroup)


def test_removed_cgroup_unbinds(cgroups: MakeCgroup) -> None:
    ok("gpu 0 16000")
    ok("add a 0:100")
    ok("add b 0:200")
    cg = cgroups("gs-stale")
    ok("bind a /gs-stale")
    ino = os.stat(cg).st_ino
    assert value(ROOT / "0/a/cgroup") == ino
    cg.rmdir()
    assert value(ROOT / "0/a/cgroup") == 0  # at once, before any command
    dump = read(CTL)
    assert dump == "gpu 0 16000\nadd a 0:100:0:0\nadd b 0:200:0:0\n"
    assert ctl(f"bind a {ino}") == errno.ESRCH  # the old id names nothing

    # Recreated at the same path: a new cgroup, bound to nobody, free for b.
    cg.mkdir()
    assert os.stat(cg).st_ino != ino
    assert value(ROOT / "0/a/cgroup") == 0
    assert answer_in(cg) is None
    ok("bind b /gs-stale")
    assert answer_in(cg) == "b"
    ok("del a")
    ok("del b")


def test_dump_replays_after_a_cgroup_is_removed(cgroups: MakeCgroup) -> None:
    """The README's promise: writing the dump back rebuilds the registry."""
    ok("gpu 0 16000")
    ok("add a 0:100:10:1")
    ok("add b 0:200")
    keep = cgroups("gs-keep")
    gone = cgroups("gs-gone")
    ok("bind a /gs-keep")
    ok("bind b /gs-gone")
    gone.rmdir()
    dump = read(CTL)
    assert dump.endswith(f"bind a {os.stat(keep).st_ino}\n") and "bind b" not in dump
    ok("del a")
    ok("del b")
    for line in dump.splitlines():
        ok(line)
    assert read(CTL) == dump
    ok("del a")
    ok("del b")


def test_ancestor_answers_for_a_recreated_child(cgroups: MakeCgroup) -> None:
    """The pod's binding answers for a container cgroup that lost its own
    binding, as for any other sub-cgroup; the container's `cgroup` file says 0
    so that whoever manages it sees the binding is gone."""
    ok("gpu 0 16000")
    ok("add pod 0:100")
    ok("add a 0:200")
    cgroups("gs-p")
    child = cgroups("gs-p/a")
    ok("bind pod /gs-p")
    ok("bind a /gs-p/a")
    assert answer_in(child) == "a"
    child.rmdir()
    child.mkdir()
    assert value(ROOT / "0/a/cgroup") == 0
    assert answer_in(child) == "pod"
    ok("bind a /gs-p/a")
    assert answer_in(child) == "a"
    ok("del a")
    ok("del pod")


def test_bind_paths_through_files_and_odd_components(cgroups: MakeCgroup) -> None:
    ok("gpu 0 16000")
    ok("add a 0:100")
    cg = cgroups("gs-odd")
    for bad in ("/gs-odd/cgroup.procs", "/gs-odd/cgroup.procs/x", "/gs-odd/..", "/gs-odd/."):
        assert ctl(f"bind a {bad}") == errno.ESRCH, bad
    fd = os.open(cg / "cgroup.procs", os.O_RDONLY)  # an open file's node has state
    try:
        assert ctl("bind a /gs-odd/cgroup.procs/x") == errno.ESRCH
    finally:
        os.close(fd)
    ok("bind a //gs-odd//")  # empty components are skipped, as kernfs does
    assert value(ROOT / "0/a/cgroup") == os.stat(cg).st_ino
    assert CGROUP2.is_dir()
    ok("del a")


CLONE_NEWCGROUP = 0x02000000


def test_bind_paths_and_ids_in_a_cgroup_namespace(cgroups: MakeCgroup) -> None:
    """Paths are relative to the writer's cgroup namespace root, which may
    be bound (it is not the cgroup2 root); `..` and ids of cgroups outside
    the namespace name nothing."""
    ok("gpu 0 16000")
    ok("add a 0:100")
    ns = cgroups("gs-ns")
    sub = cgroups("gs-ns/sub")
    out = cgroups("gs-ns-out")

    def inside() -> object:
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(CLONE_NEWCGROUP) == 0, os.strerror(ctypes.get_errno())
        r = [ctl("bind a /"), value(ROOT / "0/a/cgroup")]
        r += [ctl("bind a //sub/"), value(ROOT / "0/a/cgroup")]
        r += [ctl(f"bind a {os.stat(out).st_ino}"), ctl("bind a /../gs-ns-out")]
        return r

    assert in_child(inside, cgroup=ns) == [
        0,
        os.stat(ns).st_ino,
        0,
        os.stat(sub).st_ino,
        errno.ESRCH,
        errno.ESRCH,
    ]
    assert value(ROOT / "0/a/cgroup") == os.stat(sub).st_ino
    assert ctl("bind a /") == errno.EINVAL  # the real root, from here
    ok("del a")


def dying_below(cgroup: Path) -> int:
    for line in (cgroup / "cgroup.stat").read_text().splitlines():
        key, val = line.split()
        if key == "nr_dying_descendants":
            return int(val)
    raise AssertionError("no nr_dying_descendants")


def test_a_removed_cgroup_is_released_without_a_command(cgroups: MakeCgroup) -> None:
    """The binding's reference on a removed cgroup is dropped by the
    module's periodic reaper (every 5 s while bindings are kept), not only
    at the next command: a quiet registry must not pin a dead cgroup's
    memory for ever.  Before the reaper it stayed dying until a command."""
    ok("gpu 0 16000")
    ok("add a 0:100")
    parent = cgroups("gs-reap")
    child = cgroups("gs-reap/c")
    ok("bind a /gs-reap/c")
    child.rmdir()
    assert value(ROOT / "0/a/cgroup") == 0  # unbound at once, for readers
    assert dying_below(parent) == 1  # pinned by the binding's reference
    deadline = time.monotonic() + 30
    while dying_below(parent) and time.monotonic() < deadline:
        read(ROOT / "0/a/cgroup")  # reads are not commands: they reap nothing
        time.sleep(0.5)
    assert dying_below(parent) == 0
    ok("del a")
