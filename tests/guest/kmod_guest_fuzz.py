"""Bad input to gpushare.ko: malformed writes to every writable /proc/gpushare
file and malformed calls of every /dev/gpushare ioctl, as root and as an
unprivileged user, one at a time and from many writers at once.  Runs inside
the guest.

Inputs are seeded (GPUSHARE_RANDOM_SEED replays a run, as for
kmod_guest_random.py): random bytes, overlong writes, numbers past 64 bits,
signs, embedded NULs, buffers that end in an unmapped page (the kernel's copy
faults part way), bad pointers, wrong structure sizes, unknown commands.
Properties: every call returns (no hang) with an errno the ABI documents;
a refused write changes nothing; afterwards the registry is consistent
(every GPU's free memory, free weight and count match its containers, the
files match the dump), the module's reference count is the number of
containers, a valid registration and a QUERY still work, no reservation
outlives its process, and the kernel logged no BUG, WARNING or oops.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import random
import signal
import struct
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
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

MakeCgroup = Callable[[str], Path]
SEED = int(os.environ.get("GPUSHARE_RANDOM_SEED") or 14)
GiB = 1 << 30
PAGE = mmap.PAGESIZE
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
LIBC.write.restype = ctypes.c_ssize_t
LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
LIBC.ioctl.restype = ctypes.c_int
LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

# Errnos the ABI documents for a refused write or ioctl (kmod/README.md).
WRITE_ERRNOS = {
    errno.EINVAL,
    errno.ENOSPC,
    errno.EBUSY,
    errno.EEXIST,
    errno.ENOENT,
    errno.ENXIO,
    errno.ESRCH,
    errno.E2BIG,
    errno.EFAULT,
    errno.EPROTO,
}
IOCTL_ERRNOS = {
    errno.EINVAL,
    errno.E2BIG,
    errno.EFAULT,
    errno.ENOENT,
    errno.ENXIO,
    errno.EDQUOT,
    errno.EAGAIN,
    errno.EINTR,
    errno.EOVERFLOW,
    errno.ENOTTY,
}
# Addresses no caller may hand the kernel: NULL, tiny, the kernel's own, non-canonical.
BAD_POINTERS = [0, 1, 8, 0xFFFF_FFFF_8100_0000, 0xFFFF_8880_0000_0000, 0x8000_0000_0000_0000]
# Bad content for a file that takes one decimal number (an optional newline).
NOT_NUMBERS = [
    b"",
    b"\n",
    b"\n\n",
    b"-1",
    b"-0",
    b"+1",
    b" 1",
    b"1 ",
    b"1\t",
    b"1\n\n",
    b"1\r\n",
    b"0x10",
    b"010a",
    b"1e3",
    b"1.0",
    b"18446744073709551616",
    b"36893488147419103232",
    b"9" * 40,
    b"1" + b"0" * 4100,
    b"1\x00",
    b"\x001",
    b"1\x002",
    "\u0663".encode(),
    "\uff11".encode(),
    b"\xff\xfe",
    b"1\n" + b" " * 5000,
    b"7" * 70000,
]


class Guarded:
    """Two pages, the second unmapped (PROT_NONE): data placed to end at
    the first page's end makes any longer read by the kernel fault."""

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, 2 * PAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        assert LIBC.mprotect(self.base + PAGE, PAGE, 0) == 0, os.strerror(ctypes.get_errno())

    def place(self, data: bytes, overhang: int = 0) -> int:
        """data copied to end `overhang` bytes into the unmapped page (only
        what fits is copied); its address."""
        overhang = min(overhang, len(data))
        start = PAGE + overhang - len(data)
        assert 0 <= start
        fits = min(len(data), PAGE - start)
        self.map[start : start + fits] = data[:fits]
        return self.base + start


def raw_write(fd: int, addr: int, size: int) -> int:
    """write(fd, addr, size) through libc; 0 or the errno."""
    return ctypes.get_errno() if LIBC.write(fd, addr, size) < 0 else 0


def write_fd(path: Path, data: bytes) -> int:
    return write(path, data)


