// SPDX-License-Identifier: Apache-2.0
/* The name -> wrapper map: versions, per-thread variants, exact names. */
#include <string.h>

#include "lookup.h"
#include "unit.h"

#define PT GS_PROC_PER_THREAD

static const char *at(const char *name, int version, uint64_t flags)
{
	int fn = gs_fn_lookup(name, version, flags);
	return fn < 0 ? NULL : gs_fn_symbol(fn);
}

static int is(const char *got, const char *want)
{
	return want ? got && !strcmp(got, want) : !got;
}

int main(void)
{
	/* _v2 entry points from 3020; before, a 32-bit size: not ours. */
	CHECK(is(at("cuMemAlloc", 12090, 0), "cuMemAlloc_v2"));
	CHECK(is(at("cuMemAlloc", 3020, 0), "cuMemAlloc_v2"));
	CHECK(is(at("cuMemAlloc", 3010, 0), NULL));
	CHECK(is(at("cuMemFree", 12000, PT), "cuMemFree_v2"));	/* no per-thread form */
	CHECK(is(at("cuMemGetInfo", 11000, 0), "cuMemGetInfo_v2"));
	CHECK(is(at("cuDeviceTotalMem", 12090, 0), "cuDeviceTotalMem_v2"));
	CHECK(is(at("cuArrayCreate", 12090, 0), "cuArrayCreate_v2"));
	CHECK(is(at("cuArray3DCreate", 3000, 0), NULL));
	CHECK(is(at("cuArrayDestroy", 12090, 0), "cuArrayDestroy"));
	CHECK(is(at("cuMipmappedArrayCreate", 12090, 0), "cuMipmappedArrayCreate"));

	/* cuDeviceGetUuid: _v2 from 11040. */
	CHECK(is(at("cuDeviceGetUuid", 11030, 0), "cuDeviceGetUuid"));
	CHECK(is(at("cuDeviceGetUuid", 11040, 0), "cuDeviceGetUuid_v2"));
	CHECK(is(at("cuDeviceGetUuid", 9000, 0), NULL));

	/* The lookup function itself: the 4-argument form before 12000. */
	CHECK(is(at("cuGetProcAddress", 11030, 0), "cuGetProcAddress"));
	CHECK(is(at("cuGetProcAddress", 11080, 0), "cuGetProcAddress"));
	CHECK(is(at("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2"));
	CHECK(is(at("cuGetProcAddress", 13000, PT), "cuGetProcAddress_v2"));
	CHECK(is(at("cuGetProcAddress", 11020, 0), NULL));

	/* Stream-ordered: per-thread variants only when asked for. */
	CHECK(is(at("cuMemAllocAsync", 11020, 0), "cuMemAllocAsync"));
	CHECK(is(at("cuMemAllocAsync", 12090, 1), "cuMemAllocAsync"));
	CHECK(is(at("cuMemAllocAsync", 12090, PT), "cuMemAllocAsync_ptsz"));
	CHECK(is(at("cuMemFreeAsync", 12090, PT), "cuMemFreeAsync_ptsz"));
	CHECK(is(at("cuMemAllocFromPoolAsync", 12090, PT), "cuMemAllocFromPoolAsync_ptsz"));
	CHECK(is(at("cuMemAllocFromPoolAsync", 12090, 0), "cuMemAllocFromPoolAsync"));
	CHECK(is(at("cuMemAllocAsync", 11010, PT), NULL));
	CHECK(is(at("cuMemPoolCreate", 12090, PT), "cuMemPoolCreate"));

	/* VMM and managed. */
	CHECK(is(at("cuMemCreate", 10020, 0), "cuMemCreate"));
	CHECK(is(at("cuMemCreate", 10010, 0), NULL));
	CHECK(is(at("cuMemRelease", 12090, 0), "cuMemRelease"));
	CHECK(is(at("cuMemMap", 10020, 0), "cuMemMap"));	/* unversioned since 10.2 */
	CHECK(is(at("cuMemMap", 12090, PT), "cuMemMap"));
	CHECK(is(at("cuMemMap", 10010, 0), NULL));
	CHECK(is(at("cuMemUnmap", 12090, 0), "cuMemUnmap"));
	CHECK(is(at("cuMemUnmap", 10010, 0), NULL));
	CHECK(is(at("cuMemAllocManaged", 12090, 0), "cuMemAllocManaged"));

	/* Launches: each from the version that added it; per-thread forms
	 * only when asked for, and only from their own version. */
	CHECK(is(at("cuLaunchKernel", 4000, 0), "cuLaunchKernel"));
	CHECK(is(at("cuLaunchKernel", 3020, 0), NULL));
	CHECK(is(at("cuLaunchKernel", 12090, 0), "cuLaunchKernel"));
	CHECK(is(at("cuLaunchKernel", 12090, PT), "cuLaunchKernel_ptsz"));
	CHECK(is(at("cuLaunchKernel", 7000, PT), "cuLaunchKernel_ptsz"));
	CHECK(is(at("cuLaunchKernel", 6050, PT), "cuLaunchKernel"));	/* no _ptsz yet */
	CHECK(is(at("cuLaunchKernelEx", 11060, 0), "cuLaunchKernelEx"));
	CHECK(is(at("cuLaunchKernelEx", 11050, 0), NULL));
	CHECK(is(at("cuLaunchKernelEx", 11050, PT), NULL));
	CHECK(is(at("cuLaunchKernelEx", 12090, PT), "cuLaunchKernelEx_ptsz"));
	CHECK(is(at("cuLaunchCooperativeKernel", 9000, 0), "cuLaunchCooperativeKernel"));
	CHECK(is(at("cuLaunchCooperativeKernel", 8000, 0), NULL));
	CHECK(is(at("cuLaunchCooperativeKernel", 12090, PT), "cuLaunchCooperativeKernel_ptsz"));
	CHECK(is(at("cuLaunchCooperativeKernelMultiDevice", 9000, 0),
		 "cuLaunchCooperativeKernelMultiDevice"));
	CHECK(is(at("cuLaunchCooperativeKernelMultiDevice", 12090, PT),
		 "cuLaunchCooperativeKernelMultiDevice"));	/* no per-thread form */
	CHECK(is(at("cuLaunchCooperativeKernelMultiDevice", 8000, 0), NULL));
	CHECK(is(at("cuGraphLaunch", 10000, 0), "cuGraphLaunch"));
	CHECK(is(at("cuGraphLaunch", 9020, 0), NULL));
	CHECK(is(at("cuGraphLaunch", 10000, PT), "cuGraphLaunch_ptsz"));
	CHECK(is(at("cuGraphLaunch", 12090, 1), "cuGraphLaunch"));	/* legacy flag */
	CHECK(is(at("cuLaunchHostFunc", 10000, 0), "cuLaunchHostFunc"));
	CHECK(is(at("cuLaunchHostFunc", 9020, PT), NULL));
	CHECK(is(at("cuLaunchHostFunc", 12090, PT), "cuLaunchHostFunc_ptsz"));
	CHECK(is(at("cuLaunchKernel_ptsz", 12090, 0), "cuLaunchKernel_ptsz"));
	CHECK(is(at("cuLaunchKernel_ptsz", 6050, 0), NULL));
	CHECK(is(at("cuGraphLaunch_ptsz", 12090, 0), "cuGraphLaunch_ptsz"));
	/* The legacy launches are not wrapped. */
	CHECK(is(at("cuLaunch", 12090, 0), NULL));
	CHECK(is(at("cuLaunchGrid", 12090, 0), NULL));
	CHECK(is(at("cuLaunchGridAsync", 12090, 0), NULL));

	/* Names we do not wrap, and exact versioned names. */
	CHECK(is(at("cuInit", 12090, 0), NULL));
	CHECK(is(at("cuMemcpyHtoD", 12090, 0), NULL));
	CHECK(is(at("", 12090, 0), NULL));
	CHECK(is(at(NULL, 12090, 0), NULL));
	CHECK(is(at("cuMemAlloc_v2", 12090, 0), "cuMemAlloc_v2"));
	CHECK(is(at("cuMemAlloc_v2", 3000, 0), NULL));
	CHECK(is(at("cuMemAllocAsync_ptsz", 12090, 0), "cuMemAllocAsync_ptsz"));

	/* Exported names, both ways. */
	for (int i = 0; i < GS_FN_COUNT; i++)
		CHECK(gs_fn_by_symbol(gs_fn_symbol(i)) == i);
	CHECK(gs_fn_by_symbol("cuMemAlloc") == -1);	/* a base name is not exported */
	CHECK(gs_fn_by_symbol("dlsym") == -1);
	CHECK(gs_fn_symbol(GS_FN_COUNT) == NULL);
	return DONE("unit_lookup");
}
