// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's error names and texts, and cuGetProcAddress's
 * name table (see fake_cuda.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <string.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

/* ---- errors ---- */

static const struct { CUresult r; const char *name, *text; } errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ ERR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
	  "the operation cannot be performed in the present state" },
	{ ERR_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	  "operation not permitted when stream is capturing" },
	{ ERR_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	  "operation failed due to a previous error during capture" },
	{ ERR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
	  "operation not permitted on an event last recorded in a capturing stream" },
};

static int error_index(CUresult r)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].r == r)
			return (int)i;
	return -1;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	int i = error_index(r);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = i < 0 ? NULL : errors[i].text;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	int i = error_index(r);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = i < 0 ? NULL : errors[i].name;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

/*
 * The name table: a name as callers ask for it, the first driver version
 * the entry answers for, whether it is a per-thread default stream variant,
 * and the function.  Several rows per name: the one with the highest
 * version not above the caller's wins (and a per-thread row wins over the
 * default one only when the caller asks for per-thread).
 */
#define E(n, v, f) { n, v, 0, (void *)f }
#define PT(n, v, f) { n, v, 1, (void *)f }
static const struct proc {
	const char *name;
	int version;
	int per_thread;
	void *fn;
} procs[] = {
	E("cuInit", 2000, cuInit),
	E("cuDriverGetVersion", 2020, cuDriverGetVersion),
	E("cuDeviceGet", 2000, cuDeviceGet),
	E("cuDeviceGetCount", 2000, cuDeviceGetCount),
	E("cuDeviceGetName", 2000, cuDeviceGetName),
	E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
	E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	E("cuCtxCreate", 3020, cuCtxCreate_v2),
	E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	E("cuCtxGetDevice", 2000, cuCtxGetDevice),
	E("cuCtxSynchronize", 2000, cuCtxSynchronize),
	E("cuMemAlloc", 3020, cuMemAlloc_v2),
	E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
	E("cuMemFree", 3020, cuMemFree_v2),
	E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	E("cuMemAllocManaged", 6000, cuMemAllocManaged),
	E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
	E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
	E("cuMemsetD8", 3020, cuMemsetD8_v2),
	E("cuStreamCreate", 2000, cuStreamCreate),
	E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	E("cuStreamSynchronize", 2000, cuStreamSynchronize),
	PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
	E("cuStreamQuery", 2000, cuStreamQuery),
	PT("cuStreamQuery", 7000, cuStreamQuery_ptsz),
	E("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
	PT("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz),
	E("cuEventCreate", 2000, cuEventCreate),
	E("cuEventDestroy", 2000, cuEventDestroy),
	E("cuEventDestroy", 4000, cuEventDestroy_v2),
	E("cuEventRecord", 2000, cuEventRecord),
	PT("cuEventRecord", 7000, cuEventRecord_ptsz),
	E("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags),
	PT("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags_ptsz),
	E("cuEventQuery", 2000, cuEventQuery),
	E("cuEventSynchronize", 2000, cuEventSynchronize),
	E("cuEventElapsedTime", 2000, cuEventElapsedTime),
	E("cuModuleLoadData", 2000, cuModuleLoadData),
	E("cuModuleGetFunction", 2000, cuModuleGetFunction),
	E("cuLaunchKernel", 4000, cuLaunchKernel),
	PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
	E("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
	PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
	E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
	PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
	E("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
	E("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
	PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc_ptsz),
	E("cuGraphCreate", 10000, cuGraphCreate),
	E("cuGraphDestroy", 10000, cuGraphDestroy),
	E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
	E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
	E("cuGraphInstantiate", 10000, cuGraphInstantiate),
	E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
	E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
	E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
	E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
	E("cuGraphLaunch", 10000, cuGraphLaunch),
	PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
	E("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
	PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
	E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
	PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
	E("cuStreamEndCapture", 10000, cuStreamEndCapture),
	PT("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
	E("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
	PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
	E("cuStreamGetDevice", 12080, cuStreamGetDevice),
	E("cuMemAllocAsync", 11020, cuMemAllocAsync),
	PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
	E("cuMemFreeAsync", 11020, cuMemFreeAsync),
	PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
	E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
	PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
	E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	E("cuMemPoolCreate", 11020, cuMemPoolCreate),
	E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	E("cuMemCreate", 10020, cuMemCreate),
	E("cuMemRelease", 10020, cuMemRelease),
	E("cuMemAddressReserve", 10020, cuMemAddressReserve),
	E("cuMemAddressFree", 10020, cuMemAddressFree),
	E("cuMemMap", 10020, cuMemMap),
	E("cuMemUnmap", 10020, cuMemUnmap),
	E("cuMemSetAccess", 10020, cuMemSetAccess),
	E("cuArrayCreate", 3020, cuArrayCreate_v2),
	E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
	E("cuArrayDestroy", 2000, cuArrayDestroy),
	E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
	E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
	E("cuGetErrorString", 6000, cuGetErrorString),
	E("cuGetErrorName", 6000, cuGetErrorName),
	E("cuGetProcAddress", 11030, cuGetProcAddress),
	E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult lookup(const char *name, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	int known = 0;

	if (!name || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		const struct proc *p = &procs[i];
		if (strcmp(p->name, name))
			continue;
		known = 1;
		if (p->version > version || (p->per_thread && !want_pt))
			continue;
		if (!best || p->version > best->version ||
		    (p->version == best->version && p->per_thread))
			best = p;
	}
	*pfn = best ? best->fn : NULL;
	if (status)
		*status = best ? CU_GET_PROC_ADDRESS_SUCCESS :
			  known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT :
			  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress(const char *name, void **pfn, int version, cuuint64_t flags)
{
	return lookup(name, pfn, version, flags, NULL);
}

API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	return lookup(name, pfn, version, flags, status);
}
