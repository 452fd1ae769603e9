// SPDX-License-Identifier: Apache-2.0
/*
 * The interposer against the fake driver, reached the ways programs reach
 * the real one.  Run as
 *
 *   test_cuda MODE SCENARIO
 *
 * MODE, how the entry points are found:
 *   direct     linked against libcuda (this program's own references)
 *   dlsym      dlopen("libcuda.so.1") + dlsym of the versioned names
 *   proc       cuGetProcAddress_v2 (from dlsym), base names at 12090; the
 *              lookup function itself is looked up through itself first
 *   proc_ptds  the same with the per-thread default stream flag
 *   proc_v1    the 4-argument cuGetProcAddress, asked for at 11030
 *
 * SCENARIO, what the environment set up (tests/run_cuda.sh):
 *   quota      device 0: 512 MiB, device 1: 1 GiB (UUIDs in reverse order)
 *   managed    the same with GPUSHARE_ALLOW_MANAGED=1
 *   ordinal    the limits without UUIDs: device 0: 512 MiB, device 1: 1 GiB
 *   off        GPUSHARE_ISOLATION=none
 *   fork       the quota environment; a forked child's accounting
 *   modfork    module mode (tests/fake/fake_gsdev.c), the same quotas; a
 *              forked child shares the container's ledger
 *   refused    module mode with GPUSHARE_GPU_UUIDS rewritten: the devices
 *              in $TEST_REFUSED (digits, e.g. "01") are not matched to a
 *              quota, so every allocation on them is out of memory and
 *              they show 0 bytes; any other device allocates
 *   lookup     cuGetProcAddress edge cases: NULL name or pfn, odd versions
 *              and flags, "cuGetProcAddress" at every version
 *   launch     GPUSHARE_CORE_LIMIT=50,50 (standalone): after 40 ms of work
 *              through each launch path (kernel, Ex, cooperative, multi-
 *              device, graph, host function), the next call of that path
 *              waits (the calling thread is held to the share); a launch
 *              into a stream being captured does not wait, and the capture
 *              is not disturbed; a forked child is gated on its own.  With
 *              TEST_GATED=0 (no limit) no call waits
 *   launch_refused  module mode, GPUs not the container's: every launch
 *              path answers CUDA_ERROR_NOT_PERMITTED
 *
 * Exit 0 when every check held.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define MiB (1ull << 20)
#define Q0 (512 * MiB)		/* device 0's quota */
#define Q1 (1024 * MiB)		/* device 1's quota */
#define DEVMEM (8192 * MiB)	/* the fake's memory per device (run_cuda.sh) */

/* The entry points the test uses, however they were found. */
static struct api {
	CUresult (*init)(unsigned int);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*total_mem)(size_t *, CUdevice);
	CUresult (*get_uuid)(CUuuid *, CUdevice);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*managed)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*stream_create)(CUstream *, unsigned int);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*default_pool)(CUmemoryPool *, CUdevice);
	CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*pool_destroy)(CUmemoryPool);
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*granularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t,
			       const CUmemAllocationProp *, unsigned long long);
	CUresult (*mem_release)(CUmemGenericAllocationHandle);
	CUresult (*addr_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*addr_free)(CUdeviceptr, size_t);
	CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			    unsigned long long);
	CUresult (*mem_unmap)(CUdeviceptr, size_t);
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
	CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
	CUresult (*array_destroy)(CUarray);
	CUresult (*mipmap_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
				  unsigned int);
	CUresult (*mipmap_destroy)(CUmipmappedArray);
	cuLaunchKernel_t launch;
	cuLaunchKernelEx_t launch_ex;
	cuLaunchCooperativeKernel_t launch_coop;
	cuLaunchCooperativeKernelMultiDevice_t launch_multi;
	cuGraphLaunch_t graph_launch;
	cuLaunchHostFunc_t host_func;
	CUresult (*ctx_sync)(void);
} api;

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

/* Not wrapped, and not what is tested: always linked directly. */
extern CUresult cuGraphCreate(CUgraph *, unsigned int);
extern CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
					const CUDA_KERNEL_NODE_PARAMS *);
extern CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
extern CUresult cuStreamBeginCapture_v2(CUstream, int);
extern CUresult cuStreamEndCapture(CUstream, CUgraph *);
extern CUresult cuStreamIsCapturing(CUstream, int *);

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

static int failures;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			failures++;                                             \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                           \
			fputc('\n', stderr);                                    \
		}                                                               \
	} while (0)
#define OK(call) CHECK((call) == CUDA_SUCCESS, "%s", "")
#define OOM(call) CHECK((call) == CUDA_ERROR_OUT_OF_MEMORY, "%s", "expected out of memory")

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
static void check_wrapped(const char *mode)
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

static int resolve(const char *mode)
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

static CUcontext ctx[2];

static void use(int dev)
{
	OK(api.ctx_set(ctx[dev]));
}

