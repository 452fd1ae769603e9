"""nri_gpushare.kmod.abi must say what kmod/include/uapi/gpushare.h says.

Compiles a tiny C program against the header and compares every constant,
the ioctl number and the structure layout with the Python mirror.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from nri_gpushare.kmod import abi
from tests.prereqs import missing

REPO = Path(__file__).resolve().parents[2]
UAPI = REPO / "kmod" / "include" / "uapi"

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <gpushare.h>

#define INT(name) printf(#name " %llu\n", (unsigned long long)(GPUSHARE_##name))
#define STR(name) printf(#name " %s\n", GPUSHARE_##name)

int main(void)
{
	STR(VERSION); STR(PROC_ROOT); STR(DEV_NAME);
	INT(ABI_VERSION); INT(MAX_GPUS); INT(ID_MAX); INT(CMD_MAX); INT(WEIGHT_MAX);
	INT(MAX_INST_MIN); INT(MAX_INST_MAX); INT(MAX_INST_DEFAULT);
	INT(POLICY_MAX); INT(POLICY_DEFAULT);
	INT(PRIO_RATIO_MIN); INT(PRIO_RATIO_MAX); INT(PRIO_RATIO_DEFAULT);
	INT(IOC_MAGIC); INT(IOC_QUERY);
	printf("QUERY_SIZE %zu\n", sizeof(struct gpushare_query));
	printf("QUOTA_SIZE %zu\n", sizeof(struct gpushare_quota));
	printf("QUERY_QUOTAS_AT %zu\n", offsetof(struct gpushare_query, quotas));
	printf("QUERY_ID_AT %zu\n", offsetof(struct gpushare_query, id));
	printf("QUERY_CGROUP_AT %zu\n", offsetof(struct gpushare_query, cgroup_id));
	printf("QUOTA_GPU_AT %zu\n", offsetof(struct gpushare_quota, gpu));
	printf("QUOTA_HIGHPRIO_AT %zu\n", offsetof(struct gpushare_quota, highprio));
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
    assert h["VERSION"] == abi.VERSION
    assert h["PROC_ROOT"] == abi.PROC_ROOT
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
        "QUERY_SIZE": abi.QUERY_SIZE,
        "QUOTA_SIZE": abi.QUOTA.size,
        "QUERY_QUOTAS_AT": abi.QUERY_HEAD.size,
        "QUERY_ID_AT": 16,
        "QUERY_CGROUP_AT": 8,
        "QUOTA_GPU_AT": 8,
        "QUOTA_HIGHPRIO_AT": 16,
    }
    assert {k: int(h[k]) for k in ints} == ints


def test_gpu_file_names_match_the_module() -> None:
    """No container ID may take a GPU directory's file name (gs_core.c's list)."""
    core = (REPO / "kmod" / "gs_core.c").read_text()
    listed = core.split("gs_gpu_files[] = {", 1)[1].split("}", 1)[0]
    names = tuple(w.strip().strip('"') for w in listed.replace("\n", " ").split(","))
    assert names[:-1] == abi.GPU_FILES and names[-1] == "NULL"
    assert not any(abi.valid_id(n) for n in abi.GPU_FILES)


def test_unpack_query_round_trip() -> None:
    buf = bytearray(abi.QUERY_SIZE)
    abi.QUERY_HEAD.pack_into(buf, 0, abi.ABI_VERSION, 2, 77, b"ctr-1")
    abi.QUOTA.pack_into(buf, abi.QUERY_HEAD.size, 5 << 30, 0, 30, 1, 0)
    abi.QUOTA.pack_into(buf, abi.QUERY_HEAD.size + abi.QUOTA.size, 1 << 30, 3, 0, 0, 0)
    r = abi.unpack_query(bytes(buf))
    assert r.container_id == "ctr-1" and r.cgroup_id == 77
    assert [(q.gpu_index, q.memory_bytes, q.core_percent, q.high_priority) for q in r.quotas] == [
        (0, 5 << 30, 30, True),
        (3, 1 << 30, 0, False),
    ]
