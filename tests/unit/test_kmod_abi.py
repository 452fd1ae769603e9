"""nri_gpushare.kmod.abi must say what kmod/include/uapi/gpushare.h says.

Compiles a tiny C program against the header and compares every constant,
the ioctl number and the structure layout with the Python mirror; the
module's version and procfs name come from its internal kmod/gs_kmod.h.
"""

from __future__ import annotations

import errno
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from nri_gpushare.kmod import abi
from nri_gpushare.names import PROC_ROOT
from tests.prereqs import missing

REPO = Path(__file__).resolve().parents[2]
KMOD = REPO / "kmod"
UAPI = KMOD / "include" / "uapi"

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <gpushare.h>

#define INT(name) printf(#name " %llu\n", (unsigned long long)(GPUSHARE_##name))
#define AT(s, f) printf(#s "." #f " %zu\n", offsetof(struct gpushare_##s, f))

int main(void)
{
	printf("DEV_NAME %s\n", GPUSHARE_DEV_NAME);
	INT(ABI_VERSION); INT(MAX_GPUS); INT(ID_MAX); INT(CMD_MAX); INT(WEIGHT_MAX);
	INT(MAX_INST_MIN); INT(MAX_INST_MAX); INT(MAX_INST_DEFAULT);
	INT(POLICY_MAX); INT(POLICY_DEFAULT);
	INT(PRIO_RATIO_MIN); INT(PRIO_RATIO_MAX); INT(PRIO_RATIO_DEFAULT);
	INT(IOC_MAGIC); INT(IOC_QUERY); INT(QUERY_SIZE_VER0); INT(QUOTA_SIZE_VER0);
	INT(IOC_MEM); INT(MEM_SIZE_VER0); INT(MEM_INFO); INT(MEM_RESERVE); INT(MEM_RELEASE);
	INT(SLICE_US_MIN); INT(SLICE_US_MAX); INT(SLICE_US_DEFAULT);
	INT(DRAIN_US_MIN); INT(DRAIN_US_MAX); INT(DRAIN_US_DEFAULT);
	INT(IOC_SCHED); INT(SCHED_SIZE_VER0); INT(SCHED_SIZE_VER1); INT(SCHED_INFO);
	INT(SCHED_ACQUIRE); INT(SCHED_RELEASE); INT(SCHED_EXTEND);
	INT(SCHED_NOWAIT); INT(SCHED_EARLY); INT(SCHED_NATIVE);
	printf("QUERY_SIZE %zu\n", sizeof(struct gpushare_query));
	printf("QUOTA_SIZE %zu\n", sizeof(struct gpushare_quota));
	printf("MEM_SIZE %zu\n", sizeof(struct gpushare_mem));
	printf("SCHED_SIZE %zu\n", sizeof(struct gpushare_sched));
	AT(sched, size); AT(sched, op); AT(sched, gpu); AT(sched, flags); AT(sched, used_ns);
	AT(sched, until); AT(sched, slice_ns); AT(sched, gputime_ns); AT(sched, policy);
	AT(sched, weight); AT(sched, highprio); AT(sched, out_flags);
	AT(sched, drain_ns); AT(sched, forced_ends);
	AT(mem, size); AT(mem, op); AT(mem, gpu); AT(mem, flags); AT(mem, bytes);
	AT(mem, quota); AT(mem, used); AT(mem, mine);
	AT(query, size); AT(query, abi_version); AT(query, flags); AT(query, quota_size);
	AT(query, quotas); AT(query, quota_cap); AT(query, count); AT(query, cgroup_id);
	AT(query, id);
	AT(quota, memsize); AT(quota, gpu); AT(quota, weight); AT(quota, highprio);
	AT(quota, __reserved);
	return 0;
}
"""


def header_values(tmp_path: Path) -> dict[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        missing("no C compiler (cc/gcc) to compile the uapi header")
    src = tmp_path / "abi.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "abi"
    subprocess.run([cc, "-Wall", "-Werror", "-I", str(UAPI), "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_python_mirror_matches_header(tmp_path: Path) -> None:
    h = header_values(tmp_path)
    assert h["DEV_NAME"] == abi.DEV_NAME
    ints = {
        "ABI_VERSION": abi.ABI_VERSION,
        "MAX_GPUS": abi.MAX_GPUS,
        "ID_MAX": abi.ID_MAX,
        "CMD_MAX": abi.CMD_MAX,
        "WEIGHT_MAX": abi.WEIGHT_MAX,
        "MAX_INST_MIN": abi.MAX_INST_MIN,
        "MAX_INST_MAX": abi.MAX_INST_MAX,
        "MAX_INST_DEFAULT": abi.MAX_INST_DEFAULT,
        "POLICY_MAX": abi.POLICY_MAX,
        "POLICY_DEFAULT": abi.POLICY_DEFAULT,
        "PRIO_RATIO_MIN": abi.PRIO_RATIO_MIN,
        "PRIO_RATIO_MAX": abi.PRIO_RATIO_MAX,
        "PRIO_RATIO_DEFAULT": abi.PRIO_RATIO_DEFAULT,
        "IOC_MAGIC": abi.IOC_MAGIC,
        "IOC_QUERY": abi.IOC_QUERY,
        "QUERY_SIZE_VER0": abi.QUERY_SIZE_VER0,
        "QUOTA_SIZE_VER0": abi.QUOTA_SIZE_VER0,
        "QUERY_SIZE": abi.QUERY_SIZE,
        "QUOTA_SIZE": abi.QUOTA.size,
        "IOC_MEM": abi.IOC_MEM,
        "MEM_SIZE_VER0": abi.MEM_SIZE_VER0,
        "MEM_INFO": abi.MEM_INFO,
        "MEM_RESERVE": abi.MEM_RESERVE,
        "MEM_RELEASE": abi.MEM_RELEASE,
        "MEM_SIZE": abi.MEM.size,
        "SLICE_US_MIN": abi.SLICE_US_MIN,
        "SLICE_US_MAX": abi.SLICE_US_MAX,
        "SLICE_US_DEFAULT": abi.SLICE_US_DEFAULT,
        "DRAIN_US_MIN": abi.DRAIN_US_MIN,
        "DRAIN_US_MAX": abi.DRAIN_US_MAX,
        "DRAIN_US_DEFAULT": abi.DRAIN_US_DEFAULT,
        "IOC_SCHED": abi.IOC_SCHED,
        "SCHED_SIZE_VER0": abi.SCHED_SIZE_VER0,
        "SCHED_SIZE_VER1": abi.SCHED_SIZE_VER1,
        "SCHED_INFO": abi.SCHED_INFO,
        "SCHED_ACQUIRE": abi.SCHED_ACQUIRE,
        "SCHED_RELEASE": abi.SCHED_RELEASE,
        "SCHED_EXTEND": abi.SCHED_EXTEND,
        "SCHED_NOWAIT": abi.SCHED_NOWAIT,
        "SCHED_EARLY": abi.SCHED_EARLY,
        "SCHED_NATIVE": abi.SCHED_NATIVE,
        "SCHED_SIZE": abi.SCHED.size,
    }
    assert {k: int(h[k]) for k in ints} == ints
    # Field offsets, in the order of the Python struct formats.
    query_fields = [
        "size",
        "abi_version",
        "flags",
        "quota_size",
        "quotas",
        "quota_cap",
        "count",
        "cgroup_id",
        "id",
    ]
    quota_fields = ["memsize", "gpu", "weight", "highprio", "__reserved"]
    assert [int(h[f"query.{f}"]) for f in query_fields] == offsets(abi.QUERY.format)
    assert [int(h[f"quota.{f}"]) for f in quota_fields] == offsets(abi.QUOTA.format)
    mem_fields = ["size", "op", "gpu", "flags", "bytes", "quota", "used", "mine"]
    assert [int(h[f"mem.{f}"]) for f in mem_fields] == offsets(abi.MEM.format)
    sched_fields = [
        "size",
        "op",
        "gpu",
        "flags",
        "used_ns",
        "until",
        "slice_ns",
        "gputime_ns",
        "policy",
        "weight",
        "highprio",
        "out_flags",
        "drain_ns",
        "forced_ends",
    ]
    assert [int(h[f"sched.{f}"]) for f in sched_fields] == offsets(abi.SCHED.format)


def offsets(fmt: str) -> list[int]:
    """Where each field of a "=..." struct format starts."""
    out, at = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt):
        out.append(at)
        at += struct_size(code, int(count or 1))
    return out


def struct_size(code: str, count: int) -> int:
    return struct.calcsize(f"={count}{code}")


def test_ioctl_magic_is_free_and_requests_never_change_with_size() -> None:
    """0xE7 is in no range of the kernel's ioctl-number.rst; _IO carries no size."""
    assert abi.IOC_MAGIC == 0xE7
    assert abi.IOC_QUERY >> 16 == 0  # no direction, no size bits
    assert abi.IOC_MEM >> 16 == 0
    assert abi.IOC_SCHED >> 16 == 0
    assert abi.ABI_VERSION == 4  # the version that brought EXTEND, EARLY, drain_ns
    assert abi.MEM.size == abi.MEM_SIZE_VER0 == 48
    assert abi.SCHED.size == abi.SCHED_SIZE_VER1 == 80
    # ABI 3's structure is ABI 4's first 64 bytes: fields were only added.
    assert abi.SCHED_SIZE_VER0 == 64 == offsets(abi.SCHED.format)[-2]


