"""libgpushare.so's memory quota through the CUDA driver's own calls,
under a real third-party CUDA client on the fake driver (how the tests run:
test_interposer.py): cuMemGetInfo and cuDeviceTotalMem report the quota,
every allocation call is counted against it and its free gives back, managed
memory is refused unless allowed, each GPU has its own quota matched by
UUID, and with no quota (or GPUSHARE_ISOLATION=none) everything passes
through.  Sizes are multiples of 2 MiB, the fake's (and real GPUs')
allocation granularity, so figures are exact.
"""

from __future__ import annotations

import textwrap

from conftest import FAKE_MEMORY, FAKE_UUIDS, Client, GiB, MiB, quota_env


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
