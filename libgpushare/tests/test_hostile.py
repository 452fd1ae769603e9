"""libgpushare.so where it is loaded without being asked: into every
program of a container (/etc/ld.so.preload), whatever the image's C
library, and under a tenant who controls the environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from conftest import Build, Client, GiB, MiB, quota_env

from tests.prereqs import missing

# The oldest glibc a container image may reasonably have (RHEL/CentOS 7).
OLDEST_GLIBC = (2, 17)


def _glibc_versions(lib: str) -> set[tuple[int, ...]]:
    if shutil.which("objdump") is None:
        missing("objdump (binutils) is needed")
    out = subprocess.run(["objdump", "-T", lib], capture_output=True, text=True, check=True).stdout
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", out)}


def _needed(lib: str) -> list[str]:
    out = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True, check=True).stdout
    return re.findall(r"NEEDED\s+(\S+)", out)


def test_library_loads_under_an_older_glibc_than_the_build_hosts(build: Build) -> None:
    # A symbol version newer than the image's glibc makes the loader refuse
    # every program of the container ("version `GLIBC_2.34' not found").
    versions = _glibc_versions(str(build.lib))
    assert versions and max(versions) <= OLDEST_GLIBC, sorted(versions)
    # Where dlopen and pthread_once live before glibc 2.34.
    needed = _needed(str(build.lib))
    assert "libdl.so.2" in needed and "libpthread.so.0" in needed, needed


# Free `a` in the fake driver behind the interposer's back (the C
# library's own dlsym, called directly), as a racing double free in another
# thread, or a context torn down, would.
_FREE_BEHIND = """
import ctypes
real_dlsym = ctypes.CDLL("libc.so.6").dlsym
real_dlsym.restype = ctypes.c_void_p
real_dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
raw = real_dlsym(ctypes.CDLL("libcuda.so.1")._handle, b"cuMemFree_v2")
raw_free = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)(raw)
"""


def test_free_of_memory_the_driver_no_longer_has_releases_its_quota(client: Client) -> None:
    r = client.run(
        _FREE_BEHIND
        + f"""
device(0)
a = ok(d.cuMemAlloc, {256 * MiB})
R["behind"] = raw_free(int(a))
R["free"] = call(d.cuMemFree, a)[0]
R["after"] = mem_info()
""",
        env=quota_env(GiB),
    )
    assert r["behind"] == 0
    assert r["free"] == "CUDA_ERROR_INVALID_VALUE"
    # The driver says the pointer is no allocation: its bytes must not stay
    # reserved for the rest of the process (or, with the module, the
    # container).
    assert r["after"] == {"free": GiB, "total": GiB}


_PROBE = """
import ctypes, json
dl = ctypes.CDLL(None)
dl.dlsym.restype = ctypes.c_void_p
dl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
found = {n: bool(dl.dlsym(None, n.encode())) for n in ("cuGetProcAddress_v2", "cuMemAlloc_v2")}
maps = open("/proc/self/maps").read()
print(json.dumps({"found": found, "libcuda": "libcuda.so" in maps}))
"""


def test_a_program_probing_for_cuda_does_not_get_the_driver_loaded(build: Build) -> None:
    # dlsym(RTLD_DEFAULT, "cu...") in a program that never loaded libcuda
    # (a framework asking whether CUDA is there): the answer is the one it
    # gets without the interposer (nothing), and the interposer must not
    # dlopen the driver into it.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_PRELOAD": str(build.lib),
        "LD_LIBRARY_PATH": str(build.fake_dir),
        "GPUSHARE_MEMORY_LIMIT": str(GiB),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    r = json.loads(proc.stdout)
    assert r == {"found": {"cuGetProcAddress_v2": False, "cuMemAlloc_v2": False}, "libcuda": False}
