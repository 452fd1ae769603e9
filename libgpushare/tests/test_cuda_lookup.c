// SPDX-License-Identifier: Apache-2.0
/*
 * test_cuda's modes: the entry points found the ways programs find them
 * (linked, dlsym, cuGetProcAddress), each checked to be the interposer's
 * wrapper of the right version; and cuGetProcAddress asked oddly.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "test_cuda.h"

/* The driver's functions as this program links them (the direct mode). */
#define D(f, s) extern __typeof__(*api.f) s
D(init, cuInit); D(device_get, cuDeviceGet); D(total_mem, cuDeviceTotalMem_v2);
D(get_uuid, cuDeviceGetUuid_v2); D(primary_retain, cuDevicePrimaryCtxRetain);
D(ctx_set, cuCtxSetCurrent); D(mem_alloc, cuMemAlloc_v2);
D(mem_alloc_pitch, cuMemAllocPitch_v2); D(mem_free, cuMemFree_v2);
D(mem_info, cuMemGetInfo_v2); D(managed, cuMemAllocManaged); D(htod, cuMemcpyHtoD_v2);
D(dtoh, cuMemcpyDtoH_v2); D(stream_create, cuStreamCreate);
D(alloc_async, cuMemAllocAsync); D(free_async, cuMemFreeAsync);
D(default_pool, cuDeviceGetDefaultMemPool); D(pool_create, cuMemPoolCreate);
D(pool_destroy, cuMemPoolDestroy); D(alloc_from_pool, cuMemAllocFromPoolAsync);
D(granularity, cuMemGetAllocationGranularity); D(mem_create, cuMemCreate);
D(mem_release, cuMemRelease); D(addr_reserve, cuMemAddressReserve);
D(addr_free, cuMemAddressFree); D(mem_map, cuMemMap); D(mem_unmap, cuMemUnmap);
D(set_access, cuMemSetAccess); D(array_create, cuArrayCreate_v2);
D(array3d_create, cuArray3DCreate_v2); D(array_destroy, cuArrayDestroy);
D(mipmap_create, cuMipmappedArrayCreate); D(mipmap_destroy, cuMipmappedArrayDestroy);
D(launch, cuLaunchKernel); D(launch_ex, cuLaunchKernelEx);
D(launch_coop, cuLaunchCooperativeKernel);
D(launch_multi, cuLaunchCooperativeKernelMultiDevice); D(graph_launch, cuGraphLaunch);
D(host_func, cuLaunchHostFunc); D(ctx_sync, cuCtxSynchronize);
#undef D