def test_uapi_header_has_no_paths_or_versions() -> None:
    header = (UAPI / "gpushare.h").read_text()
    code = re.sub(r"/\*.*?\*/", "", header, flags=re.S)  # comments may quote
    strings = re.findall(r'"([^"]*)"', code)
    assert strings == ["gpushare"], strings  # only the device's name
    assert "GPUSHARE_VERSION" not in header and "PROC_ROOT" not in header


def test_module_version_and_proc_root_match() -> None:
    """VERSION and names.PROC_ROOT mirror the module's internal header."""
    internal = (KMOD / "gs_kmod.h").read_text()
    version = re.search(r'#define GPUSHARE_VERSION\s+"([^"]+)"', internal)
    proc_name = re.search(r'#define GS_PROC_NAME\s+"([^"]+)"', internal)
    assert version and version.group(1) == abi.VERSION
    assert proc_name and f"/proc/{proc_name.group(1)}" == PROC_ROOT


def test_gpu_file_names_match_the_module() -> None:
    """No container ID may take a GPU directory's file name (gs_core.c's list,
    the one the module's procfs tree creates its GPU files from)."""
    core = (KMOD / "gs_core.c").read_text()
    listed = core.split("gs_gpu_files[GS_GPU_NFILES] = {", 1)[1].split("};", 1)[0]
    assert tuple(re.findall(r'"([a-z_]+)"', listed)) == abi.GPU_FILES
    assert not any(abi.valid_id(n) for n in abi.GPU_FILES)
    assert abi.ORPHANED in abi.GPU_FILES
    assert "slice_us" in abi.GPU_FILES and not abi.valid_id("slice_us")
    assert {"drain_us", "forced_ends"} <= set(abi.GPU_FILES)