def open_close(path: str, flags: int) -> None:
    os.close(os.open(path, flags))


def random_bytes(rng: random.Random, digits_only_ok: bool = False) -> bytes:
    """Random bytes, at least one of them neither a digit nor a newline
    (so never a valid number) unless digits_only_ok."""
    n = rng.choice([1, 2, 5, 17, 64, 300, 4095, 4096, 4097, 9000])
    data = bytearray(rng.randbytes(n))
    if not digits_only_ok:
        data[rng.randrange(n)] = rng.choice(b"\x00 -+x\xff,:abcGi")
    return bytes(data)


# -- the registry's consistency ---------------------------------------------


def dump() -> tuple[dict[int, int], dict[str, list[tuple[int, int, int, int]]]]:
    """inst_ctl's registry: GPU -> total bytes, ID -> [(gpu, mem, weight, highprio)]."""
    gpus: dict[int, int] = {}
    ctrs: dict[str, list[tuple[int, int, int, int]]] = {}
    for line in read(CTL).splitlines():
        words = line.split()
        if words[0] == "gpu":
            gpus[int(words[1])] = int(words[2])
        elif words[0] == "add":
            shares = [tuple(int(x) for x in s.split(":")) for s in words[2].split(",")]
            ctrs[words[1]] = [(s[0], s[1], s[2], s[3]) for s in shares]
    return gpus, ctrs


def check_consistent(open_files: int = 0) -> None:
    """Every GPU's files agree with its containers, the containers' files
    with the dump, the dump replays, and the refcount is the containers
    (plus open /dev/gpushare files)."""
    gpus, ctrs = dump()
    dirs = sorted(int(e.name) for e in os.scandir(ROOT) if e.is_dir())
    assert dirs == sorted(gpus), (dirs, gpus)
    for g, total in gpus.items():
        d = ROOT / str(g)
        on = {cid: s for cid, shares in ctrs.items() for s in shares if s[0] == g}
        assert value(d / "total_memsize") == total
        assert value(d / "nr_inst") == len(on), (g, on)
        orphaned = value(d / "orphaned_memsize")
        assert value(d / "free_memsize") == total - orphaned - sum(s[1] for s in on.values())
        assert value(d / "free_weight") == 100 - sum(s[2] for s in on.values())
        assert len(on) <= value(d / "max_inst")
        assert 0 <= value(d / "policy") <= abi.POLICY_MAX
        assert abi.PRIO_RATIO_MIN <= value(d / "prio_ratio") <= abi.PRIO_RATIO_MAX
        assert abi.SLICE_US_MIN <= value(d / "slice_us") <= abi.SLICE_US_MAX
        assert abi.DRAIN_US_MIN <= value(d / "drain_us") <= abi.DRAIN_US_MAX
        listed = {e.name for e in os.scandir(d) if e.is_dir()}
        assert listed == set(on), (g, listed, on)
        for cid, (_, mem, weight, hp) in on.items():
            assert read(d / cid / "id") == cid + "\n"
            assert (value(d / cid / "memsize"), value(d / cid / "weight")) == (mem, weight)
            assert value(d / cid / "highprio") == hp and hp in (0, 1)
            assert mem >= 1 and 0 <= weight <= 100
    assert refcount() == len(ctrs) + open_files, (refcount(), ctrs)


def check_still_works(cgroups: MakeCgroup, name: str) -> None:
    """A valid registration on GPU 0, bound and queried from its cgroup, then deleted."""
    before = refcount()
    free = value(ROOT / "0/free_memsize")
    weight = min(10, value(ROOT / "0/free_weight"))
    assert free >= 4096, free
    ok(f"add {name} 0:4096:{weight}:1")
    assert refcount() == before + 1
    cg = cgroups(f"fz-{name}")
    ok(f"bind {name} /fz-{name}")

    def query() -> list[object]:
        q = abi.query()
        assert q is not None
        return [
            q.container_id,
            [(x.gpu_index, x.memory_bytes, x.core_percent, x.high_priority) for x in q.quotas],
        ]

    assert in_child(query, cgroup=cg) == [name, [[0, 4096, weight, True]]]
    ok(f"del {name}")
    assert refcount() == before


