// SPDX-License-Identifier: Apache-2.0
/* test_cuda's memory scenarios: quotas, views, every kind of allocation, fork. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "test_cuda.h"

void views(void)
{
	size_t t0 = 0, t1 = 0, f, t;
	OK(api.total_mem(&t0, 0));
	OK(api.total_mem(&t1, 1));
	CHECK(t0 == Q0 && t1 == Q1, "totals %zu %zu", t0, t1);
	use(0);
	info(&f, &t);
	CHECK(f == Q0 && t == Q0, "device 0: free %zu total %zu", f, t);
	use(1);
	info(&f, &t);
	CHECK(f == Q1 && t == Q1, "device 1: free %zu total %zu", f, t);
}

void linear(void)
{
	CUdeviceptr a = 0, b = 0, c = 0;
	size_t pitch = 0;
	char out[6] = "";

	use(0);
	OK(api.mem_alloc(&a, 400 * MiB));
	EXPECT_FREE(Q0 - 400 * MiB);
	OOM(api.mem_alloc(&b, 200 * MiB));
	EXPECT_FREE(Q0 - 400 * MiB);		/* nothing reserved by the refusal */
	OK(api.mem_alloc(&b, 112 * MiB));	/* exactly the rest */
	EXPECT_FREE(0);
	OOM(api.mem_alloc(&c, 1));
	OK(api.htod(b, "hello", 6));
	OK(api.dtoh(out, b, 6));
	CHECK(!strcmp(out, "hello"), "copy: %s", out);
	OK(api.mem_free(a));
	OK(api.mem_free(b));
	EXPECT_FREE(Q0);
	OK(api.mem_alloc(&a, Q0));		/* the whole quota, after frees */
	OK(api.mem_free(a));
	EXPECT_FREE(Q0);
	/* The other device's quota is its own. */
	use(1);
	OK(api.mem_alloc(&a, 900 * MiB));
	EXPECT_FREE(Q1 - 900 * MiB);
	use(0);
	EXPECT_FREE(Q0);
	OK(api.mem_free(a));			/* freed with device 0 current */
	use(1);
	EXPECT_FREE(Q1);
	/* Pitch: the driver's pitch x height is what counts. */
	use(0);
	OK(api.mem_alloc_pitch(&a, &pitch, 1000, 1000, 4));
	CHECK(pitch == 1024, "pitch %zu", pitch);
	EXPECT_FREE(Q0 - 1024 * 1000);
	OOM(api.mem_alloc_pitch(&b, &pitch, 1 << 20, 512, 4));
	OK(api.mem_free(a));
	EXPECT_FREE(Q0);
	/* A free the driver refuses gives nothing back. */
	CHECK(api.mem_free(12345) != CUDA_SUCCESS, "bogus free");
	EXPECT_FREE(Q0);
}

void async_and_pools(void)
{
	CUstream s;
	CUdeviceptr a = 0, b = 0;
	CUmemoryPool def1, pool;
	CUmemPoolProps props;

	use(0);
	OK(api.stream_create(&s, 0));
	OK(api.alloc_async(&a, 300 * MiB, s));
	EXPECT_FREE(Q0 - 300 * MiB);
	OOM(api.alloc_async(&b, 300 * MiB, s));
	OOM(api.alloc_async(&b, 300 * MiB, NULL));
	EXPECT_FREE(Q0 - 300 * MiB);
	OK(api.free_async(a, s));		/* released when called */
	EXPECT_FREE(Q0);
	/* Device 1's default pool, asked with device 0 current: device 1's. */
	OK(api.default_pool(&def1, 1));
	OK(api.alloc_from_pool(&a, 900 * MiB, def1, s));
	EXPECT_FREE(Q0);
	use(1);
	EXPECT_FREE(Q1 - 900 * MiB);
	/* A pool created on device 1 shares device 1's quota. */
	memset(&props, 0, sizeof(props));
	props.allocType = 1;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 1;
	OK(api.pool_create(&pool, &props));
	use(0);
	OOM(api.alloc_from_pool(&b, 200 * MiB, pool, s));
	OK(api.alloc_from_pool(&b, 100 * MiB, pool, s));
	use(1);
	EXPECT_FREE(Q1 - 1000 * MiB);
	OK(api.free_async(a, s));
	OK(api.free_async(b, NULL));
	EXPECT_FREE(Q1);
	OK(api.pool_destroy(pool));
}

