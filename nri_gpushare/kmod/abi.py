"""gpushare.ko's user-space ABI, mirrored from kmod/include/uapi/gpushare.h.

tests/unit/test_kmod_abi.py compiles the header and checks every value here
against it.  The ioctl encoding is the generic Linux one (x86, arm, arm64,
riscv).  VERSION is not in the uapi header (it carries no strings but the
device's name), nor is the procfs root (`nri_gpushare.names.PROC_ROOT`); the
test reads both from the module's own kmod/gs_kmod.h.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import struct
from dataclasses import dataclass

from nri_gpushare.share.kernel import GpuQuota

VERSION = "0.1.0"
# 2: GPUSHARE_IOC_MEM (a version-1 module answers it ENOTTY); 3: GPUSHARE_IOC_SCHED;
# 4: SCHED's EXTEND op, EARLY flag and drain_ns/forced_ends (a version-3 module
# answers EXTEND and EARLY with EINVAL and leaves those outputs as they were)
ABI_VERSION = 4

DEV_NAME = "gpushare"
DEV_PATH = f"/dev/{DEV_NAME}"

MAX_GPUS = 16
ID_MAX = 64
CMD_MAX = 4096

WEIGHT_MAX = 100
MAX_INST_MIN = 1
MAX_INST_MAX = 25
MAX_INST_DEFAULT = 16
POLICY_MAX = 5
POLICY_DEFAULT = 2
PRIO_RATIO_MIN = 20
PRIO_RATIO_MAX = 99
PRIO_RATIO_DEFAULT = 80
SLICE_US_MIN = 1000  # a GPU's scheduling slice, microseconds
SLICE_US_MAX = 1_000_000
SLICE_US_DEFAULT = 10_000
DRAIN_US_MIN = 1000  # a holder's longest drain past its slice, microseconds
DRAIN_US_MAX = 10_000_000
DRAIN_US_DEFAULT = 100_000

# Container IDs the module accepts (it also refuses ".", ".." and GPU_FILES).
ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Files in /proc/gpushare/<gpu>/; no container ID may take these names.
GPU_FILES = (
    "free_weight",
    "major",
    "max_inst",
    "policy",
    "prio_ratio",
    "total_memsize",
    "free_memsize",
    "nr_inst",
    "orphaned_memsize",
    "slice_us",
    "drain_us",
    "forced_ends",
)
# Bytes still reserved by processes of deleted containers (in GPU_FILES).
ORPHANED = "orphaned_memsize"
CONTAINER_FILES = (
    "id",
    "memsize",
    "weight",
    "highprio",
    "meminfo",
    "cgroup",
    "memused",
    "gputime",
)

# struct gpushare_quota: __u64 memsize; __u32 gpu, weight, highprio, __reserved
QUOTA = struct.Struct("=QIIII")
QUOTA_SIZE_VER0 = 24
# struct gpushare_query: __u32 size, abi_version, flags, quota_size; __u64 quotas;
# __u32 quota_cap, count; __u64 cgroup_id; char id[72]
QUERY = struct.Struct(f"=IIIIQIIQ{ID_MAX + 8}s")
QUERY_SIZE = QUERY.size
QUERY_SIZE_VER0 = 112

# struct gpushare_mem: __u32 size, op, gpu, flags; __u64 bytes, quota, used, mine
MEM = struct.Struct("=IIIIQQQQ")
MEM_SIZE_VER0 = 48
MEM_INFO = 0
MEM_RESERVE = 1
MEM_RELEASE = 2
_UNSET = (1 << 64) - 1  # mem() presets the out fields to this

# struct gpushare_sched: __u32 size, op, gpu, flags; __u64 used_ns, until,
# slice_ns, gputime_ns; __u32 policy, weight, highprio, out_flags; (ABI 4)
# __u64 drain_ns, forced_ends
SCHED = struct.Struct("=IIIIQQQQIIIIQQ")
SCHED_SIZE_VER0 = 64  # ABI 3's structure
_SCHED_VER0 = struct.Struct(SCHED.format[:-2])
SCHED_SIZE_VER1 = 80  # ABI 4: drain_ns, forced_ends
SCHED_INFO = 0
SCHED_ACQUIRE = 1
SCHED_RELEASE = 2
SCHED_EXTEND = 3  # ABI 4: draining, push the slice's forced end
SCHED_NOWAIT = 0x1  # in flags: ACQUIRE answers EAGAIN instead of blocking
SCHED_EARLY = 0x2  # in flags (ABI 4): ACQUIRE renews before the slice's end, never blocks
SCHED_NATIVE = 0x1  # out flags: policy 5, nothing is scheduled

IOC_MAGIC = 0xE7


def _io(magic: int, nr: int) -> int:
    """_IO(): no direction and no size (the structures carry their size)."""
    return (magic << 8) | nr


IOC_QUERY = _io(IOC_MAGIC, 0x01)
IOC_MEM = _io(IOC_MAGIC, 0x02)
IOC_SCHED = _io(IOC_MAGIC, 0x03)


def valid_id(container_id: str) -> bool:
    return (
        ID_RE.fullmatch(container_id) is not None
        and container_id not in (".", "..")
        and container_id not in GPU_FILES
    )


@dataclass(frozen=True)
class QueryResult:
    """What GPUSHARE_IOC_QUERY says about the caller's container."""

    container_id: str
    cgroup_id: int
    quotas: tuple[GpuQuota, ...]


