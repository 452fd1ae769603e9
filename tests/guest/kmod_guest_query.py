"""GPUSHARE_IOC_QUERY: a process in a registered container's cgroup (or below
it) gets that container's quota; any other process gets ENOENT (from open()
unless it is root).  Runs
inside the guest, from Python (nri_gpushare.kmod.abi) and from C
(tests/guest/kmod_query.c through the uapi header)."""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import os
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.ops import kmod_admin as admin
from tests.guest.kmod_support import (
    CGROUP2,
    DEV,
    NOBODY,
    ROOT,
    ctl,
    errno_of,
    in_child,
    ok,
    read,
    refcount,
)

pytestmark = pytest.mark.usefixtures("kmod")

QUERY_EXE = os.environ.get("GPUSHARE_KMOD_QUERY", "")
MakeCgroup = Callable[[str], Path]


def py_query() -> object:
    r = abi.query()
    if r is None:
        return None
    return [
        r.container_id,
        r.cgroup_id,
        [[q.gpu_index, q.memory_bytes, q.core_percent, q.high_priority] for q in r.quotas],
    ]


def query_in(cgroup: Path | None, uid: int | None = None) -> object:
    return in_child(py_query, cgroup=cgroup, uid=uid)


def c_query_in(cgroup: Path) -> tuple[int, str]:
    def run() -> list[object]:
        p = subprocess.run([QUERY_EXE], capture_output=True, text=True)
        return [p.returncode, p.stdout.strip()]

    code, out = in_child(run, cgroup=cgroup)  # type: ignore[misc]
    return code, out


def setup_two_gpus() -> None:
    ok("gpu 0 16000")
    ok("gpu 1 16000")
    ok("add a 0:4000:30:1,1:2000:10:0")


def test_query_from_the_container_cgroup(cgroups: MakeCgroup) -> None:
    setup_two_gpus()
    cg = cgroups("gs-a")
    other = cgroups("gs-other")
    ok("bind a /gs-a")
    ino = os.stat(cg).st_ino
    assert read(ROOT / "0/a/cgroup") == f"{ino}\n" == read(ROOT / "1/a/cgroup")
    assert read(ROOT / "inst_ctl").endswith(f"bind a {ino}\n")

    want = ["a", ino, [[0, 4000, 30, True], [1, 2000, 10, False]]]
    assert query_in(cg) == want
    assert query_in(cg, uid=NOBODY) == want  # any user may ask about itself
    assert query_in(other) is None
    assert query_in(None) is None  # the test's own cgroup (the root)
    ok("del a")
    assert query_in(cg) is None


def test_a_container_learns_only_its_own_quota(cgroups: MakeCgroup) -> None:
    """QUERY answers for the caller's registration, MEM's INFO for the
    opener's: neither for another container's, not even on a GPU where
    only the other has a quota (ENXIO), as root or not."""
    setup_two_gpus()
    ok("add b 0:3000:20:0")
    cg_a, cg_b = cgroups("gs-own-a"), cgroups("gs-own-b")
    ok("bind a /gs-own-a")
    ok("bind b /gs-own-b")
    want_b = ["b", os.stat(cg_b).st_ino, [[0, 3000, 20, False]]]
    assert query_in(cg_b) == query_in(cg_b, uid=NOBODY) == want_b
    assert query_in(cg_a)[0] == "a"  # type: ignore[index]

    def info(gpu: int) -> list[object]:
        fd = os.open(DEV, os.O_RDWR)
        try:
            m = abi.mem(fd, abi.MEM_INFO, gpu, 0)
            return [0, m.quota, m.used]
        except abi.MemError as e:
            return [e.errno, None, None]
        finally:
            os.close(fd)

    for uid in (None, NOBODY):
        assert in_child(lambda: info(0), cgroup=cg_b, uid=uid) == [0, 3000, 0]
        assert in_child(lambda: info(1), cgroup=cg_b, uid=uid) == [errno.ENXIO, None, None]
    ok("del a")
    ok("del b")