def test_container_file_names_match_the_module() -> None:
    proc = (KMOD / "gs_proc.c").read_text()
    listed = proc.split("gs_ctr_names[GS_CTR_NATTR] = {", 1)[1].split("};", 1)[0]
    assert tuple(re.findall(r'"([a-z_]+)"', listed)) == abi.CONTAINER_FILES


def test_unpack_query_round_trip() -> None:
    head = abi.pack_query(0x1000, 4)
    assert len(head) == abi.QUERY_SIZE
    fields = list(abi.QUERY.unpack_from(head))
    assert fields[:6] == [abi.QUERY_SIZE, abi.ABI_VERSION, 0, abi.QUOTA.size, 0x1000, 4]
    fields[6], fields[7], fields[8] = 2, 77, b"ctr-1"
    abi.QUERY.pack_into(head, 0, *fields)
    quotas = bytearray(4 * abi.QUOTA.size)
    abi.QUOTA.pack_into(quotas, 0, 5 << 30, 0, 30, 1, 0)
    abi.QUOTA.pack_into(quotas, abi.QUOTA.size, 1 << 30, 3, 0, 0, 0)
    r = abi.unpack_query(bytes(head), bytes(quotas))
    assert r.container_id == "ctr-1" and r.cgroup_id == 77
    assert [(q.gpu_index, q.memory_bytes, q.core_percent, q.high_priority) for q in r.quotas] == [
        (0, 5 << 30, 30, True),
        (3, 1 << 30, 0, False),
    ]


def test_pack_query_sizes() -> None:
    assert len(abi.pack_query(0, 0, size=abi.QUERY_SIZE + 8)) == abi.QUERY_SIZE + 8
    assert abi.pack_query(0, 0, size=abi.QUERY_SIZE + 8)[abi.QUERY_SIZE :] == bytes(8)


