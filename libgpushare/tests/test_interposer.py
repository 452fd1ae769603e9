"""libgpushare.so under a real third-party CUDA client, on fake drivers.

Every test runs a small cuda-bindings program (see conftest.CLIENT_PRELUDE
for its helpers) in its own process with LD_PRELOAD=libgpushare.so, in the
interposer's standalone mode (no /dev/gpushare here): the quota comes from
GPUSHARE_MEMORY_LIMIT in GPUSHARE_GPU_UUIDS order.  Sizes are multiples of
2 MiB, the fake's (and real GPUs') allocation granularity, so figures are
exact.

Here: what NVML shows (pynvml against the fake NVML); then the proof that
these checks can fail: the same program against the build without the
dlsym / cuGetProcAddress wrappers, and against no preload, sees the whole
GPU and allocates past the quota; last, module mode's NVML on a GPU that is
not the container's.  The quota through the driver's own memory calls is in
test_interposer_memory.py.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import FAKE_MEMORY, FAKE_UUIDS, LIBDIR, Build, Client, GiB, MiB, quota_env


def body(code: str) -> str:
    return textwrap.dedent(code)


# A quota of 1 GiB on fake GPU 0 (which has FAKE_MEMORY of its own).
ONE_GIB = quota_env(GiB)


# ---- NVML (pynvml against the fake NVML) ----

FAKE_NVML_RESERVED = 64 * MiB  # tests/fake/fake_nvml.c's default

NVML = body("""
import pynvml as n
n.nvmlInit()
def nvml_memory(i):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m1 = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    return {
        "uuid": n.nvmlDeviceGetUUID(h),
        "v1": [m1.total, m1.free, m1.used],
        "v2": [m2.total, m2.reserved, m2.free, m2.used],
    }
