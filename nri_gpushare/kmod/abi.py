"""gpushare.ko's user-space ABI, mirrored from kmod/include/uapi/gpushare.h.

tests/unit/test_kmod_abi.py compiles the header and checks every value here
against it.  The ioctl encoding is the generic Linux one (x86, arm, arm64,
riscv).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
from dataclasses import dataclass

from nri_gpushare.kmod.client import GpuQuota

VERSION = "0.1.0"
ABI_VERSION = 1

PROC_ROOT = "/proc/gpushare"
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
)
CONTAINER_FILES = ("id", "memsize", "weight", "highprio", "meminfo", "cgroup")

# struct gpushare_quota: __u64 memsize; __u32 gpu, weight, highprio, reserved
QUOTA = struct.Struct("=QIIII")
# struct gpushare_query: __u32 abi_version, count; __u64 cgroup_id; char id[72]; quotas[16]
QUERY_HEAD = struct.Struct(f"=IIQ{ID_MAX + 8}s")
QUERY_SIZE = QUERY_HEAD.size + MAX_GPUS * QUOTA.size

_IOC_READ = 2
IOC_MAGIC = ord("G")


def _ior(magic: int, nr: int, size: int) -> int:
    return (_IOC_READ << 30) | (size << 16) | (magic << 8) | nr


IOC_QUERY = _ior(IOC_MAGIC, 0x01, QUERY_SIZE)


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


def unpack_query(buf: bytes) -> QueryResult:
    _abi, count, cgroup_id, raw_id = QUERY_HEAD.unpack_from(buf)
    quotas = []
    for i in range(min(count, MAX_GPUS)):
        memsize, gpu, weight, highprio, _ = QUOTA.unpack_from(buf, QUERY_HEAD.size + i * QUOTA.size)
        quotas.append(GpuQuota(gpu, memsize, weight, bool(highprio)))
    return QueryResult(raw_id.split(b"\0", 1)[0].decode(), cgroup_id, tuple(quotas))


def query(device: str = DEV_PATH) -> QueryResult | None:
    """The calling process's container quota, or None when its cgroup has none.

    Raises OSError when the device cannot be opened (module not loaded).
    """
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = bytearray(QUERY_SIZE)
        try:
            fcntl.ioctl(fd, IOC_QUERY, buf, True)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return unpack_query(bytes(buf))
    finally:
        os.close(fd)