def pack_query(
    quotas_addr: int,
    quota_cap: int,
    *,
    size: int = QUERY_SIZE,
    abi_version: int = ABI_VERSION,
    flags: int = 0,
    quota_size: int = QUOTA.size,
) -> bytearray:
    """A struct gpushare_query as user space passes it, `size` bytes long
    (longer than QUERY_SIZE: zero-filled)."""
    buf = bytearray(max(size, QUERY_SIZE))
    QUERY.pack_into(buf, 0, size, abi_version, flags, quota_size, quotas_addr, quota_cap, 0, 0, b"")
    return buf[:size]


def unpack_query(head: bytes, quotas: bytes) -> QueryResult:
    """A filled-in struct gpushare_query and the quota array it pointed to."""
    _size, _abi, _flags, quota_size, _addr, cap, count, cgroup_id, raw_id = QUERY.unpack_from(head)
    entries = []
    for i in range(min(count, cap)):
        memsize, gpu, weight, highprio, _ = QUOTA.unpack_from(quotas, i * quota_size)
        entries.append(GpuQuota(gpu, memsize, weight, bool(highprio)))
    return QueryResult(raw_id.split(b"\0", 1)[0].decode(), cgroup_id, tuple(entries))


def query(device: str = DEV_PATH) -> QueryResult | None:
    """The calling process's container quota, or None when its cgroup has none.

    The module refuses to open the device (ENOENT) for a caller that is
    neither root nor in a registered container; that is None too.  Raises
    OSError when the device cannot be opened otherwise (module not loaded:
    no device node, or ENXIO/ENODEV from a node left behind).
    """
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.exists(device):
            return None  # the module's answer: nothing registered for this caller
        raise
    try:
        quotas = ctypes.create_string_buffer(MAX_GPUS * QUOTA.size)
        buf = pack_query(ctypes.addressof(quotas), MAX_GPUS)
        try:
            fcntl.ioctl(fd, IOC_QUERY, buf, True)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return unpack_query(bytes(buf), quotas.raw)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class MemState:
    """What GPUSHARE_IOC_MEM answers about one GPU: the container's quota
    (0 once it is deleted), the bytes all its processes hold there (used)
    and the bytes this descriptor holds (mine)."""

    quota: int
    used: int
    mine: int


class MemError(OSError):
    """GPUSHARE_IOC_MEM refused; `state` is what the module answered with
    it (EDQUOT, a release beyond what the descriptor holds, a deleted
    container), or None when it had nothing to say (no container, no
    quota on that GPU, a bad request)."""

    state: MemState | None = None


def pack_mem(
    op: int, gpu: int, nbytes: int = 0, *, size: int = MEM.size, flags: int = 0
) -> bytearray:
    """A struct gpushare_mem as user space passes it, `size` bytes long
    (longer than MEM.size: zero-filled)."""
    buf = bytearray(max(size, MEM.size))
    MEM.pack_into(buf, 0, size, op, gpu, flags, nbytes, 0, 0, 0)
    return buf[:size]


def unpack_mem(buf: bytes) -> MemState:
    _size, _op, _gpu, _flags, _bytes, quota, used, mine = MEM.unpack_from(buf)
    return MemState(quota, used, mine)