/* Each field: its base name and its versioned (exported) name. */
static const struct {
	const char *base, *symbol;
	size_t offset;
	int since;		/* first version that has it, where above 11030 */
	int pt;			/* it has a per-thread default stream form */
} names[] = {
#define N(f, b, s) { b, s, offsetof(struct api, f), 0, 0 }
#define L(f, b, since, pt) { b, b, offsetof(struct api, f), since, pt }
	N(init, "cuInit", "cuInit"),
	N(device_get, "cuDeviceGet", "cuDeviceGet"),
	N(total_mem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2"),
	N(get_uuid, "cuDeviceGetUuid", "cuDeviceGetUuid_v2"),
	N(primary_retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
	N(ctx_set, "cuCtxSetCurrent", "cuCtxSetCurrent"),
	N(mem_alloc, "cuMemAlloc", "cuMemAlloc_v2"),
	N(mem_alloc_pitch, "cuMemAllocPitch", "cuMemAllocPitch_v2"),
	N(mem_free, "cuMemFree", "cuMemFree_v2"),
	N(mem_info, "cuMemGetInfo", "cuMemGetInfo_v2"),
	N(managed, "cuMemAllocManaged", "cuMemAllocManaged"),
	N(htod, "cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
	N(dtoh, "cuMemcpyDtoH", "cuMemcpyDtoH_v2"),
	N(stream_create, "cuStreamCreate", "cuStreamCreate"),
	N(alloc_async, "cuMemAllocAsync", "cuMemAllocAsync"),
	N(free_async, "cuMemFreeAsync", "cuMemFreeAsync"),
	N(default_pool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool"),
	N(pool_create, "cuMemPoolCreate", "cuMemPoolCreate"),
	N(pool_destroy, "cuMemPoolDestroy", "cuMemPoolDestroy"),
	N(alloc_from_pool, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
	N(granularity, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity"),
	N(mem_create, "cuMemCreate", "cuMemCreate"),
	N(mem_release, "cuMemRelease", "cuMemRelease"),
	N(addr_reserve, "cuMemAddressReserve", "cuMemAddressReserve"),
	N(addr_free, "cuMemAddressFree", "cuMemAddressFree"),
	N(mem_map, "cuMemMap", "cuMemMap"),
	N(mem_unmap, "cuMemUnmap", "cuMemUnmap"),
	N(set_access, "cuMemSetAccess", "cuMemSetAccess"),
	N(array_create, "cuArrayCreate", "cuArrayCreate_v2"),
	N(array3d_create, "cuArray3DCreate", "cuArray3DCreate_v2"),
	N(array_destroy, "cuArrayDestroy", "cuArrayDestroy"),
	N(mipmap_create, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate"),
	N(mipmap_destroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy"),
	L(launch, "cuLaunchKernel", 0, 1),
	L(launch_ex, "cuLaunchKernelEx", 11060, 1),
	L(launch_coop, "cuLaunchCooperativeKernel", 0, 1),
	L(launch_multi, "cuLaunchCooperativeKernelMultiDevice", 0, 0),
	L(graph_launch, "cuGraphLaunch", 0, 1),
	L(host_func, "cuLaunchHostFunc", 0, 1),
	L(ctx_sync, "cuCtxSynchronize", 0, 0),
#undef N
#undef L
};
#define NNAMES (sizeof(names) / sizeof(names[0]))


static void **field(size_t i)
{
	return (void **)((char *)&api + names[i].offset);
}

/* The direct mode: this program's own references, bound at load. */
static void resolve_direct(void)
{
	void *direct[] = {
		cuInit, cuDeviceGet, cuDeviceTotalMem_v2, cuDeviceGetUuid_v2,
		cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2, cuMemAllocPitch_v2,
		cuMemFree_v2, cuMemGetInfo_v2, cuMemAllocManaged, cuMemcpyHtoD_v2,
		cuMemcpyDtoH_v2, cuStreamCreate, cuMemAllocAsync, cuMemFreeAsync,
		cuDeviceGetDefaultMemPool, cuMemPoolCreate, cuMemPoolDestroy,
		cuMemAllocFromPoolAsync, cuMemGetAllocationGranularity, cuMemCreate,
		cuMemRelease, cuMemAddressReserve, cuMemAddressFree, cuMemMap, cuMemUnmap,
		cuMemSetAccess, cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy,
		cuMipmappedArrayCreate, cuMipmappedArrayDestroy, cuLaunchKernel,
		cuLaunchKernelEx, cuLaunchCooperativeKernel,
		cuLaunchCooperativeKernelMultiDevice, cuGraphLaunch, cuLaunchHostFunc,
		cuCtxSynchronize,
	};
	_Static_assert(sizeof(direct) / sizeof(direct[0]) == NNAMES, "one per name");
	for (size_t i = 0; i < NNAMES; i++)
		*field(i) = direct[i];
}

/* Where @p is defined: its symbol must be @want, in libgpushare or libcuda. */
static void expect_symbol(const void *p, const char *want, int ours)
{
	Dl_info info;
	const char *lib = ours ? "libgpushare" : "libcuda";

	if (!dladdr(p, &info) || !info.dli_sname || !info.dli_fname) {
		CHECK(0, "%s: no symbol", want);
		return;
	}
	CHECK(!strcmp(info.dli_sname, want) && strstr(info.dli_fname, lib),
	      "want %s in %s, got %s in %s", want, lib, info.dli_sname, info.dli_fname);
}

/* Wrapped entry points resolve to our wrapper of the right version. */
void check_wrapped(const char *mode)
{
	static const char *const wrapped[] = {
		"cuDeviceTotalMem_v2", "cuDeviceGetUuid_v2", "cuMemAlloc_v2",
		"cuMemAllocPitch_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemAllocManaged",
		"cuMemAllocAsync", "cuMemFreeAsync", "cuMemPoolCreate", "cuMemPoolDestroy",
		"cuMemAllocFromPoolAsync", "cuMemCreate", "cuMemRelease", "cuMemMap",
		"cuMemUnmap", "cuArrayCreate_v2",
		"cuArray3DCreate_v2", "cuArrayDestroy", "cuMipmappedArrayCreate",
		"cuMipmappedArrayDestroy", "cuLaunchKernel", "cuLaunchKernelEx",
		"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
		"cuGraphLaunch", "cuLaunchHostFunc",
	};
	int ptds = !strcmp(mode, "proc_ptds");

	for (size_t i = 0; i < NNAMES; i++) {
		int ours = 0;
		char want[64];
		for (size_t j = 0; j < sizeof(wrapped) / sizeof(wrapped[0]); j++)
			ours |= !strcmp(wrapped[j], names[i].symbol);
		if (!*field(i))		/* not at this version (proc_v1) */
			continue;
		snprintf(want, sizeof(want), "%s%s", names[i].symbol,
			 ptds && (strstr(names[i].symbol, "Async") || names[i].pt) ? "_ptsz" : "");
		/* At 11030, before cuDeviceGetUuid_v2 (11040), the first one. */
		if (!strcmp(mode, "proc_v1") && !strcmp(want, "cuDeviceGetUuid_v2"))
			strcpy(want, "cuDeviceGetUuid");
		expect_symbol(*field(i), want, ours);
	}
}

typedef CUresult (*getproc_v2_fn)(const char *, void **, int, cuuint64_t,
				  CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t);

int resolve(const char *mode)
{
	void *h;

	if (!strcmp(mode, "direct")) {
		resolve_direct();
		return 0;
	}
	h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return -1;
	}
	if (!strcmp(mode, "dlsym")) {
		for (size_t i = 0; i < NNAMES; i++)
			if (!(*field(i) = dlsym(h, names[i].symbol)))
				return fprintf(stderr, "no %s\n", names[i].symbol), -1;
		return 0;
	}
	getproc_v2_fn gp2 = (getproc_v2_fn)dlsym(h, "cuGetProcAddress_v2");
	if (!gp2)
		return fprintf(stderr, "no cuGetProcAddress_v2\n"), -1;
	/* What the runtime does: the lookup function, through itself. */
	void *p = NULL;
	CUdriverProcAddressQueryResult st;
	if (gp2("cuGetProcAddress", &p, 12000, 0, &st) || !p)
		return fprintf(stderr, "cuGetProcAddress at 12000\n"), -1;
	expect_symbol(p, "cuGetProcAddress_v2", 1);
	gp2 = (getproc_v2_fn)p;
	CUresult r = gp2("cuNoSuchFunction", &p, 12090, 0, &st);
	CHECK(r == CUDA_ERROR_NOT_FOUND && !p && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
	      "unknown name: %d", r);
	if (!strcmp(mode, "proc_v1")) {
		if (gp2("cuGetProcAddress", &p, 11030, 0, &st) || !p)
			return fprintf(stderr, "cuGetProcAddress at 11030\n"), -1;
		expect_symbol(p, "cuGetProcAddress", 1);
		getproc_fn gp1 = (getproc_fn)p;
		/* ... and the 4-argument one answers for itself, too. */
		if (gp1("cuGetProcAddress", &p, 11030, 0) || p != (void *)gp1)
			return fprintf(stderr, "cuGetProcAddress through itself\n"), -1;
		for (size_t i = 0; i < NNAMES; i++) {
			if (names[i].since > 11030) {	/* not ours to hand out yet */
				r = gp1(names[i].base, field(i), 11030, 0);
				CHECK(r == CUDA_ERROR_NOT_FOUND && !*field(i), "%s at 11030: %d",
				      names[i].base, r);
				*field(i) = NULL;
				continue;
			}
			if (gp1(names[i].base, field(i), 11030, 0) || !*field(i))
				return fprintf(stderr, "no %s at 11030\n", names[i].base), -1;
		}
		return 0;
	}
	cuuint64_t flags = !strcmp(mode, "proc_ptds") ?
			   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
	for (size_t i = 0; i < NNAMES; i++)
		if (gp2(names[i].base, field(i), 12090, flags, &st) || !*field(i))
			return fprintf(stderr, "no %s\n", names[i].base), -1;
	/* An old version of cuMemAlloc (32-bit size) is not ours to wrap. */
	void *old = NULL;
	r = gp2("cuMemAlloc", &old, 3000, 0, &st);
	CHECK(r == CUDA_ERROR_NOT_FOUND && !old, "cuMemAlloc at 3000: %d", r);
	return 0;
}

/* cuGetProcAddress asked oddly: no crash, and never a wrapper of the wrong form. */
void lookup_edges(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	getproc_v2_fn gp2 = h ? (getproc_v2_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
	getproc_fn gp1 = h ? (getproc_fn)dlsym(h, "cuGetProcAddress") : NULL;
	CUdriverProcAddressQueryResult st;
	void *p = NULL;
	static const int versions[] = { 0, 1, 3000, 11029, 11030, 11999, 12000, 12090, INT_MAX };

	CHECK(gp1 && gp2, "%s", "no cuGetProcAddress");
	if (!gp1 || !gp2)
		return;
	CHECK(gp2(NULL, &p, 12090, 0, &st) != CUDA_SUCCESS, "%s", "NULL name");
	CHECK(gp1(NULL, &p, 12090, 0) != CUDA_SUCCESS, "%s", "NULL name (v1)");
	CHECK(gp2("cuMemAlloc", NULL, 12090, 0, &st) != CUDA_SUCCESS, "%s", "NULL pfn");
	CHECK(gp1("cuMemAlloc", NULL, 12090, 0) != CUDA_SUCCESS, "%s", "NULL pfn (v1)");
	OK(gp2("cuMemAlloc", &p, 12090, 0, NULL));	/* NULL status */
	expect_symbol(p, "cuMemAlloc_v2", 1);
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		int v = versions[i];
		for (int which = 0; which < 2; which++) {
			p = NULL;
			CUresult r = which ? gp1("cuGetProcAddress", &p, v, 0) :
					     gp2("cuGetProcAddress", &p, v, 0, &st);
			if (v < 11030) {	/* no such entry point yet */
				CHECK(r != CUDA_SUCCESS || !p, "cuGetProcAddress at %d", v);
				continue;
			}
			CHECK(r == CUDA_SUCCESS, "cuGetProcAddress at %d: %d", v, r);
			expect_symbol(p, v < 12000 ? "cuGetProcAddress" : "cuGetProcAddress_v2", 1);
		}
		/* The 32-bit cuMemAlloc (before 3020) is never handed our wrapper. */
		p = NULL;
		CUresult r = gp2("cuMemAlloc", &p, v, 0, &st);
		if (v < 3020)
			CHECK(r != CUDA_SUCCESS || !p, "cuMemAlloc at %d", v);
		else
			expect_symbol(p, "cuMemAlloc_v2", 1);
	}
	/* Flags beyond the per-thread bit: the per-thread bit alone decides. */
	static const cuuint64_t odd[] = { 1, 3, 4, 1ull << 40, ~0ull };
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		p = NULL;
		if (gp2("cuMemAllocAsync", &p, 12090, odd[i], &st) == CUDA_SUCCESS)
			expect_symbol(p, odd[i] & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ?
				      "cuMemAllocAsync_ptsz" : "cuMemAllocAsync", 1);
	}
}