@pytest.fixture
def kmsg() -> Iterator[None]:
    """Fails the test when the kernel logs a BUG, WARNING, oops or sanitizer
    report while it runs (the harness also fails the run on a warning)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    os.lseek(fd, 0, os.SEEK_END)
    try:
        yield
        bad = []
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except BrokenPipeError:  # overwritten records: read on
                continue
            text = record.split(";", 1)[-1]
            if any(w in text for w in ("BUG", "WARNING", "Oops", "general protection", "UBSAN")):
                bad.append(text)
        assert not bad, bad
    finally:
        os.close(fd)


def setup_registry() -> None:
    ok("gpu 0 17179869184")
    ok("gpu 1 1000000")
    ok("add fz-a 0:4294967296:30:0,1:1000:0:1")
    ok("add fz-b 0:1073741824:20:1")


def writable_files() -> list[Path]:
    """Every file of the tree that someone may write, found by its mode."""
    out = []
    dirs = [ROOT]
    while dirs:
        for entry in os.scandir(dirs.pop()):
            if entry.is_dir():
                dirs.append(Path(entry.path))
            elif entry.stat().st_mode & 0o200:
                out.append(Path(entry.path))
    return sorted(out)


# -- procfs --------------------------------------------------------------------


@pytest.mark.usefixtures("kmsg")
def test_fuzz_number_files_refuse_malformed_writes(cgroups: MakeCgroup) -> None:
    """Each file that takes a number refuses every malformed value, random
    bytes, a write that faults part way and bad pointers, changing nothing."""
    setup_registry()
    files = [p for p in writable_files() if p.name not in ("inst_ctl", "upgrade")]
    names = {p.name for p in files}
    settings = {"default_memsize", "max_inst", "policy", "prio_ratio", "slice_us", "drain_us"}
    assert names == settings | {
        "memsize",
        "weight",
        "highprio",
    }, names
    rng = random.Random(SEED)
    guard = Guarded()
    before = snapshot()
    for path in files:
        payloads = NOT_NUMBERS + [random_bytes(rng) for _ in range(12)]
        for data in payloads:
            err = write_fd(path, data)
            assert err in WRITE_ERRNOS, (path, data[:40], err)
        fd = os.open(path, os.O_WRONLY)
        try:
            # A valid number whose last byte lies in the unmapped page: the
            # copy faults, and no prefix of it ("1") may be taken.
            for overhang in (1, 2):
                err = raw_write(fd, guard.place(b"12\n", overhang), 3)
                assert err == errno.EFAULT, (path, overhang, err)
            for addr in BAD_POINTERS:
                err = raw_write(fd, addr, 2)
                assert err in (errno.EFAULT, errno.EINVAL), (path, hex(addr), err)
            # A huge count with a short buffer.
            err = raw_write(fd, guard.place(b"1"), 1 << 40)
            assert err in (errno.EFAULT, errno.EINVAL, errno.E2BIG), (path, err)
        finally:
            os.close(fd)
        assert snapshot() == before, path
    # Numbers at and past each file's range, and a valid one at an offset.
    for path in files:
        for n in (0, 1, 101, 1000, 2**32, 2**63, 2**64 - 1):
            err = write_fd(path, b"%d" % n)
            assert err in WRITE_ERRNOS | {0}, (path, n, err)
        fd = os.open(path, os.O_WRONLY)
        try:
            err = errno_of(partial(os.pwrite, fd, b"20", 3))
            assert err in WRITE_ERRNOS | {0, errno.ESPIPE}, (path, err)
        finally:
            os.close(fd)
    check_consistent()
    check_still_works(cgroups, "fz-ok")
    for cid in registered():
        ok(f"del {cid}")
    assert refcount() == 0


SEEDS = [
    "gpu 2 1000000",
    "gpu 0 17179869184",
    "add fz-n 0:1000:5:0,1:100",
    "add fz-m 1:0",
    "del fz-n",
    "del fz-a",
    "bind fz-b /",
    "bind fz-b 0",
    "bind fz-b 12345",
    "bind fz-b /no/such/cgroup",
    "add fz-w 0:1000:100:1",
]


def mutate(rng: random.Random, text: str) -> bytes:
    """One or a few random edits of a command: bytes flipped, cut, inserted,
    a number replaced by a huge or negative one, separators doubled, the
    ID made too long, many GPUs."""
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(9)
        i = rng.randrange(len(data) + 1)
        if kind == 0 and data:
            data[min(i, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:
            del data[i:]
        elif kind == 2:
            data[i:i] = rng.choice([b"\x00", b" ", b"\t", b"\n", b":", b",", b"-", b"/", b".."])
        elif kind == 3:
            words = [bytes(w) for w in data.split(b" ")]
            j = rng.randrange(len(words))
            words[j] = rng.choice(
                [b"18446744073709551616", b"-1", b"9" * 30, b"4294967296", b"16", b"0", b""]
            )
            data = bytearray(b" ".join(words))
        elif kind == 4:
            data = data.replace(b" ", b"  ", 1).replace(b":", b"::", 1)
        elif kind == 5:
            data = data.replace(b"fz-", b"x" * rng.choice([60, 65, 300]), 1)
        elif kind == 6:
            data += b"," + b",".join(b"%d:1" % rng.randrange(20) for _ in range(rng.randint(1, 40)))
        elif kind == 7:
            data = data * rng.randint(2, 3)
        else:
            data += random_bytes(rng, digits_only_ok=True)[: rng.choice([1, 8, 5000])]
    return bytes(data)


@pytest.mark.usefixtures("kmsg")
def test_fuzz_inst_ctl(cgroups: MakeCgroup) -> None:
    """Mutated commands, random bytes, overlong and faulting writes to
    inst_ctl: only documented errnos, and the registry stays consistent
    whatever a mutation happened to register."""
    setup_registry()
    rng = random.Random(SEED + 1)
    guard = Guarded()
    fd = os.open(CTL, os.O_WRONLY)
    try:
        for i in range(600):
            if i % 5 == 0:
                data = random_bytes(rng, digits_only_ok=True)
            else:
                data = mutate(rng, rng.choice(SEEDS))
            err = errno_of(partial(os.write, fd, data))
            assert err in WRITE_ERRNOS | {0}, (data[:80], err)
            if i % 100 == 99:
                check_consistent()
        for data in (b"x" * 4097, b"del " + b"a" * 1_000_000, b"gpu 3 1" + b"0" * 5000):
            err = errno_of(partial(os.write, fd, data))
            assert err in (errno.EINVAL, errno.E2BIG), (data[:20], err)
        # A valid command whose end lies in the unmapped page, then bad pointers.
        before = snapshot()
        for overhang in (1, 5):
            cmd = b"add fz-cut 0:4096\n"
            assert raw_write(fd, guard.place(cmd, overhang), len(cmd)) == errno.EFAULT
        for addr in BAD_POINTERS:
            assert raw_write(fd, addr, 16) in (errno.EFAULT, errno.EINVAL), hex(addr)
        assert snapshot() == before
    finally:
        os.close(fd)
    check_consistent()
    check_still_works(cgroups, "fz-ok")
    for cid in registered():
        ok(f"del {cid}")
    check_consistent()
    assert refcount() == 0


def upgrade_state() -> str:
    return read(ROOT / "upgrade").split("\n", 1)[0].split()[-1]


@pytest.mark.usefixtures("kmsg")
def test_fuzz_upgrade_file(cgroups: MakeCgroup) -> None:
    """Garbled controls and garbled states written to the upgrade file,
    first with containers registered (no import may be taken), then on an
    empty module (a mutated state is taken whole or refused whole)."""
    setup_registry()
    rng = random.Random(SEED + 2)
    path = ROOT / "upgrade"
    state = read(path)
    assert state.startswith("gpushare-upgrade 1 ") and " live\n" in state.split("\n", 1)[0] + "\n"
    exported = state.replace(" live\n", " exported\n", 1)
    controls = [b"expor", b"export\x00", b"EXPORT", b"export ", b"abort\n\n", b"abor", b"\n"]

    def one(data: bytes) -> None:
        err = write_fd(path, data)
        assert err in WRITE_ERRNOS, (data[:80], err)
        assert upgrade_state() == "live", data[:80]

    before = snapshot()
    for data in controls + [random_bytes(rng) for _ in range(20)]:
        one(data)
    for _ in range(40):
        one(mutate(rng, exported))
    one(exported.encode())  # a whole state, but containers are registered
    one(b"x" * (512 * 1024 + 1))
    assert snapshot() == before
    for cid in registered():
        ok(f"del {cid}")
    # Empty: a mutated state may be valid; then it is taken whole.
    taken = 0
    for _ in range(60):
        data = mutate(rng, exported)
        err = write_fd(path, data)
        assert err in WRITE_ERRNOS | {0}, (data[:80], err)
        assert upgrade_state() == "live"
        check_consistent()
        if registered():
            taken += 1
            for cid in registered():
                ok(f"del {cid}")
    check_still_works(cgroups, "fz-ok")
    assert refcount() == 0, taken


def test_fuzz_unprivileged_writes_refused() -> None:
    """uid 65534 opens no file of the tree for writing (nor the registry for
    reading), and /dev/gpushare not at all outside a container."""
    setup_registry()
    before = snapshot()
    files = [str(p) for p in writable_files()]
    every = sorted(str(p) for p in before)

    def attempts() -> list[object]:
        out: list[object] = []
        for p in every:
            for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC | os.O_APPEND):
                out.append([p, flags, errno_of(partial(open_close, p, flags))])
        for p in (str(CTL), str(ROOT / "upgrade")):
            out.append([p, 0, errno_of(partial(read, p))])
        out.append([str(DEV), 0, errno_of(partial(open_close, str(DEV), os.O_RDWR))])
        return out

    results = in_child(attempts, uid=NOBODY)
    assert isinstance(results, list) and len(results) == 3 * len(every) + 3
    for p, flags, err in results:
        assert err in (errno.EACCES, errno.EPERM, errno.ENOENT), (p, flags, err)
    assert set(files) <= set(every)
    assert snapshot() == before
    for cid in registered():
        ok(f"del {cid}")


def writer(seed: int, uid: int | None, rounds: int, files: list[Path]) -> None:
    """A child process's loop of writes (run in a fork); exits 1 on an
    errno the ABI does not document (uid 65534: on any write not refused
    at open)."""
    rng = random.Random(seed)
    me = f"fz-w{seed}"
    for i in range(rounds):
        path = rng.choice(files)
        if path.name == "upgrade":
            continue  # export/import are not fuzzed concurrently: see test_fuzz_upgrade_file
        if path.name == "inst_ctl":
            data = rng.choice(
                [
                    f"add {me}-{i % 3} 0:{rng.randrange(1, 4096)}:{rng.randrange(0, 10)}".encode(),
                    f"del {me}-{i % 3}".encode(),
                    mutate(rng, rng.choice(SEEDS)),
                ]
            )
        else:
            data = rng.choice(
                [rng.choice(NOT_NUMBERS[:20]), b"%d" % rng.randrange(0, 120), random_bytes(rng)]
            )
        if path.name in ("prio_ratio", "slice_us", "drain_us"):
            data = rng.choice(
                [data, b"%d" % rng.randrange(20, 100), b"%d" % (rng.randrange(1, 50) * 1000)]
            )
        err = write_fd(path, data)
        # Root: a container another writer deleted is gone (ENOENT at open,
        # EIO on a file procfs removed meanwhile).
        allowed = {errno.EACCES} if uid is not None else WRITE_ERRNOS | {0, errno.EIO}
        if err not in allowed:
            os.write(2, f"writer {seed}: {path} {data[:60]!r}: errno {err}\n".encode())
            os._exit(1)
    if uid is None:
        for n in range(3):
            ctl(f"del {me}-{n}")


@pytest.mark.usefixtures("kmsg")
def test_fuzz_concurrent_writers(cgroups: MakeCgroup) -> None:
    """Four root writers (valid and malformed commands, settings and garbage
    on every file, containers coming and going) and two unprivileged ones at
    once; then the registry is consistent and works."""
    setup_registry()
    files = writable_files()
    pids = []
    for k in range(6):
        uid = NOBODY if k >= 4 else None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if uid is not None:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                writer(SEED * 100 + k, uid, 250, files)
                code = 0
            except BaseException as e:  # noqa: BLE001 - report, never return into pytest
                os.write(2, f"writer {k} failed: {e!r}\n".encode())
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0] * 6, codes
    check_consistent()
    check_still_works(cgroups, "fz-ok")
    for cid in registered():
        ok(f"del {cid}")
    assert refcount() == 0


# -- /dev/gpushare ioctls ------------------------------------------------------

SIZES = {
    abi.IOC_QUERY: (abi.QUERY_SIZE_VER0, abi.QUERY_SIZE),
    abi.IOC_MEM: (abi.MEM_SIZE_VER0, abi.MEM.size),
    abi.IOC_SCHED: (abi.SCHED_SIZE_VER0, abi.SCHED.size),
}


def fuzz_struct(rng: random.Random, cmd: int, quotas: int, guard_addr: int) -> bytes:
    """A structure for cmd: plausible fields with odd values, a size field
    from the edges (0, below version 0, a page, past a page, 2^32-1), a
    tail (zero or not) and sometimes random bytes throughout."""
    ver0, size = SIZES[cmd]
    u32 = [0, 1, 2, 3, 15, 16, 17, 0x7FFF_FFFF, 0xFFFF_FFFF]
    u64 = [0, 1, 4096, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    if cmd == abi.IOC_QUERY:
        addr = rng.choice([quotas, quotas, guard_addr, *BAD_POINTERS])
        body = (
            struct.pack(
                "=IIIQII",
                rng.choice([abi.ABI_VERSION, 1, 0, 0xFFFF_FFFF]),
                rng.choice([0, 0, 1, 0xFFFF_FFFF]),
                rng.choice(
                    [abi.QUOTA.size, abi.QUOTA_SIZE_VER0, 0, 23, 25, 4096, 4097, 0xFFFF_FFFF]
                ),
                addr,
                rng.choice(u32),
                rng.choice(u32),
            )
            + struct.pack("=Q", rng.choice(u64))
            + rng.randbytes(abi.ID_MAX + 8)
        )
    elif cmd == abi.IOC_MEM:
        body = struct.pack(
            "=IIIQQQQ",
            rng.choice([0, 1, 2, 3, 0xFFFF_FFFF]),
            rng.choice(u32),
            rng.choice([0, 0, 1 << 31]),
            *(rng.choice(u64) for _ in range(4)),
        )
    else:
        early = abi.SCHED_NOWAIT | abi.SCHED_EARLY
        flags = rng.choice([abi.SCHED_NOWAIT, abi.SCHED_NOWAIT, 0, 2, early, 4, 0xFFFF_FFFF])
        body = struct.pack(
            "=IIIQQQQIIIIQQ",
            rng.choice([0, 1, 2, 3, 4, 0xFFFF_FFFF]),
            rng.choice(u32),
            flags,
            *(rng.choice(u64) for _ in range(4)),
            *(rng.choice(u32) for _ in range(4)),
            *(rng.choice(u64) for _ in range(2)),
        )
    if rng.random() < 0.3:
        # A valid structure (a plausible op on GPU 0, without waiting) with
        # one byte changed.
        valid = bytearray(struct.pack("=I", size) + bytes(size - 4))
        op = rng.randrange(4 if cmd == abi.IOC_SCHED else 3)
        struct.pack_into("=III", valid, 4, op, 0, 1 if cmd == abi.IOC_SCHED else 0)
        if cmd == abi.IOC_QUERY:
            struct.pack_into("=IIIQI", valid, 4, abi.ABI_VERSION, 0, abi.QUOTA.size, quotas, 16)
        elif cmd == abi.IOC_MEM:
            struct.pack_into("=Q", valid, 16, rng.choice([1, 4096, 1 << 20]))
        at = rng.randrange(size)
        if cmd == abi.IOC_QUERY and 16 <= at < 24:
            # Not the quota array's address: the kernel would write a quota
            # wherever a changed byte points, into this process's own heap.
            at = rng.randrange(16)
        valid[at] = rng.randrange(256)
        return bytes(valid)
    head = rng.choice([size, size, ver0, ver0 - 1, 0, 1, 4, size + 8, PAGE, PAGE + 1, 0xFFFF_FFFF])
    data = struct.pack("=I", head) + body
    if rng.random() < 0.15:
        data = struct.pack("=I", head) + rng.randbytes(rng.choice([0, 3, size, PAGE]))
    tail = rng.choice([0, 0, 8, 100])
    data += rng.randbytes(tail) if rng.random() < 0.5 else bytes(tail)
    return data


def alarm_handler(signum: int, frame: object) -> None:
    """SIGALRM interrupts a blocking ACQUIRE (EINTR); nothing else."""


def fuzz_ioctls(seed: int, rounds: int) -> list[object]:
    """Run in a child: open /dev/gpushare and call every ioctl with
    malformed structures, pointers and unknown commands; returns
    [opened errno, {errno: count}] and exits on an undocumented errno."""
    rng = random.Random(seed)
    try:
        fd = os.open(DEV, os.O_RDWR)
    except OSError as e:
        return [e.errno, {}]
    signal.signal(signal.SIGALRM, alarm_handler)
    guard = Guarded()
    # QUOTA entries of up to a page each (quota_size), for every GPU.
    quotas = ctypes.create_string_buffer(abi.MAX_GPUS * PAGE)
    seen: dict[str, int] = {}
    buf = ctypes.create_string_buffer(3 * PAGE)
    for _ in range(rounds):
        kind = rng.random()
        if kind < 0.1:
            # An unknown command: another number of ours, ours with a
            # direction and size, or a type no driver of the VFS answers.
            cmd = rng.choice(
                [
                    (abi.IOC_MAGIC << 8) | rng.choice([0, 4, 5, 0x7F, 0xFF]),
                    abi.IOC_QUERY | (rng.randrange(1, 4) << 30) | (rng.randrange(1 << 14) << 16),
                    abi.IOC_MEM | (3 << 30) | (abi.MEM.size << 16),
                    (rng.choice([0xE6, 0xE8, 0xFF]) << 8) | rng.randrange(256),
                ]
            )
            arg = rng.choice([ctypes.addressof(buf), *BAD_POINTERS])
            expect = {errno.ENOTTY}
        else:
            cmd = rng.choice(list(SIZES))
            data = fuzz_struct(rng, cmd, ctypes.addressof(quotas), guard.place(b"\0" * 16))
            where = rng.random()
            if where < 0.15:
                arg = rng.choice(BAD_POINTERS)
            elif where < 0.35:
                # Ends in the unmapped page: the size field or the body faults.
                data = data[: PAGE - 64]
                arg = guard.place(data, rng.choice([1, 4, 8, 32, len(data)]))
            else:
                ctypes.memmove(buf, data, min(len(data), 3 * PAGE))
                arg = ctypes.addressof(buf)
            expect = IOCTL_ERRNOS
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        rc = LIBC.ioctl(fd, cmd, arg)
        err = ctypes.get_errno() if rc < 0 else 0
        signal.setitimer(signal.ITIMER_REAL, 0)
        if rc > 0 or (err and err not in expect):
            os.write(2, f"ioctl {cmd:#x} arg {arg:#x}: rc {rc} errno {err}\n".encode())
            os._exit(1)
        seen[errno.errorcode.get(err, "OK")] = seen.get(errno.errorcode.get(err, "OK"), 0) + 1
    os.close(fd)
    return [0, seen]


@pytest.mark.usefixtures("kmsg")
def test_fuzz_ioctls(cgroups: MakeCgroup) -> None:
    """Every ioctl, malformed, from root outside any container (alone) and
    from three root and two uid 65534 processes in a registered container's
    cgroup at once; uid 65534 outside one cannot open the device.  Afterwards
    no reservation is left, the refcount is the containers', and a valid
    registration and QUERY work."""
    ok("gpu 0 17179869184")
    ok("add fz-c 0:1073741824:50:0")
    cg = cgroups("fz-c")
    ok("bind fz-c /fz-c")
    outside = in_child(lambda: fuzz_ioctls(SEED, 300))
    assert isinstance(outside, list) and outside[0] == 0, outside
    assert in_child(lambda: fuzz_ioctls(SEED, 1), uid=NOBODY)[0] == errno.ENOENT  # type: ignore[index]

    pids = []
    for k in range(5):
        uid = NOBODY if k >= 3 else None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                (cg / "cgroup.procs").write_text("0\n")
                if uid is not None:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                opened, seen = fuzz_ioctls(SEED * 10 + k, 400)
                assert opened == 0, opened
                os.write(2, f"ioctl fuzzer {k}: {seen}\n".encode())
                code = 0
            except BaseException as e:  # noqa: BLE001 - report, never return into pytest
                os.write(2, f"ioctl fuzzer {k} failed: {e!r}\n".encode())
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0] * 5, codes
    assert value(ROOT / "0/fz-c/memused") == 0
    assert value(ROOT / "0/orphaned_memsize") == 0
    check_consistent()
    check_still_works(cgroups, "fz-ok")
    ok("del fz-c")
    assert refcount() == 0


U64 = (1 << 64) - 1


def ledger_at_the_top(fd_path: str) -> list[int]:
    """Reservations near 2^64 from a process of the container (in a child):
    the errnos of each step, in order."""
    fd = os.open(fd_path, os.O_RDWR)
    out = []
    try:
        for op, nbytes in (
            (abi.MEM_RESERVE, U64 - 2),
            (abi.MEM_RESERVE, 2),  # used + 2 would pass memsize (and wrap past 2^64 - 1)
            (abi.MEM_RESERVE, U64),
            (abi.MEM_RELEASE, U64),  # more than this descriptor holds
            (abi.MEM_RESERVE, 1),
            (abi.MEM_RELEASE, U64 - 1),
        ):
            try:
                abi.mem(fd, op, 0, nbytes)
                out.append(0)
            except abi.MemError as e:
                out.append(e.errno or -1)
    finally:
        os.close(fd)
    return out


@pytest.mark.usefixtures("kmsg")
def test_fuzz_u64_boundaries(cgroups: MakeCgroup) -> None:
    """Sums at the top of 64 bits: memory that would wrap past 2^64 - 1 is
    over-commitment (ENOSPC, EDQUOT), never a small number that fits."""
    ok(f"gpu 0 {U64}")
    ok(f"add fz-a 0:{U64 - 1}")
    assert ctl("add fz-b 0:2") == errno.ENOSPC
    ok("add fz-b 0:1")
    assert ctl("add fz-c 0:1") == errno.ENOSPC
    assert write(ROOT / "0/fz-b/memsize", str(U64)) == errno.ENOSPC
    assert write(ROOT / "0/fz-a/memsize", b"%d" % U64) == errno.ENOSPC
    assert ctl("gpu 0 1") == errno.ENOSPC
    assert write(ROOT / "default_memsize", str(U64)) == 0
    assert ctl("add fz-d 0:0") == errno.ENOSPC
    assert value(ROOT / "0/free_memsize") == 0
    check_consistent()
    ok("del fz-b")
    cg = cgroups("fz-a")
    ok("bind fz-a /fz-a")
    steps = in_child(lambda: ledger_at_the_top(str(DEV)), cgroup=cg)
    assert steps == [0, errno.EDQUOT, errno.EDQUOT, errno.EINVAL, 0, 0], steps
    assert value(ROOT / "0/fz-a/memused") == 0
    ok("del fz-a")
    assert value(ROOT / "0/free_memsize") == U64
    assert value(ROOT / "0/orphaned_memsize") == 0
    check_consistent()
    assert refcount() == 0
