// SPDX-License-Identifier: Apache-2.0
/* The name -> wrapper map (see lookup.h). */
#include <stddef.h>
#include <string.h>

#include "lookup.h"

static const char *const symbols[GS_FN_COUNT] = {
#define S(x) [GS_FN_##x] = #x
	S(cuGetProcAddress),
	S(cuGetProcAddress_v2),
	S(cuMemAlloc_v2),
	S(cuMemAllocPitch_v2),
	S(cuMemFree_v2),
	S(cuMemGetInfo_v2),
	S(cuDeviceTotalMem_v2),
	S(cuDeviceGetUuid),
	S(cuDeviceGetUuid_v2),
	S(cuMemAllocManaged),
	S(cuMemAllocAsync),
	S(cuMemAllocAsync_ptsz),
	S(cuMemAllocFromPoolAsync),
	S(cuMemAllocFromPoolAsync_ptsz),
	S(cuMemFreeAsync),
	S(cuMemFreeAsync_ptsz),
	S(cuMemPoolCreate),
	S(cuMemPoolDestroy),
	S(cuMemCreate),
	S(cuMemRelease),
	S(cuMemMap),
	S(cuMemUnmap),
	S(cuArrayCreate_v2),
	S(cuArray3DCreate_v2),
	S(cuArrayDestroy),
	S(cuMipmappedArrayCreate),
	S(cuMipmappedArrayDestroy),
	S(cuLaunchKernel),
	S(cuLaunchKernel_ptsz),
	S(cuLaunchKernelEx),
	S(cuLaunchKernelEx_ptsz),
	S(cuLaunchCooperativeKernel),
	S(cuLaunchCooperativeKernel_ptsz),
	S(cuLaunchCooperativeKernelMultiDevice),
	S(cuGraphLaunch),
	S(cuGraphLaunch_ptsz),
	S(cuLaunchHostFunc),
	S(cuLaunchHostFunc_ptsz),
#undef S
};

/*
 * What the driver answers for a base name: from @version on (until a row
 * with a higher version of the same name), the entry point @fn; a
 * per-thread row applies only when the caller asks for the per-thread
 * default stream.  Versions are those of the CUDA headers' typedefs
 * (cudaTypedefs.h: PFN_<name>_v<version>).  A name asked at a version
 * below its first row is an entry point we do not wrap (cuMemAlloc before
 * 3020 takes a 32-bit size) and maps to nothing.
 */