/*
 * The CUDA samples' and PyTorch's order: create, map, release at once, use,
 * unmap.  The memory lives until its last mapping goes, and so does its
 * reservation.
 */
static void vmm_release_while_mapped(const CUmemAllocationProp *prop)
{
	CUmemGenericAllocationHandle h1, h2, h3;
	CUdeviceptr va, other, never;
	CUdeviceptr a = 0;
	char out[4] = "";

	use(0);
	OK(api.addr_reserve(&va, 512 * MiB, 0, 0, 0));
	OK(api.mem_create(&h1, 256 * MiB, prop, 0));
	OK(api.mem_map(va, 256 * MiB, 0, h1, 0));
	OK(api.mem_release(h1));
	EXPECT_FREE(Q0 - 256 * MiB);		/* released, still mapped: held */
	OK(api.htod(va, "map", 4));
	OK(api.dtoh(out, va, 4));
	CHECK(!strcmp(out, "map"), "copy after release");
	OOM(api.mem_alloc(&a, 300 * MiB));	/* the quota still counts it */
	OK(api.mem_unmap(va, 256 * MiB));	/* the last mapping: given back */
	EXPECT_FREE(Q0);

	/* Two mappings of one handle: held until both are gone. */
	OK(api.addr_reserve(&other, 64 * MiB, 0, 0, 0));
	OK(api.mem_create(&h1, 64 * MiB, prop, 0));
	OK(api.mem_map(va, 64 * MiB, 0, h1, 0));
	OK(api.mem_map(other, 64 * MiB, 0, h1, 0));
	OK(api.mem_release(h1));
	OK(api.mem_unmap(va, 64 * MiB));
	EXPECT_FREE(Q0 - 64 * MiB);
	OK(api.mem_unmap(other, 64 * MiB));
	EXPECT_FREE(Q0);
	OK(api.addr_free(other, 64 * MiB));

	/* One unmap across two handles mapped side by side, one of them
	 * still unreleased: only the released one is given back. */
	OK(api.mem_create(&h1, 128 * MiB, prop, 0));
	OK(api.mem_create(&h2, 64 * MiB, prop, 0));
	OK(api.mem_map(va, 128 * MiB, 0, h1, 0));
	OK(api.mem_map(va + 128 * MiB, 64 * MiB, 0, h2, 0));
	OK(api.mem_release(h1));
	EXPECT_FREE(Q0 - 192 * MiB);
	OK(api.mem_unmap(va, 192 * MiB));
	EXPECT_FREE(Q0 - 64 * MiB);
	OK(api.mem_release(h2));		/* unmapped: given back at once */
	EXPECT_FREE(Q0);

	/* Part of a mapping: the driver refuses it, and nothing changes. */
	OK(api.mem_create(&h1, 128 * MiB, prop, 0));
	OK(api.mem_map(va, 128 * MiB, 0, h1, 0));
	OK(api.mem_release(h1));
	CHECK(api.mem_unmap(va, 64 * MiB) != CUDA_SUCCESS, "partial unmap refused");
	EXPECT_FREE(Q0 - 128 * MiB);
	OK(api.mem_unmap(va, 128 * MiB));
	EXPECT_FREE(Q0);

	/* A map the driver refuses holds nothing. */
	OK(api.mem_create(&h3, 64 * MiB, prop, 0));
	CHECK(api.mem_map(va, 128 * MiB, 0, h3, 0) != CUDA_SUCCESS, "map past the handle");
	OK(api.mem_release(h3));
	EXPECT_FREE(Q0);

	/* A range never mapped through us passes through, releasing nothing. */
	OK(api.mem_create(&h1, 64 * MiB, prop, 0));
	OK(api.mem_map(va, 64 * MiB, 0, h1, 0));
	OK(api.mem_release(h1));
	OK(api.addr_reserve(&never, 64 * MiB, 0, 0, 0));
	OK(api.mem_unmap(never, 64 * MiB));
	EXPECT_FREE(Q0 - 64 * MiB);
	OK(api.mem_unmap(va, 64 * MiB));
	EXPECT_FREE(Q0);
	OK(api.addr_free(never, 64 * MiB));
	OK(api.addr_free(va, 512 * MiB));
}

