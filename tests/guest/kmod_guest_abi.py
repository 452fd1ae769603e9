"""The QUERY ABI's extensible structures against the real module, from a
process in a registered container: size and version checks, older and newer
struct sizes, the quota array's element size and capacity."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from tests.guest.kmod_support import DEV, in_child, ok

pytestmark = pytest.mark.usefixtures("kmod")

MakeCgroup = Callable[[str], Path]
PAGE = os.sysconf("SC_PAGE_SIZE")


def ioctl(head: bytearray, request: int = abi.IOC_QUERY) -> int:
    """ioctl(/dev/gpushare, request, head) through libc, head updated in place; 0 or errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(head)).from_buffer(head)
    fd = os.open(DEV, os.O_RDONLY)
    try:
        rc = libc.ioctl(fd, ctypes.c_ulong(request), buf)
        return ctypes.get_errno() if rc else 0
    finally:
        os.close(fd)


def fields(head: bytes | bytearray) -> list[object]:
    return list(abi.QUERY.unpack_from(head))


def cases() -> dict[str, object]:
    """Every case, run in the child (in the container's cgroup)."""
    out: dict[str, object] = {}
    quotas = ctypes.create_string_buffer(b"\xff" * (4 * 64), 4 * 64)
    addr = ctypes.addressof(quotas)

    head = abi.pack_query(addr, 4)
    out["plain"] = [ioctl(head), fields(head)[1], fields(head)[5:7]]  # quota_cap, count
    out["plain_quotas"] = [abi.QUOTA.unpack_from(quotas, i * abi.QUOTA.size) for i in range(2)]

    for name, kw in {
        "too_small": {"size": abi.QUERY_SIZE_VER0 - 8},
        "abi_0": {"abi_version": 0},
        "flags": {"flags": 1},
        "quota_too_small": {"quota_size": abi.QUOTA_SIZE_VER0 - 8},
        "quota_too_big": {"quota_size": PAGE + 8},
    }.items():
        out[name] = ioctl(abi.pack_query(addr, 4, **kw))

    head = abi.pack_query(addr, 4)
    head[0:4] = bytes(4)
    out["zero_size"] = ioctl(head)
    out["huge"] = ioctl(abi.pack_query(addr, 4, size=PAGE + 8))

    # A newer (bigger) struct: its unknown tail must be zero.
    head = abi.pack_query(addr, 4, size=abi.QUERY_SIZE + 16)
    out["newer_zero_tail"] = [ioctl(head), head[abi.QUERY_SIZE :] == bytes(16), fields(head)[6]]
    head[-1] = 1
    out["newer_nonzero_tail"] = ioctl(head)

    # A newer caller's version is answered in the module's own.
    head = abi.pack_query(addr, 4, abi_version=7)
    out["abi_7"] = [ioctl(head), fields(head)[1]]

    # Bigger quota entries: ours first, then zeros up to the caller's size.
    ctypes.memset(addr, 0xFF, 4 * 64)
    head = abi.pack_query(addr, 4, quota_size=40)
    out["quota_40"] = [
        ioctl(head),
        [abi.QUOTA.unpack_from(quotas, i * 40) for i in range(2)],
        quotas.raw[24:40] == bytes(16) and quotas.raw[64:80] == bytes(16),
        quotas.raw[80:] == b"\xff" * (4 * 64 - 80),
    ]

    # Too small an array: the first entries, the full count, EOVERFLOW.
    ctypes.memset(addr, 0xFF, 4 * 64)
    head = abi.pack_query(addr, 1)
    out["cap_1"] = [
        ioctl(head),
        fields(head)[6],
        abi.QUOTA.unpack_from(quotas, 0),
        quotas.raw[24:48] == b"\xff" * 24,
        bytes(head[40:112]).rstrip(b"\0").decode(),
    ]
    head = abi.pack_query(0, 0)
    out["cap_0"] = [ioctl(head), fields(head)[6]]
    out["bad_pointer"] = ioctl(abi.pack_query(8, 4))
    out["other_request"] = ioctl(abi.pack_query(addr, 4), abi.IOC_SCHED + 1)
    return out


def test_extensible_query(cgroups: MakeCgroup) -> None:
    ok("gpu 0 16000")
    ok("gpu 3 16000")
    ok("add a 0:4000:30:1,3:2000:10:0")
    cg = cgroups("gs-abi")
    ok("bind a /gs-abi")
    ino = os.stat(cg).st_ino
    r = in_child(cases, cgroup=cg)
    q0, q3 = [4000, 0, 30, 1, 0], [2000, 3, 10, 0, 0]
    assert r == {
        "plain": [0, abi.ABI_VERSION, [4, 2]],
        "plain_quotas": [q0, q3],
        "too_small": errno.EINVAL,
        "zero_size": errno.EINVAL,
        "abi_0": errno.EINVAL,
        "flags": errno.EINVAL,
        "quota_too_small": errno.EINVAL,
        "quota_too_big": errno.EINVAL,
        "huge": errno.E2BIG,
        "newer_zero_tail": [0, True, 2],
        "newer_nonzero_tail": errno.E2BIG,
        "abi_7": [0, abi.ABI_VERSION],
        "quota_40": [0, [q0, q3], True, True],
        "cap_1": [errno.EOVERFLOW, 2, q0, True, "a"],
        "cap_0": [errno.EOVERFLOW, 2],
        "bad_pointer": errno.EFAULT,
        "other_request": errno.ENOTTY,
    }
    assert abi.QUERY.unpack_from(abi.pack_query(0, 0))[7] == 0  # sanity: cgroup_id slot
    assert in_child(lambda: abi.query().cgroup_id, cgroup=cg) == ino  # type: ignore[union-attr]
    ok("del a")