""")


def test_nvml_reports_the_quota_and_the_ledgers_use(client: Client) -> None:
    r = client.run(
        NVML
        + body(f"""
        R["before"] = nvml_memory(0)
        device(0)
        a = ok(d.cuMemAlloc, {256 * MiB})
        R["after_alloc"] = nvml_memory(0)
        ok(d.cuMemFree, a)
        R["after_free"] = nvml_memory(0)
        R["other_gpu"] = nvml_memory(1)
        try:
            n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0), version=0x03000028)
            R["v3"] = "accepted"
        except n.NVMLError as e:
            R["v3"] = str(e)
        n.nvmlShutdown()
        """),
        env=ONE_GIB,
    )
    assert r["before"] == {
        "uuid": FAKE_UUIDS[0],
        "v1": [GiB, GiB, 0],
        "v2": [GiB, FAKE_NVML_RESERVED, GiB, 0],
    }
    assert r["after_alloc"]["v1"] == [GiB, 768 * MiB, 256 * MiB]
    # reserved stays the driver's.
    assert r["after_alloc"]["v2"] == [GiB, FAKE_NVML_RESERVED, 768 * MiB, 256 * MiB]
    assert r["after_free"] == r["before"]
    # GPU 1 is not the container's: the fake NVML's own figures.
    free = FAKE_MEMORY - FAKE_NVML_RESERVED
    assert r["other_gpu"]["v1"] == [FAKE_MEMORY, free, FAKE_NVML_RESERVED]
    assert r["other_gpu"]["v2"] == [FAKE_MEMORY, FAKE_NVML_RESERVED, free, 0]
    # A struct version the interposer does not know is refused, not passed
    # through with the whole GPU's figures.
    assert "version mismatch" in r["v3"].lower()


def test_nvml_alone_shows_the_quota_like_nvidia_smi(client: Client) -> None:
    """A process that never touches CUDA (nvidia-smi) sees the quota too."""
    r = client.run(
        NVML
        + body("""
        R["gpus"] = [nvml_memory(i) for i in range(n.nvmlDeviceGetCount())]
        """),
        env=quota_env(GiB, 2 * GiB),
    )
    assert [g["uuid"] for g in r["gpus"]] == FAKE_UUIDS[:2]
    assert [g["v1"] for g in r["gpus"]] == [[GiB, GiB, 0], [2 * GiB, 2 * GiB, 0]]


# ---- the tests can see a bypass ----

KEY_CHECKS = body(f"""
import pynvml as n
dev = device(0)
R["info"] = mem_info()
R["total_mem"] = ok(d.cuDeviceTotalMem, dev)
R["two_gib"] = call(d.cuMemAlloc, {2 * GiB})[0]
s = ok(d.cuStreamCreate, 0)
R["two_gib_async"] = call(d.cuMemAllocAsync, {2 * GiB}, s)[0]
n.nvmlInit()
R["nvml_total"] = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).total
""")


def test_key_checks_hold_with_the_interposer(client: Client) -> None:
    r = client.run(KEY_CHECKS, env=ONE_GIB)
    assert r["info"] == {"free": GiB, "total": GiB}
    assert r["total_mem"] == GiB
    assert r["two_gib"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["two_gib_async"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["nvml_total"] == GiB


@pytest.mark.parametrize(
    "preload", ["nolookup", None], ids=["without-lookup-wrappers", "without-preload"]
)
def test_key_checks_fail_when_the_interposer_is_bypassed(
    client: Client, preload: str | None
) -> None:
    """cuda-bindings and pynvml resolve everything with dlsym (and
    cuGetProcAddress): an interposer that only exports the driver's names
    is never called, so the 2 GiB allocation over the 1 GiB quota succeeds
    and the whole GPU shows.  The checks above would catch that."""
    r = client.run(KEY_CHECKS, preload=preload, env=ONE_GIB)
    assert r["info"] == {"free": FAKE_MEMORY, "total": FAKE_MEMORY}
    assert r["total_mem"] == FAKE_MEMORY
    assert r["two_gib"] == "CUDA_SUCCESS"
    assert r["two_gib_async"] == "CUDA_SUCCESS"
    assert r["nvml_total"] == FAKE_MEMORY


def test_fake_driver_hands_out_its_own_pointers_under_an_interposer(
    client: Client, build: Build
) -> None:
    """The fake is linked -Bsymbolic: its cuGetProcAddress returns its own
    cuMemAlloc_v2 even when a preloaded library exports that name too (as
    the real driver does).  Without it a broken interposer would look
    like it works.  Checked under the no-lookup build, whose dlsym is
    glibc's, so both addresses below are the libraries' own."""
    r = client.run(
        body(f"""
        import ctypes
        fake = ctypes.CDLL({str(build.fake_dir / "libcuda.so.1")!r})
        pre = ctypes.CDLL({str(build.nolookup)!r})
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
        gpa = fake.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        fn = ctypes.c_void_p()
        status = ctypes.c_int()
        R["ret"] = gpa(b"cuMemAlloc", ctypes.byref(fn), 12000, 0, ctypes.byref(status))
        R["handed_out"] = fn.value
        R["fakes_own"] = addr(fake.cuMemAlloc_v2)
        R["interposers"] = addr(pre.cuMemAlloc_v2)
        """),
        preload="nolookup",
        env=ONE_GIB,
    )
    assert r["ret"] == 0
    assert r["interposers"] != r["fakes_own"]
    assert r["handed_out"] == r["fakes_own"]


# ---- module mode: a GPU that is not the container's ----


def _gsdev(build: Build) -> Path:
    """/dev/gpushare's stand-in (tests/fake/fake_gsdev.c), built on demand."""
    so = build.fake_dir / "fake_gsdev.so"
    subprocess.run(
        ["make", "-C", str(LIBDIR), f"BUILD={build.dir}", str(so)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return so


def test_nvml_in_module_mode_shows_nothing_on_a_gpu_outside_the_list(
    client: Client, tmp_path: Path
) -> None:
    # The registration has quotas for two GPUs; the tenant rewrote
    # GPUSHARE_GPU_UUIDS so that GPU 1 is not in it.  GPU 1 must not be
    # shown (nor be) unlimited: 0 bytes, and allocations on it refused.
    env = {
        "LD_PRELOAD": f"{_gsdev(client.build)} {client.build.lib}",
        "FAKEGS_QUOTAS": f"0:{GiB},1:{2 * GiB}",
        "FAKEGS_STATE": str(tmp_path / "ledger"),
        "GPUSHARE_GPU_UUIDS": f"{FAKE_UUIDS[0]},GPU-0ther000-0000-0000-0000-000000000000",
    }
    r = client.run(
        NVML
        + body(f"""
        R["gpus"] = [nvml_memory(i) for i in range(2)]
        device(1)
        R["alloc1"] = call(d.cuMemAlloc, {MiB})[0]
        """),
        env=env,
    )
    assert r["gpus"][0]["v1"] == [GiB, GiB, 0]
    assert r["gpus"][1]["v1"] == [0, 0, 0]
    assert r["gpus"][1]["v2"] == [0, FAKE_NVML_RESERVED, 0, 0]
    assert r["alloc1"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["stderr"].count("GPU memory allocation refused on CUDA device 1") == 1