void vmm(void)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h1, h2;
	CUdeviceptr va;
	CUmemAccessDesc access;
	size_t g = 0;
	char out[4] = "";

	memset(&prop, 0, sizeof(prop));
	prop.type = 1;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	OK(api.granularity(&g, &prop, 0));
	CHECK(g == 2 * MiB, "granularity %zu", g);
	use(1);					/* the property names the device */
	OK(api.mem_create(&h1, 400 * MiB, &prop, 0));
	use(0);
	EXPECT_FREE(Q0 - 400 * MiB);
	OOM(api.mem_create(&h2, 200 * MiB, &prop, 0));
	EXPECT_FREE(Q0 - 400 * MiB);
	OK(api.addr_reserve(&va, 400 * MiB, 0, 0, 0));
	OK(api.mem_map(va, 400 * MiB, 0, h1, 0));
	access.location = prop.location;
	access.flags = 3;
	OK(api.set_access(va, 400 * MiB, &access, 1));
	OK(api.htod(va, "vmm", 4));
	OK(api.dtoh(out, va, 4));
	CHECK(!strcmp(out, "vmm"), "vmm copy");
	OK(api.mem_unmap(va, 400 * MiB));
	OK(api.addr_free(va, 400 * MiB));
	OK(api.mem_release(h1));
	EXPECT_FREE(Q0);
	vmm_release_while_mapped(&prop);
}

void arrays(void)
{
	CUarray a, b;
	CUmipmappedArray m;
	CUDA_ARRAY_DESCRIPTOR d2 = { 4096, 4096, CU_AD_FORMAT_FLOAT, 1 };
	CUDA_ARRAY_DESCRIPTOR big = { 8192, 8192, CU_AD_FORMAT_FLOAT, 4 };
	CUDA_ARRAY3D_DESCRIPTOR d3 = { 256, 256, 256, CU_AD_FORMAT_UNSIGNED_INT16, 2, 0 };
	CUDA_ARRAY3D_DESCRIPTOR mip = { 4096, 4096, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0 };

	use(0);
	OK(api.array_create(&a, &d2));		/* 64 MiB */
	EXPECT_FREE(Q0 - 64 * MiB);
	OOM(api.array_create(&b, &big));	/* 1 GiB */
	OK(api.array3d_create(&b, &d3));	/* 64 MiB */
	EXPECT_FREE(Q0 - 128 * MiB);
	OK(api.array_destroy(a));
	OK(api.array_destroy(b));
	EXPECT_FREE(Q0);
	/* 64 MiB, then 16, 4, 1: every level counts. */
	OK(api.mipmap_create(&m, &mip, 4));
	EXPECT_FREE(Q0 - 85 * MiB);
	OK(api.mipmap_destroy(m));
	EXPECT_FREE(Q0);
}

void managed(int allowed)
{
	CUdeviceptr a = 0, b = 0;

	use(0);
	if (!allowed) {
		CHECK(api.managed(&a, MiB, 1) == CUDA_ERROR_NOT_SUPPORTED, "managed refused");
		EXPECT_FREE(Q0);
		return;
	}
	OK(api.managed(&a, 400 * MiB, 1));
	EXPECT_FREE(Q0 - 400 * MiB);
	OOM(api.managed(&b, 200 * MiB, 1));
	OK(api.mem_free(a));
	EXPECT_FREE(Q0);
}