static const struct row {
	const char *name;
	int version;
	int per_thread;
	enum gs_fn fn;
} rows[] = {
	{ "cuGetProcAddress", 11030, 0, GS_FN_cuGetProcAddress },
	{ "cuGetProcAddress", 12000, 0, GS_FN_cuGetProcAddress_v2 },
	{ "cuMemAlloc", 3020, 0, GS_FN_cuMemAlloc_v2 },
	{ "cuMemAllocPitch", 3020, 0, GS_FN_cuMemAllocPitch_v2 },
	{ "cuMemFree", 3020, 0, GS_FN_cuMemFree_v2 },
	{ "cuMemGetInfo", 3020, 0, GS_FN_cuMemGetInfo_v2 },
	{ "cuDeviceTotalMem", 3020, 0, GS_FN_cuDeviceTotalMem_v2 },
	{ "cuDeviceGetUuid", 9020, 0, GS_FN_cuDeviceGetUuid },
	{ "cuDeviceGetUuid", 11040, 0, GS_FN_cuDeviceGetUuid_v2 },
	{ "cuMemAllocManaged", 6000, 0, GS_FN_cuMemAllocManaged },
	{ "cuMemAllocAsync", 11020, 0, GS_FN_cuMemAllocAsync },
	{ "cuMemAllocAsync", 11020, 1, GS_FN_cuMemAllocAsync_ptsz },
	{ "cuMemAllocFromPoolAsync", 11020, 0, GS_FN_cuMemAllocFromPoolAsync },
	{ "cuMemAllocFromPoolAsync", 11020, 1, GS_FN_cuMemAllocFromPoolAsync_ptsz },
	{ "cuMemFreeAsync", 11020, 0, GS_FN_cuMemFreeAsync },
	{ "cuMemFreeAsync", 11020, 1, GS_FN_cuMemFreeAsync_ptsz },
	{ "cuMemPoolCreate", 11020, 0, GS_FN_cuMemPoolCreate },
	{ "cuMemPoolDestroy", 11020, 0, GS_FN_cuMemPoolDestroy },
	{ "cuMemCreate", 10020, 0, GS_FN_cuMemCreate },
	{ "cuMemRelease", 10020, 0, GS_FN_cuMemRelease },
	{ "cuMemMap", 10020, 0, GS_FN_cuMemMap },
	{ "cuMemUnmap", 10020, 0, GS_FN_cuMemUnmap },
	{ "cuArrayCreate", 3020, 0, GS_FN_cuArrayCreate_v2 },
	{ "cuArray3DCreate", 3020, 0, GS_FN_cuArray3DCreate_v2 },
	{ "cuArrayDestroy", 2000, 0, GS_FN_cuArrayDestroy },
	{ "cuMipmappedArrayCreate", 5000, 0, GS_FN_cuMipmappedArrayCreate },
	{ "cuMipmappedArrayDestroy", 5000, 0, GS_FN_cuMipmappedArrayDestroy },
	/* Launches: per-thread forms from the version that added them. */
	{ "cuLaunchKernel", 4000, 0, GS_FN_cuLaunchKernel },
	{ "cuLaunchKernel", 7000, 1, GS_FN_cuLaunchKernel_ptsz },
	{ "cuLaunchKernelEx", 11060, 0, GS_FN_cuLaunchKernelEx },
	{ "cuLaunchKernelEx", 11060, 1, GS_FN_cuLaunchKernelEx_ptsz },
	{ "cuLaunchCooperativeKernel", 9000, 0, GS_FN_cuLaunchCooperativeKernel },
	{ "cuLaunchCooperativeKernel", 9000, 1, GS_FN_cuLaunchCooperativeKernel_ptsz },
	{ "cuLaunchCooperativeKernelMultiDevice", 9000, 0,
	  GS_FN_cuLaunchCooperativeKernelMultiDevice },
	{ "cuGraphLaunch", 10000, 0, GS_FN_cuGraphLaunch },
	{ "cuGraphLaunch", 10000, 1, GS_FN_cuGraphLaunch_ptsz },
	{ "cuLaunchHostFunc", 10000, 0, GS_FN_cuLaunchHostFunc },
	{ "cuLaunchHostFunc", 10000, 1, GS_FN_cuLaunchHostFunc_ptsz },
};

const char *gs_fn_symbol(enum gs_fn fn)
{
	return (unsigned int)fn < GS_FN_COUNT ? symbols[fn] : NULL;
}

int gs_fn_by_symbol(const char *symbol)
{
	if (!symbol)
		return -1;
	for (int i = 0; i < GS_FN_COUNT; i++)
		if (!strcmp(symbols[i], symbol))
			return i;
	return -1;
}

int gs_fn_lookup(const char *name, int version, uint64_t flags)
{
	const struct row *best = NULL;
	int per_thread = (flags & GS_PROC_PER_THREAD) != 0;

	if (!name)
		return -1;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		if (strcmp(r->name, name) || r->version > version ||
		    (r->per_thread && !per_thread))
			continue;
		if (!best || r->version > best->version ||
		    (r->version == best->version && r->per_thread))
			best = r;
	}
	if (best)
		return (int)best->fn;
	/*
	 * A versioned name asked as such ("cuMemAlloc_v2"): the driver
	 * answers it only if it knows that spelling, and then it is that
	 * entry point, provided the version has it.
	 */
	int fn = gs_fn_by_symbol(name);
	if (fn < 0)
		return -1;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (rows[i].fn == (enum gs_fn)fn)
			return rows[i].version <= version ? fn : -1;
	return -1;
}