/* The free and total bytes the current device shows. */
static void info(size_t *free_, size_t *total)
{
	OK(api.mem_info(free_, total));
}

static void expect_free(size_t want, int line)
{
	size_t f = 0, t = 0;
	info(&f, &t);
	if (f != want) {
		failures++;
		fprintf(stderr, "FAIL line %d: free %zu MiB + %zu, want %zu MiB + %zu\n", line,
			f >> 20, f & (size_t)(MiB - 1), want >> 20, want & (size_t)(MiB - 1));
	}
}
#define EXPECT_FREE(n) expect_free(n, __LINE__)

static void views(void)
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

static void linear(void)
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

static void async_and_pools(void)
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

static void vmm(void)
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

static void arrays(void)
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

static void managed(int allowed)
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

static void off(void)
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
static void forked(void)
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
static void module_forked(void)
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
static void refused(void)
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

/* ---- launches: the compute gate ---- */

#define FN ((CUfunction)0x1)		/* the fake runs any function */
#define WORK 40000u			/* blocks: 40 ms at the fake's 1 us each */
#define MS 1000000ull

enum path { P_KERNEL, P_EX, P_COOP, P_MULTI, P_GRAPH, P_HOST, NPATHS };
static const char *const path_name[NPATHS] = {
	"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
	"cuLaunchCooperativeKernelMultiDevice", "cuGraphLaunch", "cuLaunchHostFunc",
};
static CUstream dev_stream[2];
static CUgraphExec graph_big, graph_small;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nothing(void *data)
{
	(void)data;
}

/* A graph of @nodes kernels of @blocks each (built with the driver's own calls). */
static CUgraphExec make_graph(unsigned int nodes, unsigned int blocks)
{
	struct {
		CUDA_KERNEL_NODE_PARAMS p;
		void *kern, *ctx;	/* _v2's tail */
	} np;
	CUgraph g = NULL;
	CUgraphExec e = NULL;
	CUgraphNode n, prev = NULL;

	memset(&np, 0, sizeof(np));
	np.p.func = FN;
	np.p.gridDimX = blocks;
	np.p.gridDimY = np.p.gridDimZ = np.p.blockDimX = np.p.blockDimY = np.p.blockDimZ = 1;
	OK(cuGraphCreate(&g, 0));
	for (unsigned int i = 0; i < nodes; i++) {
		OK(cuGraphAddKernelNode_v2(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &np.p));
		prev = n;
	}
	OK(cuGraphInstantiateWithFlags(&e, g, 0));
	return e;
}