def mem(fd: int, op: int, gpu: int, nbytes: int = 0) -> MemState:
    """One GPUSHARE_IOC_MEM on an open /dev/gpushare descriptor: MEM_INFO,
    MEM_RESERVE or MEM_RELEASE of `nbytes` on GPU `gpu` (its index, as in
    the container's quota).  Raises MemError (an OSError) with the module's
    errno: ENOENT the descriptor acts for no container (or it was deleted),
    ENXIO no quota on that GPU, EDQUOT over the quota (nothing reserved),
    EINVAL a bad request or a release beyond what the descriptor holds,
    ENOTTY a module older than ABI version 2."""
    buf = pack_mem(op, gpu, nbytes)
    # Out fields the module never answers with: left as they are, they say
    # that it did not answer.
    MEM.pack_into(buf, 0, MEM.size, op, gpu, 0, nbytes, _UNSET, _UNSET, _UNSET)
    try:
        fcntl.ioctl(fd, IOC_MEM, buf, True)
    except OSError as e:
        err = MemError(e.errno, os.strerror(e.errno or 0))
        state = unpack_mem(bytes(buf))
        if (state.quota, state.used, state.mine) != (_UNSET, _UNSET, _UNSET):
            err.state = state
        raise err from None
    return unpack_mem(bytes(buf))


@dataclass(frozen=True)
class SchedState:
    """What GPUSHARE_IOC_SCHED answers about one GPU: until (CLOCK_MONOTONIC
    ns: the grant's end, or when to ask again), the GPU's slice and policy,
    the GPU time charged to the container there, its weight and priority,
    and the out flags (SCHED_NATIVE); with ABI 4, the GPU's drain bound and
    its count of slices ended by force (None: a 64-byte call, or a module
    of ABI 3 that did not answer them)."""

    until: int
    slice_ns: int
    gputime_ns: int
    policy: int
    weight: int
    highprio: int
    out_flags: int
    drain_ns: int | None = None
    forced_ends: int | None = None


class SchedError(OSError):
    """GPUSHARE_IOC_SCHED refused (EAGAIN with SCHED_NOWAIT, EINTR, ENOENT,
    ENXIO, EINVAL...); `state` is what the module answered with it, or None
    when it had nothing to say."""

    state: SchedState | None = None


def pack_sched(
    op: int,
    gpu: int,
    used_ns: int = 0,
    *,
    size: int = SCHED.size,
    flags: int = 0,
) -> bytearray:
    """A struct gpushare_sched as user space passes it, `size` bytes long
    (longer than SCHED.size: zero-filled; SCHED_SIZE_VER0: ABI 3's)."""
    buf = bytearray(max(size, SCHED.size))
    SCHED.pack_into(buf, 0, size, op, gpu, flags, used_ns, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return buf[:size]


def unpack_sched(buf: bytes) -> SchedState:
    """A filled-in struct gpushare_sched: 80 bytes or more (ABI 4), or 64
    (ABI 3: drain_ns and forced_ends None).  An ABI 4 output still at the
    _UNSET that sched() preset it to was not answered: None."""
    old = len(buf) < SCHED.size
    fields = (_SCHED_VER0 if old else SCHED).unpack_from(buf)
    until, slice_ns, gputime, policy, weight, highprio, out_flags = fields[5:12]
    drain, forced = (None, None) if old else (v if v != _UNSET else None for v in fields[12:])
    return SchedState(until, slice_ns, gputime, policy, weight, highprio, out_flags, drain, forced)


def sched(
    fd: int,
    op: int,
    gpu: int,
    used_ns: int = 0,
    *,
    flags: int = 0,
    size: int = SCHED.size,
) -> SchedState:
    """One GPUSHARE_IOC_SCHED on an open /dev/gpushare descriptor:
    SCHED_INFO, SCHED_ACQUIRE (blocks until granted unless flags has
    SCHED_NOWAIT or SCHED_EARLY), SCHED_RELEASE with the GPU time (ns) the
    work took, or SCHED_EXTEND (ABI 4).  `size` SCHED_SIZE_VER0 calls as an
    ABI 3 caller does (64 bytes; drain_ns and forced_ends None).  Raises
    SchedError (an OSError) with the module's errno."""
    if size not in (SCHED_SIZE_VER0, SCHED.size):
        raise ValueError(f"sched(): size {size} is neither {SCHED_SIZE_VER0} nor {SCHED.size}")
    buf = bytearray(SCHED.size)
    SCHED.pack_into(
        buf, 0, size, op, gpu, flags, used_ns, _UNSET, _UNSET, _UNSET, 0, 0, 0, 0, _UNSET, _UNSET
    )
    buf = buf[:size]
    try:
        fcntl.ioctl(fd, IOC_SCHED, buf, True)
    except OSError as e:
        err = SchedError(e.errno, os.strerror(e.errno or 0))
        state = unpack_sched(bytes(buf))
        if (state.until, state.slice_ns, state.gputime_ns) != (_UNSET, _UNSET, _UNSET):
            err.state = state
        raise err from None
    return unpack_sched(bytes(buf))