def test_query_from_c(cgroups: MakeCgroup) -> None:
    if not QUERY_EXE:
        pytest.fail("GPUSHARE_KMOD_QUERY (the compiled kmod_query.c) is not set")
    setup_two_gpus()
    cg = cgroups("gs-c")
    other = cgroups("gs-c-other")
    ok("bind a /gs-c")
    ino = os.stat(cg).st_ino
    assert c_query_in(cg) == (0, f"a {ino} 0:4000:30:1 1:2000:10:0")
    assert c_query_in(other) == (2, os.strerror(errno.ENOENT))
    ok("del a")


def test_sub_cgroups_find_their_container(cgroups: MakeCgroup) -> None:
    setup_two_gpus()
    ok("add b 0:100")
    top = cgroups("gs-pod")
    ca = cgroups("gs-pod/a")
    sub = cgroups("gs-pod/a/worker")
    cb = cgroups("gs-pod/b")
    ok("bind a /gs-pod/a")
    ok(f"bind b {os.stat(cb).st_ino}")  # by id, as stat shows it
    assert query_in(sub)[0] == "a"  # type: ignore[index]
    assert query_in(ca)[0] == "a"  # type: ignore[index]
    assert query_in(cb)[0] == "b"  # type: ignore[index]
    assert query_in(top) is None
    ok("bind b /gs-pod")  # the nearest bound ancestor wins
    assert query_in(sub)[0] == "a"  # type: ignore[index]
    assert query_in(top)[0] == "b"  # type: ignore[index]
    ok("del a")
    assert query_in(sub)[0] == "b"  # type: ignore[index]
    ok("del b")


def test_bind_rules(cgroups: MakeCgroup) -> None:
    setup_two_gpus()
    ok("add b 0:100")
    cg = cgroups("gs-bind")
    assert ctl("bind a /gs-missing") == errno.ESRCH
    assert ctl("bind a /gs-bind/cgroup.procs") == errno.ESRCH  # a file, not a cgroup
    assert ctl("bind nobody /gs-bind") == errno.ENOENT
    assert ctl(f"bind a {2**63}") == errno.ESRCH  # no cgroup has this id
    for root in ("/", f"{os.stat(CGROUP2).st_ino}"):  # every process is below the root
        assert ctl(f"bind a {root}") == errno.EINVAL, root
    assert read(ROOT / "0/a/cgroup") == "0\n"
    assert query_in(None) is None  # the test runs in the root cgroup
    ok("bind a /gs-bind")
    ok("bind a /gs-bind")  # binding again is fine
    assert ctl("bind b /gs-bind") == errno.EBUSY
    assert ctl(f"bind b {os.stat(cg).st_ino}") == errno.EBUSY
    assert query_in(cg)[0] == "a"  # type: ignore[index]
    ok("bind a 0")  # unbind
    assert read(ROOT / "0/a/cgroup") == "0\n"
    assert query_in(cg) is None
    ok("bind b /gs-bind")
    assert query_in(cg)[0] == "b"  # type: ignore[index]
    ok("del a")
    ok("del b")


def test_device_node() -> None:
    st = os.stat(DEV)
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert os.major(st.st_rdev) == 10  # a misc device
    fd = os.open(DEV, os.O_RDONLY)  # root may always open it
    try:
        old_query = (2 << 30) | (472 << 16) | (ord("G") << 8) | 1  # 0.1.0's _IOR('G', 1, 472 bytes)
        for request in (abi.IOC_SCHED + 1, old_query):
            with pytest.raises(OSError) as e:
                fcntl.ioctl(fd, request, bytearray(abi.QUERY_SIZE))
            assert e.value.errno == errno.ENOTTY
        quotas = ctypes.create_string_buffer(abi.QUOTA.size)
        with pytest.raises(OSError) as e:
            fcntl.ioctl(fd, abi.IOC_QUERY, abi.pack_query(ctypes.addressof(quotas), 1))
        assert e.value.errno == errno.ENOENT  # the root cgroup has no registration
    finally:
        os.close(fd)
    assert CGROUP2.joinpath("cgroup.controllers").exists()


def open_dev() -> int:
    """0 when open(/dev/gpushare) succeeds (the descriptor is closed again), else the errno."""
    return errno_of(lambda: os.close(os.open(DEV, os.O_RDONLY)))