void off(void)
{
	CUdeviceptr a = 0, b = 0;
	size_t t = 0;

	OK(api.total_mem(&t, 0));
	CHECK(t == DEVMEM, "total %zu", t);
	use(0);
	OK(api.mem_alloc(&a, 2048 * MiB));
	OK(api.managed(&b, MiB, 1));
	EXPECT_FREE(DEVMEM - 2049 * MiB);	/* the driver's own figure */
	OK(api.mem_free(a));
	OK(api.mem_free(b));
}

/* A child starts owning nothing: the parent's memory is not its to free. */
void forked(void)
{
	CUdeviceptr a = 0, b = 0;

	use(0);
	OK(api.mem_alloc(&a, 400 * MiB));
	pid_t pid = fork();
	if (pid == 0) {
		use(0);
		EXPECT_FREE(Q0);		/* standalone: the child's own count */
		OK(api.mem_free(a));		/* the parent's: nothing to release */
		EXPECT_FREE(Q0);
		OK(api.mem_alloc(&b, Q0));
		OOM(api.mem_alloc(&a, 1));
		OK(api.mem_free(b));
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
	EXPECT_FREE(Q0 - 400 * MiB);		/* the parent's count is untouched */
	OK(api.mem_free(a));
	EXPECT_FREE(Q0);
}

/* Module mode: the child has its own file, the container's count is shared. */
void module_forked(void)
{
	CUdeviceptr a = 0, b = 0, c = 0;

	use(0);
	OK(api.mem_alloc(&a, 400 * MiB));
	pid_t pid = fork();
	if (pid == 0) {
		use(0);
		EXPECT_FREE(Q0 - 400 * MiB);	/* the parent's bytes count */
		OK(api.mem_alloc(&b, 112 * MiB));
		OOM(api.mem_alloc(&c, 1));
		OK(api.mem_free(a));		/* the parent's: nothing released */
		EXPECT_FREE(0);
		OK(api.mem_free(b));		/* its own, from its own file */
		EXPECT_FREE(Q0 - 400 * MiB);
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
	EXPECT_FREE(Q0 - 400 * MiB);
	OK(api.mem_free(a));
	EXPECT_FREE(Q0);
}

/* Module mode, a device with no quota of its own: nothing fits, it shows 0. */
void refused(void)
{
	const char *which = getenv("TEST_REFUSED");

	for (int dev = 0; dev < 2; dev++) {
		CUdeviceptr a = 0;
		CUstream s = NULL;
		CUarray arr = NULL;
		CUmemGenericAllocationHandle h = 0;
		size_t f = 1, t = 1, pitch = 0;
		CUDA_ARRAY_DESCRIPTOR ad = { .Width = 64, .Height = 64,
					     .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1 };
		CUmemAllocationProp prop = { .type = 1,	/* pinned */
					     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev } };

		use(dev);
		if (!which || !strchr(which, '0' + dev)) {
			OK(api.mem_alloc(&a, MiB));
			OK(api.mem_free(a));
			continue;
		}
		OK(api.total_mem(&t, dev));
		CHECK(t == 0, "device %d: total %zu", dev, t);
		info(&f, &t);
		CHECK(f == 0 && t == 0, "device %d: free %zu total %zu", dev, f, t);
		OOM(api.mem_alloc(&a, MiB));
		OOM(api.mem_alloc_pitch(&a, &pitch, 1024, 16, 4));
		OK(api.stream_create(&s, 0));
		OOM(api.alloc_async(&a, MiB, s));
		OOM(api.mem_create(&h, 2 * MiB, &prop, 0));
		OOM(api.array_create(&arr, &ad));
		OOM(api.managed(&a, MiB, 1));
	}
}
