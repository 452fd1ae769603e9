"""libgpushare.so under a real third-party CUDA client, on fake drivers.

Every test runs a small cuda-bindings program (see conftest.CLIENT_PRELUDE
for its helpers) in its own process with LD_PRELOAD=libgpushare.so, in the
interposer's standalone mode (no /dev/gpushare here): the quota comes from
GPUSHARE_MEMORY_LIMIT in GPUSHARE_GPU_UUIDS order.  Sizes are multiples of
2 MiB, the fake's (and real GPUs') allocation granularity, so figures are
exact.

The last tests prove that these checks can fail: the same program against
the build without the dlsym / cuGetProcAddress wrappers, and against no
preload, sees the whole GPU and allocates past the quota.
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


def test_quota_from_env_is_what_cuMemGetInfo_and_cuDeviceTotalMem_report(client: Client) -> None:
    r = client.run(
        body("""
        dev = device(0)
        R["info"] = mem_info()
        R["total_mem"] = ok(d.cuDeviceTotalMem, dev)
        """),
        env=quota_env(3 * GiB),
    )
    assert r["info"] == {"free": 3 * GiB, "total": 3 * GiB}
    assert r["total_mem"] == 3 * GiB


def test_cuMemAlloc_over_quota_is_out_of_memory_and_reserves_nothing(client: Client) -> None:
    r = client.run(
        body(f"""
        device(0)
        R["over"] = call(d.cuMemAlloc, {2 * GiB})[0]
        R["after_over"] = mem_info()
        a = ok(d.cuMemAlloc, {768 * MiB})
        R["after_768"] = mem_info()
        R["past_rest"] = call(d.cuMemAlloc, {258 * MiB})[0]
        R["after_past_rest"] = mem_info()
        b = ok(d.cuMemAlloc, {256 * MiB})  # exactly what is left
        R["full"] = mem_info()
        R["one_more"] = call(d.cuMemAlloc, {2 * MiB})[0]
        """),
        env=ONE_GIB,
    )
    assert r["over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after_over"] == {"free": GiB, "total": GiB}
    assert r["after_768"] == {"free": 256 * MiB, "total": GiB}
    assert r["past_rest"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after_past_rest"] == r["after_768"]
    assert r["full"] == {"free": 0, "total": GiB}
    assert r["one_more"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_cuMemFree_gives_the_memory_back(client: Client) -> None:
    r = client.run(
        body(f"""
        device(0)
        a = ok(d.cuMemAlloc, {GiB})
        R["second_while_full"] = call(d.cuMemAlloc, {2 * MiB})[0]
        ok(d.cuMemFree, a)
        R["after_free"] = mem_info()
        b = ok(d.cuMemAlloc, {GiB})
        R["again"] = mem_info()
        ok(d.cuMemFree, b)
        """),
        env=ONE_GIB,
    )
    assert r["second_while_full"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after_free"] == {"free": GiB, "total": GiB}
    assert r["again"] == {"free": 0, "total": GiB}


def test_cuMemAllocAsync_is_counted_and_cuMemFreeAsync_gives_back(client: Client) -> None:
    r = client.run(
        body(f"""
        device(0)
        s = ok(d.cuStreamCreate, 0)
        a = ok(d.cuMemAllocAsync, {768 * MiB}, s)
        R["used"] = mem_info()
        R["over"] = call(d.cuMemAllocAsync, {512 * MiB}, s)[0]
        ok(d.cuMemFreeAsync, a, s)
        ok(d.cuStreamSynchronize, s)
        R["after_free"] = mem_info()
        b = ok(d.cuMemAllocAsync, {GiB}, s)
        R["full"] = mem_info()
        """),
        env=ONE_GIB,
    )
    assert r["used"] == {"free": 256 * MiB, "total": GiB}
    assert r["over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after_free"] == {"free": GiB, "total": GiB}
    assert r["full"] == {"free": 0, "total": GiB}


def test_pool_allocations_are_counted(client: Client) -> None:
    r = client.run(
        body(f"""
        dev = device(0)
        s = ok(d.cuStreamCreate, 0)
        props = d.CUmemPoolProps()
        props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        pool = ok(d.cuMemPoolCreate, props)
        a = ok(d.cuMemAllocFromPoolAsync, {512 * MiB}, pool, s)
        R["own_pool"] = mem_info()
        default = ok(d.cuDeviceGetDefaultMemPool, dev)
        b = ok(d.cuMemAllocFromPoolAsync, {256 * MiB}, default, s)
        R["default_pool"] = mem_info()
        R["over"] = call(d.cuMemAllocFromPoolAsync, {512 * MiB}, pool, s)[0]
        ok(d.cuMemFreeAsync, a, s)
        ok(d.cuMemFreeAsync, b, s)
        ok(d.cuStreamSynchronize, s)
        R["after_free"] = mem_info()
        """),
        env=ONE_GIB,
    )
    assert r["own_pool"] == {"free": 512 * MiB, "total": GiB}
    assert r["default_pool"] == {"free": 256 * MiB, "total": GiB}
    assert r["over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after_free"] == {"free": GiB, "total": GiB}


def test_cuMemCreate_is_counted_and_cuMemRelease_gives_back(client: Client) -> None:
    r = client.run(
        body(f"""
        device(0)
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        h = ok(d.cuMemCreate, {768 * MiB}, prop, 0)
        R["created"] = mem_info()
        R["over"] = call(d.cuMemCreate, {512 * MiB}, prop, 0)[0]
        R["alloc_over"] = call(d.cuMemAlloc, {512 * MiB})[0]
        ok(d.cuMemRelease, h)
        R["released"] = mem_info()
        """),
        env=ONE_GIB,
    )
    assert r["created"] == {"free": 256 * MiB, "total": GiB}
    assert r["over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["released"] == {"free": GiB, "total": GiB}


def test_cuMemCreate_mapped_then_released_stays_counted_until_unmapped(client: Client) -> None:
    """The CUDA samples' and PyTorch expandable segments' order: create,
    map, release at once, use, unmap.  The driver keeps the memory until
    its last mapping goes, so the quota must too."""
    r = client.run(
        body(f"""
        device(0)
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        va = ok(d.cuMemAddressReserve, {768 * MiB}, 0, 0, 0)
        h = ok(d.cuMemCreate, {768 * MiB}, prop, 0)
        ok(d.cuMemMap, va, {768 * MiB}, 0, h, 0)
        ok(d.cuMemRelease, h)
        R["released_mapped"] = mem_info()
        R["alloc_over"] = call(d.cuMemAlloc, {512 * MiB})[0]
        R["create_over"] = call(d.cuMemCreate, {512 * MiB}, prop, 0)[0]
        ok(d.cuMemUnmap, va, {768 * MiB})
        R["unmapped"] = mem_info()
        ok(d.cuMemAddressFree, va, {768 * MiB})
        """),
        env=ONE_GIB,
    )
    assert r["released_mapped"] == {"free": 256 * MiB, "total": GiB}
    assert r["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["create_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["unmapped"] == {"free": GiB, "total": GiB}


MANAGED = body(f"""
device(0)
err, p = call(d.cuMemAllocManaged, {256 * MiB}, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
R["managed"] = err
R["info"] = mem_info()
""")


def test_cuMemAllocManaged_is_refused_by_default(client: Client) -> None:
    r = client.run(MANAGED, env=ONE_GIB)
    # Managed memory can be oversubscribed past any quota: refused, and
    # nothing counted.
    assert r["managed"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert r["info"] == {"free": GiB, "total": GiB}
    assert "GPUSHARE_ALLOW_MANAGED" in r["stderr"]


def test_cuMemAllocManaged_is_allowed_with_GPUSHARE_ALLOW_MANAGED(client: Client) -> None:
    r = client.run(
        MANAGED
        + body(f"""
        R["over"] = call(d.cuMemAllocManaged, {GiB}, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)[0]
        """),
        env=quota_env(GiB, GPUSHARE_ALLOW_MANAGED="1"),
    )
    # Counted at its full size against the quota.
    assert r["managed"] == "CUDA_SUCCESS"
    assert r["info"] == {"free": 768 * MiB, "total": GiB}
    assert r["over"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_two_gpus_have_their_own_quotas_matched_by_uuid(client: Client) -> None:
    # GPU 1 is listed first: the quotas follow the UUIDs, not CUDA's order.
    env = quota_env(3 * GiB, GiB, uuids=[FAKE_UUIDS[1], FAKE_UUIDS[0]])
    r = client.run(
        body(f"""
        for i in (0, 1):
            dev = device(i)
            R[f"info{{i}}"] = mem_info()
            R[f"total_mem{{i}}"] = ok(d.cuDeviceTotalMem, dev)
            R[f"two_gib{{i}}"] = call(d.cuMemAlloc, {2 * GiB})[0]
            R[f"after{{i}}"] = mem_info()
        """),
        env=env,
    )
    assert r["info0"] == {"free": GiB, "total": GiB}
    assert r["total_mem0"] == GiB
    assert r["two_gib0"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert r["after0"] == {"free": GiB, "total": GiB}
    assert r["info1"] == {"free": 3 * GiB, "total": 3 * GiB}
    assert r["total_mem1"] == 3 * GiB
    assert r["two_gib1"] == "CUDA_SUCCESS"
    assert r["after1"] == {"free": GiB, "total": 3 * GiB}


def test_gpu_not_in_GPUSHARE_GPU_UUIDS_keeps_the_drivers_figures(client: Client) -> None:
    r = client.run(
        body("""
        device(1)
        R["info"] = mem_info()
        """),
        env=ONE_GIB,  # GPU 0 only
    )
    assert r["info"] == {"free": FAKE_MEMORY, "total": FAKE_MEMORY}


ALLOC_TWO_GIB = body(f"""
dev = device(0)
R["info"] = mem_info()
R["total_mem"] = ok(d.cuDeviceTotalMem, dev)
R["two_gib"] = call(d.cuMemAlloc, {2 * GiB})[0]
""")


def test_isolation_none_passes_everything_through(client: Client) -> None:
    r = client.run(ALLOC_TWO_GIB, env=quota_env(GiB, GPUSHARE_ISOLATION="none"))
    assert r["info"] == {"free": FAKE_MEMORY, "total": FAKE_MEMORY}
    assert r["total_mem"] == FAKE_MEMORY
    assert r["two_gib"] == "CUDA_SUCCESS"


def test_no_quota_in_the_environment_passes_everything_through(client: Client) -> None:
    r = client.run(ALLOC_TWO_GIB, env={})
    assert r["info"] == {"free": FAKE_MEMORY, "total": FAKE_MEMORY}
    assert r["two_gib"] == "CUDA_SUCCESS"


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