/* Submit @blocks of work through @path on device 0 (and 1 for the multi-device one). */
static void submit(enum path path, unsigned int blocks)
{
	CUlaunchConfig c = { blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, 0 };
	CUDA_LAUNCH_PARAMS list[2];

	switch (path) {
	case P_KERNEL:
		OK(api.launch(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		break;
	case P_EX:
		OK(api.launch_ex(&c, FN, NULL, NULL));
		break;
	case P_COOP:
		OK(api.launch_coop(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL));
		break;
	case P_MULTI:
		for (int d = 0; d < 2; d++)
			list[d] = (CUDA_LAUNCH_PARAMS){ FN, blocks, 1, 1, 1, 1, 1, 0,
							dev_stream[d], NULL };
		OK(api.launch_multi(list, 2, 0));
		break;
	case P_GRAPH:	/* 40 ms as 400 kernels: charged what it took */
		OK(api.graph_launch(blocks > 1 ? graph_big : graph_small, NULL));
		break;
	case P_HOST:	/* the work as a kernel, then the host function */
		if (blocks > 1)
			OK(api.launch(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		OK(api.host_func(NULL, nothing, NULL));
		break;
	default:
		break;
	}
}

static void sync_all(void)
{
	use(1);
	OK(api.ctx_sync());
	use(0);
	OK(api.ctx_sync());
}

/*
 * 40 ms of work through @path, waited for; then how long the next call of
 * @path held the calling thread, in ns.  At 50 % the first 40 ms leave a
 * debt of about 20 ms, paid back at half speed.
 */
static uint64_t held(enum path path)
{
	use(0);
	submit(path, WORK);
	sync_all();
	uint64_t t0 = now_ns();
	submit(path, 1);
	uint64_t dt = now_ns() - t0;
	sync_all();
	return dt;
}

static void check_held(const char *what, uint64_t dt, int gated)
{
	printf("  %s: the call waited %.1f ms\n", what, (double)dt / MS);
	if (gated)
		CHECK(dt >= 10 * MS, "%s: not gated (%.1f ms)", what, (double)dt / MS);
	else
		CHECK(dt < 8 * MS, "%s: gated without a limit (%.1f ms)", what, (double)dt / MS);
}

/* Captured launches do not run now: they pass, and the capture holds. */
static void captured(int gated)
{
	CUstream s;
	CUgraph g = NULL;
	CUgraphExec e = NULL;
	int status = -1;

	use(0);
	OK(api.stream_create(&s, 0));
	submit(P_KERNEL, WORK);
	sync_all();			/* the grant is over: the next launch would wait */
	OK(cuStreamBeginCapture_v2(s, 0));
	uint64_t t0 = now_ns();
	for (int i = 0; i < 4; i++)
		OK(api.launch(FN, WORK / 4, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
	uint64_t dt = now_ns() - t0;
	OK(cuStreamIsCapturing(s, &status));
	CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capture status %d", status);
	OK(cuStreamEndCapture(s, &g));
	printf("  captured launches: waited %.1f ms\n", (double)dt / MS);
	CHECK(dt < 5 * MS, "captured launches waited %.1f ms", (double)dt / MS);
	/* The graph is gated when it runs. */
	OK(cuGraphInstantiateWithFlags(&e, g, 0));
	sync_all();
	OK(api.graph_launch(e, s));
	sync_all();
	uint64_t t1 = now_ns();
	OK(api.graph_launch(e, s));
	check_held("the captured graph, launched", now_ns() - t1, gated);
	sync_all();
}

static void launches(void)
{
	const char *g = getenv("TEST_GATED");
	int gated = !g || strcmp(g, "0");

	for (int d = 0; d < 2; d++) {
		use(d);
		OK(api.stream_create(&dev_stream[d], 0));
	}
	use(0);
	graph_big = make_graph(400, WORK / 400);
	graph_small = make_graph(1, 1);
	for (int p = 0; p < NPATHS; p++) {
		if (!*(void **)((p == P_EX) ? (void *)&api.launch_ex : (void *)&api.launch)) {
			printf("  %s: not at this version\n", path_name[p]);
			continue;
		}
		check_held(path_name[p], held((enum path)p), gated);
	}
	captured(gated);
	/* A forked child starts with no grant, and is held to the share on its own. */
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		check_held("cuLaunchKernel in a forked child", held(P_KERNEL), gated);
		fflush(stdout);
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
}

/*
 * Module mode, GPUs that are not the container's: every launch path is
 * refused (CUDA_ERROR_NOT_PERMITTED) and nothing reaches the GPU.
 */
static void launches_refused(void)
{
	CUlaunchConfig c = { 1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0 };
	CUDA_LAUNCH_PARAMS list[2];

	for (int d = 0; d < 2; d++) {
		use(d);
		OK(api.stream_create(&dev_stream[d], 0));
		list[d] = (CUDA_LAUNCH_PARAMS){ FN, 1, 1, 1, 1, 1, 1, 0, dev_stream[d], NULL };
	}
	use(0);
	graph_small = make_graph(1, 1);
	CHECK(api.launch(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchKernel not refused");
	if (api.launch_ex)
		CHECK(api.launch_ex(&c, FN, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
		      "%s", "cuLaunchKernelEx not refused");
	CHECK(api.launch_coop(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchCooperativeKernel not refused");
	CHECK(api.launch_multi(list, 2, 0) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchCooperativeKernelMultiDevice not refused");
	CHECK(api.graph_launch(graph_small, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuGraphLaunch not refused");
	CHECK(api.host_func(NULL, nothing, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchHostFunc not refused");
	use(1);
	CHECK(api.launch(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchKernel on device 1 not refused");
	sync_all();
}

/* cuGetProcAddress asked oddly: no crash, and never a wrapper of the wrong form. */
static void lookup_edges(void)
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

int main(int argc, char **argv)
{
	CUdevice d;

	if (argc != 3) {
		fprintf(stderr, "usage: %s MODE SCENARIO\n", argv[0]);
		return 2;
	}
	const char *mode = argv[1], *scenario = argv[2];
	if (resolve(mode))
		return 1;
	check_wrapped(mode);
	OK(api.init(0));
	for (int i = 0; i < 2; i++) {
		OK(api.device_get(&d, i));
		OK(api.primary_retain(&ctx[i], d));
	}
	if (!strcmp(scenario, "quota") || !strcmp(scenario, "ordinal")) {
		views();
		linear();
		async_and_pools();
		vmm();
		arrays();
		managed(0);
	} else if (!strcmp(scenario, "managed")) {
		managed(1);
	} else if (!strcmp(scenario, "off")) {
		off();
	} else if (!strcmp(scenario, "fork")) {
		forked();
	} else if (!strcmp(scenario, "modfork")) {
		module_forked();
	} else if (!strcmp(scenario, "refused")) {
		refused();
	} else if (!strcmp(scenario, "lookup")) {
		lookup_edges();
	} else if (!strcmp(scenario, "launch")) {
		launches();
	} else if (!strcmp(scenario, "launch_refused")) {
		launches_refused();
	} else {
		fprintf(stderr, "unknown scenario %s\n", scenario);
		return 2;
	}
	printf("%s %s: %s\n", mode, scenario, failures ? "FAILED" : "ok");
	return failures ? 1 : 0;
}
