"""The memory ledger (GPUSHARE_IOC_MEM) against the real module, inside the
guest: processes of one container share its quota, every reservation is
returned when its file is released (exit, SIGKILL, the last of a fork's
copies), a deleted container's reservations stay charged to the GPU as
orphaned memory until they are released, memsize is never set below what is
used, a descriptor acts for its opener's container, and an open descriptor
keeps the module loaded.  Each process is an Agent (kmod_support.py)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import resource
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.kmod.readings import parse_meminfo
from tests.guest.kmod_support import (
    DEV,
    NOBODY,
    ROOT,
    Agent,
    ctl,
    in_child,
    load,
    meminfo,
    ok,
    read,
    refcount,
    snapshot,
    unload,
    value,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

MakeCgroup = Callable[[str], Path]
EDQUOT = errno.EDQUOT
CLONE_NEWPID = 0x20000000


def container(cgroups: MakeCgroup, cid: str, spec: str) -> Path:
    """Register cid with spec and bind it to a new cgroup of the same name."""
    ok(f"add {cid} {spec}")
    cg = cgroups(f"gs-{cid}")
    ok(f"bind {cid} /gs-{cid}")
    return cg


def test_processes_share_one_quota(cgroups: MakeCgroup) -> None:
    ok("gpu 0 10000")
    ok("gpu 1 10000")
    ok("gpu 2 10000")
    cg = container(cgroups, "c", "0:1000,1:500")
    with Agent.spawn(cg, NOBODY) as a, Agent.spawn(cg, NOBODY) as b, Agent.spawn(cg) as c:
        fa, fb, fc = a.open(), b.open(), c.open()
        assert min(fa, fb, fc) >= 0
        assert a.info(fa, 0) == (0, (1000, 0, 0))
        assert a.reserve(fa, 0, 500) == (0, (1000, 500, 500))
        assert b.reserve(fb, 0, 500) == (0, (1000, 1000, 500))
        # The third is refused, with nothing reserved, and told why.
        assert c.reserve(fc, 0, 1) == (EDQUOT, (1000, 1000, 0))
        assert c.reserve(fc, 0, 2**64 - 1) == (EDQUOT, (1000, 1000, 0))
        assert c.info(fc, 0) == (0, (1000, 1000, 0))
        assert meminfo(0, "c") == (0, {a.pid: 500, b.pid: 500})
        assert value(ROOT / "0/c/memused") == 1000
        # Each GPU has its own ledger; a GPU without a quota has none.
        assert c.reserve(fc, 1, 500) == (0, (500, 500, 500))
        assert c.reserve(fc, 1, 1) == (EDQUOT, (500, 500, 500))
        assert meminfo(1, "c") == (0, {c.pid: 500})
        for gpu in (2, 3, 15, 16, 2**32 - 1):
            assert c.reserve(fc, gpu, 1) == (errno.ENXIO, None)
        # A release is bounded by what the file holds, not the container.
        assert a.release(fa, 0, 501) == (errno.EINVAL, (1000, 1000, 500))
        assert a.release(fa, 0, 200) == (0, (1000, 800, 300))
        assert c.reserve(fc, 0, 200) == (0, (1000, 1000, 200))
        assert a.reserve(fa, 0, 0) == (0, (1000, 1000, 300))  # 0 bytes always fit
        assert meminfo(0, "c") == (0, {a.pid: 300, b.pid: 500, c.pid: 200})
        # A second descriptor of the same process adds to its line.
        fa2 = a.open()
        assert a.release(fa, 0, 100) == (0, (1000, 900, 200))
        assert a.reserve(fa2, 0, 50) == (0, (1000, 950, 50))
        assert meminfo(0, "c") == (50, {a.pid: 250, b.pid: 500, c.pid: 200})
        assert a.close(fa2) == 0
        assert meminfo(0, "c") == (100, {a.pid: 200, b.pid: 500, c.pid: 200})
        # The GPUs' own accounting is about memsize, not what is used.
        assert value(ROOT / "0/free_memsize") == 9000
        assert value(ROOT / "0/orphaned_memsize") == 0
        a.exit()
        b.exit()
        assert meminfo(0, "c") == (800, {c.pid: 200})
    assert meminfo(0, "c") == (1000, {}) and meminfo(1, "c") == (500, {})
    assert read(ROOT / "0/c/meminfo") == "Free: 1000\n"
    assert value(ROOT / "0/c/memused") == 0 == value(ROOT / "1/c/memused")
    assert refcount() == 1
    ok("del c")


def test_sigkill_returns_the_reservations(cgroups: MakeCgroup) -> None:
    ok("gpu 0 10000")
    cg = container(cgroups, "k", "0:1000")
    with Agent.spawn(cg, NOBODY) as victim, Agent.spawn(cg, NOBODY) as other:
        fv, fo = victim.open(), other.open()
        fv2 = victim.open()
        assert victim.reserve(fv, 0, 600)[0] == 0
        assert victim.reserve(fv2, 0, 100)[0] == 0
        assert other.reserve(fo, 0, 200)[0] == 0
        assert meminfo(0, "k") == (100, {victim.pid: 700, other.pid: 200})
        victim.kill()
        assert meminfo(0, "k") == (800, {other.pid: 200})
        assert value(ROOT / "0/k/memused") == 200
        assert other.reserve(fo, 0, 800) == (0, (1000, 1000, 1000))
        other.kill()
    assert meminfo(0, "k") == (1000, {})
    assert refcount() == 1
    ok("del k")


def test_a_forked_child_shares_the_descriptor_until_both_close(cgroups: MakeCgroup) -> None:
    """The reservations belong to the open file: a child that inherits it
    shares them (listed under the opener's PID, while the opener runs), and
    they are returned when the last copy is closed."""
    ok("gpu 0 10000")
    cg = container(cgroups, "f", "0:1000")
    with Agent.spawn(cg, NOBODY) as parent:
        fd = parent.open()
        assert parent.reserve(fd, 0, 300)[0] == 0
        child = parent.fork()
        assert child.reserve(fd, 0, 200) == (0, (1000, 500, 500))  # the same file
        assert parent.info(fd, 0) == (0, (1000, 500, 500))
        assert meminfo(0, "f") == (500, {parent.pid: 500})
        assert parent.close(fd) == 0  # the child still has it
        assert meminfo(0, "f") == (500, {parent.pid: 500})
        assert child.release(fd, 0, 100) == (0, (1000, 400, 400))
        child.exit()  # the last copy
        assert meminfo(0, "f") == (1000, {})

    assert meminfo(0, "f") == (1000, {})

    # Once more, the opener exiting first: the child keeps the bytes, which
    # count in Free but under no PID (the opener's number could be reused).
    with Agent.spawn(cg, NOBODY) as parent:
        fd = parent.open()
        child = parent.fork()
        assert child.reserve(fd, 0, 250)[0] == 0
        info = ProcfsKernelModule().meminfo(0, "f")
        assert info.used == 250 and info.processes == {parent.pid: 250}
        assert parent.close(fd) == 0
        parent.exit()  # the child, orphaned, still holds the file
        assert meminfo(0, "f") == (750, {})
        child.kill()
    assert meminfo(0, "f") == (1000, {})
    ok("del f")


def test_del_with_live_reservations(cgroups: MakeCgroup) -> None:
    """del always succeeds; what the deleted container's processes still hold
    stays charged to the GPU (orphaned_memsize, counted out of free_memsize
    and admission) until they release it; they reserve nothing more."""
    ok("gpu 0 1000")
    cg = container(cgroups, "d", "0:600")
    with Agent.spawn(cg, NOBODY) as a, Agent.spawn(cg, NOBODY) as b:
        fa, fb = a.open(), b.open()
        assert a.reserve(fa, 0, 300)[0] == 0
        assert b.reserve(fb, 0, 100)[0] == 0
        assert refcount() == 3  # the registration and two open files
        ok("del d")
        assert refcount() == 2
        assert not (ROOT / "0/d").exists()
        assert value(ROOT / "0/orphaned_memsize") == 400
        assert value(ROOT / "0/free_memsize") == 600
        # Nothing more is reserved; the state says what is still held.
        assert a.reserve(fa, 0, 1) == (errno.ENOENT, (0, 400, 300))
        assert a.reserve(fa, 0, 0) == (errno.ENOENT, (0, 400, 300))
        assert a.info(fa, 0) == (errno.ENOENT, (0, 400, 300))
        assert a.info(fa, 1) == (errno.ENXIO, None)
        # A process of the deleted container cannot open the device any more.
        assert a.open() == -errno.ENOENT
        # Memory still in use is never promised to another container.
        assert ctl("add e 0:601") == errno.ENOSPC
        assert ctl("gpu 0 399") == errno.ENOSPC
        ok("add e 0:500")
        assert value(ROOT / "0/free_memsize") == 100
        # Releases still work, bounded by each file's holding.
        assert a.release(fa, 0, 301) == (errno.EINVAL, (0, 400, 300))
        assert a.release(fa, 0, 200) == (0, (0, 200, 100))
        assert value(ROOT / "0/orphaned_memsize") == 200
        assert value(ROOT / "0/free_memsize") == 300
        # The same ID again: a fresh ledger; the old files still act for the old one.
        ok("add d 0:300")
        ok("bind d /gs-d")
        assert meminfo(0, "d") == (300, {})
        assert a.reserve(fa, 0, 1) == (errno.ENOENT, (0, 200, 100))
        with Agent.spawn(cg, NOBODY) as c:
            fc = c.open()
            assert c.info(fc, 0) == (0, (300, 0, 0))
            assert c.reserve(fc, 0, 300)[0] == 0
            assert meminfo(0, "d") == (0, {c.pid: 300})
        assert meminfo(0, "d") == (300, {})
        a.exit()
        assert value(ROOT / "0/orphaned_memsize") == 100
        assert b.close(fb) == 0
    assert value(ROOT / "0/orphaned_memsize") == 0
    assert value(ROOT / "0/free_memsize") == 1000 - 500 - 300
    assert refcount() == 2
    ok("del d")
    ok("del e")
    assert value(ROOT / "0/free_memsize") == 1000


def test_memsize_below_used_is_ebusy(cgroups: MakeCgroup) -> None:
    ok("gpu 0 2000")
    cg = container(cgroups, "m", "0:1000")
    with Agent.spawn(cg, NOBODY) as a:
        fd = a.open()
        assert a.reserve(fd, 0, 400)[0] == 0
        before = snapshot()
        assert write(ROOT / "0/m/memsize", "399") == errno.EBUSY
        assert write(ROOT / "0/m/memsize", "1") == errno.EBUSY
        assert write(ROOT / "0/m/memsize", "2001") == errno.ENOSPC
        assert snapshot() == before
        assert write(ROOT / "0/m/memsize", "400") == 0
        assert meminfo(0, "m") == (0, {a.pid: 400})
        assert a.reserve(fd, 0, 1) == (EDQUOT, (400, 400, 400))
        assert write(ROOT / "0/m/memsize", "1500") == 0
        assert a.info(fd, 0) == (0, (1500, 400, 400))
        assert a.release(fd, 0, 400)[0] == 0
        assert write(ROOT / "0/m/memsize", "1") == 0
    ok("del m")


def test_a_passed_descriptor_acts_for_its_openers_container(cgroups: MakeCgroup) -> None:
    """The container is the opener's: a descriptor passed to a process of
    another container (or of none) reserves against the opener's quota."""
    ok("gpu 0 10000")
    cg1 = container(cgroups, "p1", "0:1000")
    cg2 = container(cgroups, "p2", "0:1000")
    with Agent.spawn(cg1, NOBODY) as a, Agent.spawn(cg2, NOBODY) as b:
        fa, fb = a.open(), b.open()
        assert b.reserve(fb, 0, 100)[0] == 0
        ours = a.send_fd(fa)  # through the test process
        passed = b.recv_fd(ours)
        os.close(ours)
        assert b.reserve(passed, 0, 700) == (0, (1000, 700, 700))
        assert b.info(fb, 0) == (0, (1000, 100, 100))
        assert meminfo(0, "p1") == (300, {a.pid: 700})  # the opener's line
        assert meminfo(0, "p2") == (900, {b.pid: 100})
        a.exit()  # b still holds the file
        assert meminfo(0, "p1")[0] == 300
        assert b.close(passed) == 0
        assert meminfo(0, "p1") == (1000, {})
    # Root outside every container may open the device, but acts for none.
    fd = os.open(DEV, os.O_RDWR)
    try:
        with pytest.raises(abi.MemError) as e:
            abi.mem(fd, abi.MEM_RESERVE, 0, 1)
        assert e.value.errno == errno.ENOENT and e.value.state is None
    finally:
        os.close(fd)
    ok("del p1")
    ok("del p2")


def test_rmmod_is_refused_while_a_descriptor_is_open(cgroups: MakeCgroup) -> None:
    ok("gpu 0 1000")
    cg = container(cgroups, "r", "0:1000")
    with Agent.spawn(cg, NOBODY) as a:
        fd = a.open()
        assert a.reserve(fd, 0, 10)[0] == 0
        ok("del r")
        assert refcount() == 1
        assert unload() == errno.EAGAIN
        assert value(ROOT / "0/orphaned_memsize") == 10
    assert refcount() == 0
    assert unload() == 0
    load()  # for the fixture, which unloads again


def test_meminfo_shows_only_processes_the_reader_can_see(cgroups: MakeCgroup) -> None:
    """PIDs as the reader's pid namespace numbers them; processes outside it
    are left out (their bytes still count in Free)."""
    ok("gpu 0 1000")
    cg = container(cgroups, "n", "0:1000")

    def in_new_pid_namespace() -> object:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
        with Agent.spawn(cg) as inner:  # pid 1 of the new namespace
            fd = inner.open()
            assert inner.reserve(fd, 0, 100)[0] == 0
            inside = inner.read(ROOT / "0/n/meminfo")
            outside = read(ROOT / "0/n/meminfo")  # this process is outside it
            inner.exit()
        return [inner.pid, inside, outside]

    with Agent.spawn(cg, NOBODY) as a:
        fd = a.open()
        assert a.reserve(fd, 0, 500)[0] == 0
        got = in_child(in_new_pid_namespace)
        assert isinstance(got, list)
        inner, inside, outside = got
        assert inside == "Free: 400\nPID: 1 Mem: 100\n"
        assert parse_meminfo(outside).processes == {a.pid: 500, inner: 100}
        assert meminfo(0, "n") == (500, {a.pid: 500})
    ok("del n")


def raw_ioctl(fd: int, request: int, addr: int) -> int:
    """ioctl(fd, request, addr) through libc; 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    if libc.ioctl(fd, request, addr) != 0:
        return ctypes.get_errno()
    return 0


def test_extensible_structure_and_bad_requests(cgroups: MakeCgroup) -> None:
    ok("gpu 0 1000")
    cg = container(cgroups, "x", "0:1000")

    def requests() -> object:
        fd = os.open(DEV, os.O_RDWR | os.O_CLOEXEC)
        out: dict[str, object] = {}

        def ioctl(buf: bytearray) -> list[object]:
            try:
                fcntl.ioctl(fd, abi.IOC_MEM, buf, True)
            except OSError as e:
                return [e.errno, list(abi.MEM.unpack_from(buf)) if len(buf) >= 48 else None]
            return [0, list(abi.MEM.unpack_from(buf))]

        for size in (0, 4, 47):
            buf = bytearray(48)
            struct.pack_into("=II", buf, 0, size, abi.MEM_RESERVE)
            struct.pack_into("=Q", buf, 16, 1)
            out[f"size_{size}"] = ioctl(buf)[0]
        out["page_plus"] = ioctl(abi.pack_mem(abi.MEM_RESERVE, 0, 1, size=4097))[0]
        out["page"] = ioctl(abi.pack_mem(abi.MEM_INFO, 0, size=4096))[0]
        out["bigger"] = ioctl(abi.pack_mem(abi.MEM_RESERVE, 0, 10, size=56))
        tail = abi.pack_mem(abi.MEM_RESERVE, 0, 10, size=56)
        tail[50] = 1
        out["bigger_tail"] = ioctl(tail)[0]
        out["flags"] = ioctl(abi.pack_mem(abi.MEM_RESERVE, 0, 1, flags=1))[0]
        out["op_3"] = ioctl(abi.pack_mem(3, 0, 1))[0]
        out["null"] = raw_ioctl(fd, abi.IOC_MEM, 0)
        # Readable but not writable: refused before anything is reserved.
        page = mmap.mmap(-1, 4096)
        page[:48] = abi.pack_mem(abi.MEM_RESERVE, 0, 5)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(addr, 4096, mmap.PROT_READ) == 0
        out["read_only"] = raw_ioctl(fd, abi.IOC_MEM, addr)
        out["after"] = ioctl(abi.pack_mem(abi.MEM_RELEASE, 0, 10))
        os.close(fd)
        return out

    got = in_child(requests, cgroup=cg)
    assert got == {
        "size_0": errno.EINVAL,
        "size_4": errno.EINVAL,
        "size_47": errno.EINVAL,
        "page_plus": errno.E2BIG,
        "page": 0,
        "bigger": [0, [56, 1, 0, 0, 10, 1000, 10, 10]],
        "bigger_tail": errno.E2BIG,
        "flags": errno.EINVAL,
        "op_3": errno.EINVAL,
        "null": errno.EFAULT,
        "read_only": errno.EFAULT,
        "after": [0, [48, 2, 0, 0, 10, 1000, 0, 0]],  # only the 10 bytes were reserved
    }, got
    assert meminfo(0, "x") == (1000, {})
    ok("del x")


def test_query_reports_abi_version_4(cgroups: MakeCgroup) -> None:
    ok("gpu 0 1000")
    cg = container(cgroups, "v", "0:1000")

    def version() -> object:
        quotas = ctypes.create_string_buffer(abi.QUOTA.size)
        buf = abi.pack_query(ctypes.addressof(quotas), 1, abi_version=1)
        fd = os.open(DEV, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, abi.IOC_QUERY, buf, True)
        finally:
            os.close(fd)
        return abi.QUERY.unpack_from(buf)[1]

    assert in_child(version, cgroup=cg) == 4 == abi.ABI_VERSION
    ok("del v")


OPENS = 30_000
BATCH = 1_000


def test_many_open_files_of_one_tenant_are_counted_and_returned(cgroups: MakeCgroup) -> None:
    """A tenant may hold as many descriptors as its RLIMIT_NOFILE allows
    (containerd's default hard limit is 1048576).  open() and close() run
    under the one spinlock every container's reservations take, so the
    module keeps a container's files in a tree by opener (O(log n) per open,
    not a walk of the whole list: a walk let a tenant with many descriptors
    hold every other tenant's cuMemAlloc spinning).  Tests never assert on
    timings: the cost of the first and the last thousand opens is printed,
    for a person to read.  What is checked: 30,000 opens by one process,
    meminfo adds up its files on one line, and closing them returns all."""
    ok("gpu 0 10000")
    cg = container(cgroups, "many", "0:1000")

    def opener() -> list[float]:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPENS + 1000, OPENS + 1000))
        fds: list[int] = []
        costs: list[float] = []
        for _ in range(OPENS // BATCH):
            t = time.perf_counter()
            fds.extend(os.open(DEV, os.O_RDWR | os.O_CLOEXEC) for _ in range(BATCH))
            costs.append(time.perf_counter() - t)
        abi.mem(fds[0], abi.MEM_RESERVE, 0, 7)
        abi.mem(fds[-1], abi.MEM_RESERVE, 0, 5)
        free, procs = meminfo(0, "many")
        assert (free, procs) == (988, {os.getpid(): 12}), (free, procs)
        for fd in fds:
            os.close(fd)
        return costs

    costs = in_child(opener, cgroup=cg)
    assert isinstance(costs, list) and len(costs) == OPENS // BATCH
    print(f"{BATCH} opens: first {min(costs[:3]):.4f} s, last {min(costs[-3:]):.4f} s")
    assert meminfo(0, "many") == (1000, {})
    # Interleaved openers: each one's files are still added up on one line.
    with Agent.spawn(cg, NOBODY) as a, Agent.spawn(cg, NOBODY) as b:
        fds = [(a, a.open()), (b, b.open()), (a, a.open()), (b, b.open()), (a, a.open())]
        for n, (agent, fd) in enumerate(fds, 1):
            assert agent.reserve(fd, 0, n)[0] == 0
        assert meminfo(0, "many") == (985, {a.pid: 1 + 3 + 5, b.pid: 2 + 4})
    assert meminfo(0, "many") == (1000, {})
    ok("del many")
