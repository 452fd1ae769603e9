/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The name -> wrapper map: which of the driver's entry points the
 * interposer wraps, and which of them a lookup means.
 *
 * Callers reach the driver three ways: by symbol (linked, or dlsym) with
 * the versioned name ("cuMemAlloc_v2"), or through cuGetProcAddress with
 * the base name, the API version they were written for and a flag for the
 * per-thread default stream.  The driver answers the latter with the entry
 * point of that version: "cuMemAlloc" at 3020 or later is cuMemAlloc_v2 (a
 * 64-bit size; before, a 32-bit one), "cuMemAllocAsync" with the
 * per-thread flag is cuMemAllocAsync_ptsz.  A wrapper may only be handed
 * out where its signature is the one the caller asked for, so a lookup
 * maps to a wrapper only when (name, version, flags) names exactly the
 * entry point it wraps; anything else passes the driver's answer through.
 * Pure (names only), unit-tested on its own.
 */
#ifndef GPUSHARE_LOOKUP_H
#define GPUSHARE_LOOKUP_H

#include <stdint.h>

/* The wrapped entry points, by their exported (versioned) names. */
enum gs_fn {
	GS_FN_cuGetProcAddress,			/* 4 arguments, before 12000 */
	GS_FN_cuGetProcAddress_v2,		/* 5 arguments, 12000 on */
	GS_FN_cuMemAlloc_v2,
	GS_FN_cuMemAllocPitch_v2,
	GS_FN_cuMemFree_v2,
	GS_FN_cuMemGetInfo_v2,
	GS_FN_cuDeviceTotalMem_v2,
	GS_FN_cuDeviceGetUuid,
	GS_FN_cuDeviceGetUuid_v2,
	GS_FN_cuMemAllocManaged,
	GS_FN_cuMemAllocAsync,
	GS_FN_cuMemAllocAsync_ptsz,
	GS_FN_cuMemAllocFromPoolAsync,
	GS_FN_cuMemAllocFromPoolAsync_ptsz,
	GS_FN_cuMemFreeAsync,
	GS_FN_cuMemFreeAsync_ptsz,
	GS_FN_cuMemPoolCreate,
	GS_FN_cuMemPoolDestroy,
	GS_FN_cuMemCreate,
	GS_FN_cuMemRelease,
	GS_FN_cuMemMap,
	GS_FN_cuMemUnmap,
	GS_FN_cuArrayCreate_v2,
	GS_FN_cuArray3DCreate_v2,
	GS_FN_cuArrayDestroy,
	GS_FN_cuMipmappedArrayCreate,
	GS_FN_cuMipmappedArrayDestroy,
	/* launches (the compute gate, sched_gate.h) */
	GS_FN_cuLaunchKernel,
	GS_FN_cuLaunchKernel_ptsz,
	GS_FN_cuLaunchKernelEx,
	GS_FN_cuLaunchKernelEx_ptsz,
	GS_FN_cuLaunchCooperativeKernel,
	GS_FN_cuLaunchCooperativeKernel_ptsz,
	GS_FN_cuLaunchCooperativeKernelMultiDevice,
	GS_FN_cuGraphLaunch,
	GS_FN_cuGraphLaunch_ptsz,
	GS_FN_cuLaunchHostFunc,
	GS_FN_cuLaunchHostFunc_ptsz,
	GS_FN_COUNT
};

/* cuGetProcAddress's per-thread default stream flag. */
#define GS_PROC_PER_THREAD 2ull

/* The exported name of @fn ("cuMemAlloc_v2"). */
const char *gs_fn_symbol(enum gs_fn fn);

/* The entry point an exported name is, or -1 when not one we wrap. */
int gs_fn_by_symbol(const char *symbol);

/*
 * The entry point that cuGetProcAddress(@name, @version, @flags) returns,
 * when it is one we wrap; else -1.  @name is a base name ("cuMemAlloc");
 * an exported versioned name is taken as itself when the version has it.
 */
int gs_fn_lookup(const char *name, int version, uint64_t flags);

#endif /* GPUSHARE_LOOKUP_H */