def test_pack_and_unpack_mem() -> None:
    buf = abi.pack_mem(abi.MEM_RESERVE, 3, 1 << 40)
    assert len(buf) == abi.MEM.size
    assert abi.MEM.unpack_from(buf) == (abi.MEM.size, abi.MEM_RESERVE, 3, 0, 1 << 40, 0, 0, 0)
    longer = abi.pack_mem(abi.MEM_INFO, 0, size=abi.MEM.size + 8, flags=1)
    assert len(longer) == abi.MEM.size + 8 and longer[abi.MEM.size :] == bytes(8)
    assert abi.MEM.unpack_from(longer)[:4] == (abi.MEM.size + 8, abi.MEM_INFO, 0, 1)
    abi.MEM.pack_into(buf, 0, 48, 1, 3, 0, 5, 100, 60, 5)
    assert abi.unpack_mem(bytes(buf)) == abi.MemState(quota=100, used=60, mine=5)


def test_mem_on_something_else_raises_oserror(tmp_path: Path) -> None:
    """A descriptor that is not /dev/gpushare: ENOTTY (as from a version-1 module)."""
    with open(tmp_path / "f", "wb") as f:
        with pytest.raises(abi.MemError) as e:
            abi.mem(f.fileno(), abi.MEM_INFO, 0)
    assert e.value.errno == errno.ENOTTY and e.value.state is None
    assert isinstance(e.value, OSError)


def test_pack_and_unpack_sched() -> None:
    buf = abi.pack_sched(abi.SCHED_RELEASE, 2, 1234)
    assert len(buf) == abi.SCHED.size
    assert abi.SCHED.unpack_from(buf) == (
        (abi.SCHED.size, abi.SCHED_RELEASE, 2, 0, 1234) + (0,) * 9
    )
    longer = abi.pack_sched(abi.SCHED_ACQUIRE, 0, size=abi.SCHED.size + 8, flags=abi.SCHED_NOWAIT)
    assert len(longer) == abi.SCHED.size + 8 and longer[abi.SCHED.size :] == bytes(8)
    assert abi.SCHED.unpack_from(longer)[:4] == (
        abi.SCHED.size + 8,
        abi.SCHED_ACQUIRE,
        0,
        abi.SCHED_NOWAIT,
    )
    abi.SCHED.pack_into(
        buf, 0, 80, 1, 0, 0, 0, 99, 10_000_000, 5, 2, 30, 1, abi.SCHED_NATIVE, 10**8, 3
    )
    assert abi.unpack_sched(bytes(buf)) == abi.SchedState(
        until=99,
        slice_ns=10_000_000,
        gputime_ns=5,
        policy=2,
        weight=30,
        highprio=1,
        out_flags=abi.SCHED_NATIVE,
        drain_ns=10**8,
        forced_ends=3,
    )
    # An ABI 3 caller's 64 bytes: the same fields, no ABI 4 outputs.
    old = abi.pack_sched(abi.SCHED_ACQUIRE, 1, size=abi.SCHED_SIZE_VER0)
    assert len(old) == 64 and abi.SCHED.unpack_from(abi.pack_sched(abi.SCHED_ACQUIRE, 1))[0] == 80
    assert old[:4] == struct.pack("=I", 64) and old[4:] == abi.pack_sched(1, 1)[4:64]
    assert abi.unpack_sched(bytes(buf)[:64]) == abi.SchedState(
        99, 10_000_000, 5, 2, 30, 1, abi.SCHED_NATIVE, None, None
    )
    # Outputs an ABI 3 module leaves as sched() preset them: not answered.
    unset = (1 << 64) - 1
    abi.SCHED.pack_into(buf, 0, 80, 1, 0, 0, 0, 99, 10_000_000, 5, 2, 30, 1, 0, unset, unset)
    state = abi.unpack_sched(bytes(buf))
    assert (state.drain_ns, state.forced_ends, state.gputime_ns) == (None, None, 5)


def test_sched_on_something_else_raises_oserror(tmp_path: Path) -> None:
    """A descriptor that is not /dev/gpushare: ENOTTY (as from a version-2 module)."""
    with open(tmp_path / "f", "wb") as f:
        with pytest.raises(abi.SchedError) as e:
            abi.sched(f.fileno(), abi.SCHED_INFO, 0)
    assert e.value.errno == errno.ENOTTY and e.value.state is None
    assert isinstance(e.value, OSError)
    with open(tmp_path / "g", "wb") as f:
        with pytest.raises(abi.SchedError) as e:
            abi.sched(f.fileno(), abi.SCHED_INFO, 0, size=abi.SCHED_SIZE_VER0)
    assert e.value.errno == errno.ENOTTY and e.value.state is None
    with pytest.raises(ValueError):
        abi.sched(0, abi.SCHED_INFO, 0, size=72)