def test_only_callers_with_an_answer_may_open(cgroups: MakeCgroup) -> None:
    """An open descriptor pins the module, so open() is refused (ENOENT) to a
    caller that is neither CAP_SYS_ADMIN nor in a registered container: an
    unprivileged user cannot keep the module from unloading."""
    setup_two_gpus()
    cg = cgroups("gs-open")
    sub = cgroups("gs-open/sub")
    other = cgroups("gs-open-other")
    assert in_child(open_dev, uid=NOBODY) == errno.ENOENT
    assert in_child(open_dev, cgroup=cg, uid=NOBODY) == errno.ENOENT  # not bound yet
    ok("bind a /gs-open")
    assert in_child(open_dev, cgroup=cg, uid=NOBODY) == 0
    assert in_child(open_dev, cgroup=sub, uid=NOBODY) == 0
    assert in_child(open_dev, cgroup=other, uid=NOBODY) == errno.ENOENT
    assert in_child(open_dev, uid=NOBODY) == errno.ENOENT
    assert in_child(open_dev, cgroup=other) == 0  # root (CAP_SYS_ADMIN)
    assert refcount() == 1  # refused opens took no reference
    # The Python client says None for "nothing registered for you", either way.
    assert query_in(other, uid=NOBODY) is None
    assert query_in(None, uid=NOBODY) is None
    ok("del a")
    assert in_child(open_dev, cgroup=cg, uid=NOBODY) == errno.ENOENT


def test_a_held_descriptor_outlives_its_registration(cgroups: MakeCgroup) -> None:
    """A container's process opened the device; after `del` it learns ENOENT
    from the ioctl, and its descriptor pins the module until it is closed."""
    setup_two_gpus()
    cg = cgroups("gs-held")
    ok("bind a /gs-held")
    rfd, wfd = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            (cg / "cgroup.procs").write_text("0\n")
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            fd = os.open(DEV, os.O_RDONLY)
            os.write(wfd, b"o")
            os.read(done_r, 1)  # the parent deleted the registration
            quotas = ctypes.create_string_buffer(abi.QUOTA.size * 2)
            try:
                fcntl.ioctl(fd, abi.IOC_QUERY, abi.pack_query(ctypes.addressof(quotas), 2))
            except OSError as e:
                code = 0 if e.errno == errno.ENOENT else 3
            os.close(fd)
        finally:
            os._exit(code)
    assert os.read(rfd, 1) == b"o"
    assert refcount() == 2  # the registration and the open descriptor
    ok("del a")
    assert refcount() == 1
    os.write(done_w, b"d")
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    for fd in (rfd, wfd, done_r, done_w):
        os.close(fd)
    assert refcount() == 0


def test_a_descriptor_passed_out_of_its_container_pins_the_module(
    cgroups: MakeCgroup,
) -> None:
    """The open() gate is checked once: a container's process may pass its
    descriptor (SCM_RIGHTS) to a process outside, which then keeps the
    module loaded after the container is deleted and gone.  uninstall's
    holder listing names such a process, but not a descriptor still in
    flight in a unix socket (sent, never received): /proc/<pid>/fd shows
    only the socket.  kmod/README.md says so."""
    setup_two_gpus()
    cg = cgroups("gs-pass")
    ok("bind a /gs-pass")
    outside, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def send() -> object:
        fd = os.open(DEV, os.O_RDONLY)
        fds = array.array("i", [fd])
        inside.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        return 0

    try:
        in_child(send, cgroup=cg, uid=NOBODY)  # the container's process is gone
        inside.close()
        ok("del a")
        assert refcount() == 1  # no registration; the descriptor in flight
        rdev = admin.device_number()
        assert rdev is not None
        assert admin.holders(rdev) == []
        msg, fds, _, _ = outside.recvmsg(1, socket.CMSG_SPACE(4))
        assert msg == b"x" and fds
        held = array.array("i", fds[0][2])[0]
        assert admin.holders(rdev) == [(os.getpid(), read(f"/proc/{os.getpid()}/comm").strip())]
        os.close(held)
    finally:
        outside.close()
        inside.close()
    assert refcount() == 0
