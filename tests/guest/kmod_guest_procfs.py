"""Every /proc/gpushare file reads and writes as kmod/README.md documents, and
every bad write is refused with nothing changed.  Runs inside the guest."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.guest.kmod_support import (
    CTL,
    DEV,
    NOBODY,
    ROOT,
    ctl,
    errno_of,
    in_child,
    ok,
    read,
    refcount,
    registered,
    snapshot,
    value,
    write,
)

pytestmark = pytest.mark.usefixtures("kmod")

GiB = 1 << 30
CID = "0123456789abcdef" * 4  # a containerd-style 64 hex character ID
GPU_FILES = {
    "free_weight": 0o444,
    "major": 0o444,
    "max_inst": 0o644,
    "policy": 0o644,
    "prio_ratio": 0o644,
    "total_memsize": 0o444,
    "free_memsize": 0o444,
    "nr_inst": 0o444,
    "orphaned_memsize": 0o444,
    "slice_us": 0o644,
    "drain_us": 0o644,
    "forced_ends": 0o444,
}
CTR_FILES = {
    "id": 0o444,
    "memsize": 0o644,
    "weight": 0o644,
    "highprio": 0o644,
    "meminfo": 0o444,
    "cgroup": 0o444,
    "memused": 0o444,
    "gputime": 0o444,
}
# Not a decimal number (optionally with one newline), or beyond 64 bits.
NOT_NUMBERS = [
    "",
    "\n",
    "abc",
    "-1",
    "+1",
    "0x10",
    "1 2",
    " 1",
    "1\n\n",
    "1.5",
    "18446744073709551616",
    "9" * 40,
]
CAP_SYS_ADMIN = 21


def modes(directory: str) -> dict[str, int]:
    return {
        e.name: stat.S_IMODE(e.stat().st_mode) for e in os.scandir(ROOT / directory) if e.is_file()
    }


def refused(path: str, texts: str | list[str], err: int) -> None:
    """Writing each of texts to path fails with err, and nothing changes."""
    before = snapshot()
    for text in [texts] if isinstance(texts, str) else texts:
        assert write(ROOT / path, text) == err, f"{path} <- {text!r}"
    assert snapshot() == before


def test_top_level() -> None:
    assert modes("") == {
        "version": 0o444,
        "default_memsize": 0o644,
        "inst_ctl": 0o600,
        "upgrade": 0o600,
    }
    assert read(ROOT / "version") == "0.1.0\n"
    assert read(ROOT / "default_memsize") == "0\n"
    assert read(CTL) == ""
    assert refcount() == 0


def test_default_memsize() -> None:
    ok("gpu 0 1000")
    assert ctl("add c1 0:0") == errno.EINVAL  # asks for the default, and there is none
    for good in ("300", "300\n", "0", "18446744073709551615", "300"):
        assert write(ROOT / "default_memsize", good) == 0
        assert value(ROOT / "default_memsize") == int(good)
    refused("default_memsize", NOT_NUMBERS, errno.EINVAL)
    ok("add c1 0:0:10")
    assert value(ROOT / "0/c1/memsize") == 300
    ok("del c1")


def test_version_is_read_only() -> None:
    refused("version", "1", errno.EACCES)


def test_gpu_directory() -> None:
    ok("gpu 0 17179869184")
    assert stat.S_IMODE(os.stat(ROOT / "0").st_mode) == 0o711  # only root lists the IDs
    assert modes("0") == GPU_FILES
    assert {f: value(ROOT / "0" / f) for f in GPU_FILES} == {
        "free_weight": 100,
        "major": os.major(os.stat(DEV).st_rdev),
        "max_inst": 16,
        "policy": 2,
        "prio_ratio": 80,
        "total_memsize": 17179869184,
        "free_memsize": 17179869184,
        "nr_inst": 0,
        "orphaned_memsize": 0,
        "slice_us": 10000,
        "drain_us": 100000,
        "forced_ends": 0,
    }
    assert value(ROOT / "0/major") == 10
    assert read(CTL) == "gpu 0 17179869184\n"


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("max_inst", [1, 25, 7], [0, 26, 1000]),
        ("policy", [0, 5, 1], [6, 100]),
        ("prio_ratio", [20, 99, 50], [0, 19, 100]),
        ("slice_us", [1000, 1000000, 20000], [0, 999, 1000001]),
        ("drain_us", [1000, 10000000, 20000], [0, 999, 10000001, 2**32]),
    ],
)
def test_gpu_settings(name: str, good: list[int], bad: list[int]) -> None:
    ok("gpu 1 1000")
    path = f"1/{name}"
    for v in good:
        assert write(ROOT / path, f"{v}\n") == 0
        assert value(ROOT / path) == v
    refused(path, [str(v) for v in bad] + NOT_NUMBERS, errno.EINVAL)


@pytest.mark.parametrize(
    "name",
    [
        "free_weight",
        "major",
        "total_memsize",
        "free_memsize",
        "nr_inst",
        "orphaned_memsize",
        "forced_ends",
    ],
)
def test_gpu_read_only_files(name: str) -> None:
    ok("gpu 0 1000")
    refused(f"0/{name}", "5", errno.EACCES)


def test_max_inst_below_count_is_refused() -> None:
    ok("gpu 0 1000")
    assert write(ROOT / "0/max_inst", "2") == 0
    ok("add a 0:1")
    ok("add b 0:1")
    assert ctl("add c 0:1") == errno.ENOSPC
    refused("0/max_inst", "1", errno.ENOSPC)
    assert value(ROOT / "0/nr_inst") == 2
    ok("del a")
    ok("del b")


def test_container_directory() -> None:
    ok("gpu 0 1000")
    ok("gpu 1 2000")
    ok(f"add {CID} 0:100:30:1,1:200")
    for gpu in ("0", "1"):
        assert stat.S_IMODE(os.stat(ROOT / gpu / CID).st_mode) == 0o500
        assert modes(f"{gpu}/{CID}") == CTR_FILES
        assert read(ROOT / gpu / CID / "id") == CID + "\n"
        assert read(ROOT / gpu / CID / "cgroup") == "0\n"
    d0, d1 = ROOT / "0" / CID, ROOT / "1" / CID
    assert (value(d0 / "memsize"), value(d0 / "weight"), value(d0 / "highprio")) == (100, 30, 1)
    assert (value(d1 / "memsize"), value(d1 / "weight"), value(d1 / "highprio")) == (200, 0, 0)
    assert read(d0 / "meminfo") == "Free: 100\n"
    assert read(d1 / "meminfo") == "Free: 200\n"
    assert (value(ROOT / "0/free_memsize"), value(ROOT / "0/free_weight")) == (900, 70)
    assert value(ROOT / "0/nr_inst") == 1
    assert read(CTL) == f"gpu 0 1000\ngpu 1 2000\nadd {CID} 0:100:30:1,1:200:0:0\n"
    ok(f"del {CID}")
    assert not (ROOT / "0" / CID).exists() and not (ROOT / "1" / CID).exists()
    assert (value(ROOT / "0/free_memsize"), value(ROOT / "0/free_weight")) == (1000, 100)


def test_container_settings() -> None:
    ok("gpu 0 1000")
    ok("add a 0:400:50")
    ok("add b 0:100:20")
    b = "0/b"
    assert write(ROOT / b / "memsize", "600\n") == 0  # exactly what is free
    assert (value(ROOT / b / "memsize"), value(ROOT / "0/free_memsize")) == (600, 0)
    refused(f"{b}/memsize", "601", errno.ENOSPC)
    refused(f"{b}/memsize", "18446744073709551615", errno.ENOSPC)
    refused(f"{b}/memsize", "0", errno.EINVAL)
    assert write(ROOT / b / "memsize", "1") == 0
    assert value(ROOT / "0/free_memsize") == 599

    assert write(ROOT / b / "weight", "50") == 0
    assert value(ROOT / "0/free_weight") == 0
    refused(f"{b}/weight", "51", errno.ENOSPC)
    refused(f"{b}/weight", "101", errno.EINVAL)
    assert write(ROOT / b / "weight", "0") == 0
    assert value(ROOT / "0/free_weight") == 50

    for v in (1, 0):
        assert write(ROOT / b / "highprio", str(v)) == 0
        assert value(ROOT / b / "highprio") == v
    refused(f"{b}/highprio", "2", errno.EINVAL)
    for name in ("memsize", "weight", "highprio"):
        refused(f"{b}/{name}", NOT_NUMBERS, errno.EINVAL)
    for name in ("id", "meminfo", "cgroup", "memused", "gputime"):
        refused(f"{b}/{name}", "1", errno.EACCES)
    assert value(ROOT / b / "gputime") == 0  # it never asked for the GPU
    assert read(ROOT / b / "meminfo") == "Free: 1\n"
    ok("del a")
    ok("del b")


def test_inst_ctl_errors_change_nothing() -> None:
    ok("gpu 0 1000")
    ok("gpu 1 1000")
    ok("add a 0:500:60")
    cases = {
        errno.EINVAL: [
            "",
            "\n",
            "hello",
            "gpu 0",
            "gpu 0 0",
            "gpu 16 5",
            "add",
            "add x",
            "add x 0",
            "add x 0:10:101",
            "add x 0:10:1:2",
            "add x 0:10,0:10",
            "add x 16:10",
            "add ./.. 0:1",
            "add . 0:1",
            "add max_inst 0:1",
            "add slice_us 0:1",
            "add drain_us 0:1",
            "add forced_ends 0:1",
            "add " + "a" * 65 + " 0:1",
            "add x 0:10 extra",
            "del",
            "del a b",
            "bind a",
            "bind a x",
            "add x 0:0",
            "add x 0:1\nadd y 0:1",
            "x" * 5000,
        ],
        errno.EEXIST: ["add a 1:1"],
        errno.ENOENT: ["del x", "bind x 5", "bind x /"],
        errno.ENXIO: ["add x 2:10", "add x 0:10,3:10"],
        errno.ENOSPC: ["add x 0:501", "add x 0:10:41", "add x 1:10,0:10:41", "gpu 0 499"],
    }
    before = snapshot()
    for err, commands in cases.items():
        for command in commands:
            assert ctl(command) == err, f"{command!r}: want {errno.errorcode[err]}"
            assert refcount() == 1
    assert snapshot() == before
    ok("del a")


def test_inst_ctl_dump_rebuilds_the_registry(cgroups: Callable[[str], Path]) -> None:
    cgroup = os.stat(cgroups("gs-dump")).st_ino
    for cmd in (
        "gpu 0 1000",
        "gpu 3 5000",
        "add a 0:100:10:1,3:200:20:0",
        "add b 3:300",
        "add c 0:1:0:0",
        f"bind c {cgroup}",
    ):
        ok(cmd)
    dump = read(CTL)
    assert dump == (
        "gpu 0 1000\ngpu 3 5000\nadd a 0:100:10:1,3:200:20:0\nadd b 3:300:0:0\n"
        f"add c 0:1:0:0\nbind c {cgroup}\n"
    )
    for cid in registered():
        ok(f"del {cid}")
    for line in dump.splitlines():
        if not line.startswith("gpu"):
            ok(line)
    assert read(CTL) == dump
    for cid in registered():
        ok(f"del {cid}")


def test_gpu_redeclared() -> None:
    ok("gpu 0 1000")
    ok("gpu 0 1000")  # idempotent
    ok("add a 0:600")
    assert ctl("gpu 0 599") == errno.ENOSPC
    ok("gpu 0 600")
    assert value(ROOT / "0/free_memsize") == 0
    ok("gpu 0 2000")
    assert (value(ROOT / "0/total_memsize"), value(ROOT / "0/free_memsize")) == (2000, 1400)
    ok("del a")


def test_ids() -> None:
    ok("gpu 0 1000")
    for cid in ("a" * 64, "A.b_c-9", "..."):
        ok(f"add {cid} 0:1")
        assert read(ROOT / "0" / cid / "id") == cid + "\n"
        ok(f"del {cid}")
    for cid in ("a" * 65, ".", "..", "a/b", "free_weight", "nr_inst", "a*"):
        assert ctl(f"add {cid} 0:1") == errno.EINVAL, cid


def test_writes_need_root() -> None:
    ok("gpu 0 1000")
    ok("add a 0:100")
    before = snapshot()

    def try_writes() -> list[int]:
        paths = [CTL, ROOT / "default_memsize", ROOT / "0/max_inst", ROOT / "0/a/memsize"]
        return [write(p, "1") for p in paths]

    assert in_child(try_writes, uid=NOBODY) == [errno.EACCES] * 4
    assert snapshot() == before
    ok("del a")


REGISTRY = ["inst_ctl", "upgrade"] + [f"0/a/{name}" for name in CTR_FILES]


def try_registry_reads() -> list[object]:
    """What opening each registry file for reading (and listing the GPU's
    and the container's directories) gives, and the files that stay
    readable: the version and the GPU's, which name no container."""
    return [
        [errno_of(lambda p=p: read(ROOT / p)) for p in REGISTRY],
        errno_of(lambda: os.listdir(ROOT / "0/a")),
        errno_of(lambda: os.listdir(ROOT / "0")),
        read(ROOT / "version"),
        {f: value(ROOT / "0" / f) for f in ("nr_inst", "max_inst", "free_memsize")},
    ]


def test_registry_is_root_only() -> None:
    """Other users read the module's and the GPUs' files, not the registry,
    and do not list the GPU's directory (the containers' IDs)."""
    ok("gpu 0 1000")
    ok("add a 0:100")
    registry = [errno_of(lambda p=p: read(ROOT / p)) for p in REGISTRY]
    assert registry == [0] * len(REGISTRY)  # root with CAP_SYS_ADMIN

    assert in_child(try_registry_reads, uid=NOBODY) == [
        [errno.EACCES] * len(REGISTRY),
        errno.EACCES,
        errno.EACCES,
        "0.1.0\n",
        {"nr_inst": 1, "max_inst": 16, "free_memsize": 900},
    ]
    ok("del a")


def drop_cap_sys_admin() -> None:
    """Drop CAP_SYS_ADMIN from this process's bounding, effective, permitted
    and inheritable sets, keeping uid 0 and every other capability."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    pr_capbset_drop, linux_capability_version_3 = 24, 0x20080522
    check(libc.prctl(pr_capbset_drop, CAP_SYS_ADMIN, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    header, data = Header(linux_capability_version_3, 0), (Data * 2)()
    check(libc.capget(ctypes.byref(header), data), "capget")
    keep = ~(1 << CAP_SYS_ADMIN) & 0xFFFFFFFF  # CAP_SYS_ADMIN < 32: in data[0]
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    check(libc.capset(ctypes.byref(header), data), "capset")


def effective_caps() -> int:
    for line in read("/proc/self/status").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff in /proc/self/status")


def test_registry_reads_need_cap_sys_admin() -> None:
    """uid 0 without CAP_SYS_ADMIN (root in a container: CAP_DAC_OVERRIDE
    gets it past the 0600 and 0500 modes) reads no registry file: open()
    is EPERM, as for writing.  It still reads the module's and the GPUs'
    files, and lists the GPU's directory (CAP_DAC_READ_SEARCH): the IDs,
    which procfs offers no module a way to hide, never the quotas."""
    ok("gpu 0 1000")
    ok("add a 0:100")

    def reads_without_cap() -> list[object]:
        drop_cap_sys_admin()
        return [os.getuid(), effective_caps() >> CAP_SYS_ADMIN & 1, *try_registry_reads()]

    uid, cap, registry, ctr_dir, gpu_dir, version, gpu = in_child(reads_without_cap)  # type: ignore[misc]
    assert (uid, cap) == (0, 0)
    assert registry == [errno.EPERM] * len(REGISTRY)
    assert ctr_dir == gpu_dir == 0  # the directories list, their files do not open
    assert (version, gpu) == ("0.1.0\n", {"nr_inst": 1, "max_inst": 16, "free_memsize": 900})
    assert refcount() == 1
    ok("del a")


def test_writes_need_cap_sys_admin() -> None:
    """uid 0 without CAP_SYS_ADMIN may open the GPUs' files for reading but
    not for writing, and the registry's not even for reading: open() is
    refused with EPERM, changing nothing.  The capability is judged at
    open(), on the opener's credentials, so a descriptor opened without it
    can never write."""
    ok("gpu 0 1000")
    ok("add a 0:100")
    before = snapshot()
    paths = [CTL, CTL, ROOT / "default_memsize", ROOT / "0/max_inst", ROOT / "0/a/memsize"]

    def try_writes() -> list[object]:
        drop_cap_sys_admin()
        return [
            os.getuid(),
            effective_caps() >> CAP_SYS_ADMIN & 1,
            [errno_of(lambda p=p: os.close(os.open(p, os.O_WRONLY))) for p in paths],
            [errno_of(lambda p=p: os.close(os.open(p, os.O_RDWR))) for p in paths],
            errno_of(lambda: read(CTL)),
        ]

    uid, cap, wronly, rdwr, dump = in_child(try_writes)  # type: ignore[misc]
    assert (uid, cap) == (0, 0)
    assert wronly == rdwr == [errno.EPERM] * 5
    assert dump == errno.EPERM  # reading the registry needs the capability too
    assert snapshot() == before
    assert refcount() == 1
    ok("del a")


def test_capability_is_the_openers() -> None:
    """A descriptor keeps the authority of whoever opened it: opened with
    CAP_SYS_ADMIN, it still writes after the capability is dropped (the
    opener chose to hand it on); opened without, nothing can write through
    it, whoever holds it later."""
    ok("gpu 0 1000")
    ok("add a 0:100")
    fd_ctl = os.open(CTL, os.O_WRONLY)
    fd_mem = os.open(ROOT / "0/a/memsize", os.O_WRONLY)

    def write_after_drop() -> list[int]:
        if os.getuid() == 0:
            drop_cap_sys_admin()
        return [
            errno_of(lambda: os.write(fd_ctl, b"add b 0:50\n")),
            errno_of(lambda: os.write(fd_mem, b"60")),
            errno_of(lambda: os.open(CTL, os.O_WRONLY)),
        ]

    try:
        assert in_child(write_after_drop) == [0, 0, errno.EPERM]
        assert in_child(write_after_drop, uid=NOBODY) == [errno.EEXIST, 0, errno.EACCES]
    finally:
        os.close(fd_ctl)
        os.close(fd_mem)
    assert value(ROOT / "0/a/memsize") == 60
    assert refcount() == 2
    ok("del a")
    ok("del b")


def test_read_only_files_refuse_opening_for_write() -> None:
    """Root's CAP_DAC_OVERRIDE passes the 0444 mode; the module still says EACCES at open()."""
    ok("gpu 0 1000")
    ok("add a 0:100")
    for path in ("version", "0/free_weight", "0/nr_inst", "0/a/id", "0/a/cgroup", "0/a/meminfo"):
        assert errno_of(lambda p=path: os.open(ROOT / p, os.O_WRONLY)) == errno.EACCES, path
        assert errno_of(lambda p=path: os.close(os.open(ROOT / p, os.O_RDONLY))) == 0, path
    ok("del a")


def test_nul_bytes_are_refused() -> None:
    """A NUL byte would end parsing early; writes containing one are EINVAL."""
    ok("gpu 0 1000")
    ok("add a 0:100")
    refused("default_memsize", ["5\0", "5\x009", "\x005"], errno.EINVAL)
    refused("0/max_inst", ["3\0", "3\n\0"], errno.EINVAL)
    refused("0/a/memsize", ["50\0"], errno.EINVAL)
    refused("0/a/highprio", ["1\0x"], errno.EINVAL)
    refused(
        "inst_ctl",
        ["gpu 1 1000\0", "del a\0", "del a\0\n", "add b 0:1\0junk", "\0gpu 1 1000"],
        errno.EINVAL,
    )
    assert refcount() == 1
    ok("del a")


def test_open_file_of_deleted_container() -> None:
    ok("gpu 0 1000")
    ok("add a 0:100")
    fd = os.open(ROOT / "0/a/memsize", os.O_RDWR)
    try:
        ok("del a")
        assert errno_of_read(fd) == errno.EIO
        assert errno_of_write(fd) == errno.EIO
    finally:
        os.close(fd)
    assert value(ROOT / "0/free_memsize") == 1000


def errno_of_read(fd: int) -> int:
    try:
        os.pread(fd, 100, 0)
    except OSError as e:
        return e.errno or -1
    return 0


def errno_of_write(fd: int) -> int:
    try:
        os.write(fd, b"5")
    except OSError as e:
        return e.errno or -1
    return 0
