/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API wrappers, one w_<entry point> each, defined by the
 * file of their concern (cuda_mem.c, cuda_pool.c, cuda_vmm.c, cuda_array.c,
 * cuda_launch.c, cuda_driver.c) and exported there under the entry point's
 * name; cuda_lookup.c hands them out to dlsym and cuGetProcAddress.
 * Declared here (hidden: the library is built -fvisibility=hidden) only so
 * that cuda_lookup.c can name them.
 */
#ifndef GPUSHARE_CUDA_WRAPPERS_H
#define GPUSHARE_CUDA_WRAPPERS_H

#include "cuda_abi.h"

#define EXPORT __attribute__((visibility("default")))
/* Export @name as the wrapper @impl (defined in the same file). */
#define EXPORT_AS(name, impl) \
	extern __typeof__(impl) name __attribute__((alias(#impl), visibility("default")))

/* cuda_driver.c: devices */
CUresult w_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult w_cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);

/* cuda_mem.c: linear memory, and the memory views */
CUresult w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
			      unsigned int elemsize);
CUresult w_cuMemFree_v2(CUdeviceptr dptr);
CUresult w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
CUresult w_cuMemGetInfo_v2(size_t *free_, size_t *total);
CUresult w_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

/* cuda_pool.c: stream-ordered allocation and pools */
CUresult w_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
				   CUstream s);
CUresult w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
					CUstream s);
CUresult w_cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
CUresult w_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
CUresult w_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult w_cuMemPoolDestroy(CUmemoryPool pool);

/* cuda_vmm.c: virtual memory management */
CUresult w_cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
		       const CUmemAllocationProp *prop, unsigned long long flags);
CUresult w_cuMemRelease(CUmemGenericAllocationHandle h);
CUresult w_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
		    CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult w_cuMemUnmap(CUdeviceptr ptr, size_t size);

/* cuda_array.c: arrays */
CUresult w_cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult w_cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc);
CUresult w_cuArrayDestroy(CUarray a);
CUresult w_cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *desc,
				  unsigned int levels);
CUresult w_cuMipmappedArrayDestroy(CUmipmappedArray m);

/* cuda_launch.c: launches, through the compute gate */
CUresult w_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			  CUstream s, void **params, void **extra);
CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			       unsigned int bx, unsigned int by, unsigned int bz,
			       unsigned int shared, CUstream s, void **params, void **extra);
CUresult w_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
			    void **extra);
CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
				 void **extra);
CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
				     unsigned int gz, unsigned int bx, unsigned int by,
				     unsigned int bz, unsigned int shared, CUstream s,
				     void **params);
CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					  unsigned int gz, unsigned int bx, unsigned int by,
					  unsigned int bz, unsigned int shared, CUstream s,
					  void **params);
CUresult w_cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n,
						unsigned int flags);
CUresult w_cuGraphLaunch(CUgraphExec exec, CUstream s);
CUresult w_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s);
CUresult w_cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
CUresult w_cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data);

#endif /* GPUSHARE_CUDA_WRAPPERS_H */
