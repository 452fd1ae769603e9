/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake CUDA driver's entry points (see fake_cuda.c), by the file that
 * defines them: cuGetProcAddress's table (fake_cuda_proc.c) hands them out.
 */
#ifndef FAKE_CUDA_API_H
#define FAKE_CUDA_API_H

#include <stdint.h>

#include "fake_cuda.h"

/* fake_cuda.c */
API CUresult cuInit(unsigned int flags);
API CUresult cuDriverGetVersion(int *v);
API CUresult cuDeviceGetCount(int *n);
API CUresult cuDeviceGet(CUdevice *d, int ordinal);
API CUresult cuDeviceGetName(char *name, int len, CUdevice d);
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d);
API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d);
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d);
API CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d);
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d);
API CUresult cuCtxDestroy_v2(CUcontext ctx);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxGetCurrent(CUcontext *ctx);
API CUresult cuCtxPushCurrent_v2(CUcontext ctx);
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
API CUresult cuCtxGetDevice(CUdevice *d);

/* fake_cuda_mem.c */
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
				size_t height, unsigned int elemsize);
API CUresult cuMemFree_v2(CUdeviceptr dptr);
API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total);
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d);
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
				     CUmemoryPool pool, CUstream s);
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
					  CUmemoryPool pool, CUstream s);
API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc);
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc);
API CUresult cuArrayDestroy(CUarray a);
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *desc,
				    unsigned int levels);
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m);

/* fake_cuda_vmm.c */
API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   int option);
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
			 const CUmemAllocationProp *prop, unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle h);
API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
				 CUdeviceptr addr, unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle h, unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
			    size_t count);

/* fake_cuda_gpu.c */
API uint64_t fakecuda_busy_ns(void);

/* fake_cuda_launch.c */
API CUresult cuModuleLoadData(void **module, const void *image);
API CUresult cuModuleGetFunction(CUfunction *f, void *module, const char *name);
API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			    unsigned int bx, unsigned int by, unsigned int bz,
			    unsigned int shared, CUstream s, void **params, void **extra);
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				 unsigned int gz, unsigned int bx, unsigned int by,
				 unsigned int bz, unsigned int shared, CUstream s,
				 void **params, void **extra);
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
			      void **extra);
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
				   void **extra);
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
				       unsigned int gz, unsigned int bx, unsigned int by,
				       unsigned int bz, unsigned int shared, CUstream s,
				       void **params);
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					    unsigned int gz, unsigned int bx, unsigned int by,
					    unsigned int bz, unsigned int shared, CUstream s,
					    void **params);
API CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n,
						  unsigned int flags);
API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data);

/* fake_cuda_stream.c */
API CUresult cuStreamCreate(CUstream *s, unsigned int flags);
API CUresult cuStreamDestroy_v2(CUstream s);
API CUresult cuStreamSynchronize(CUstream s);
API CUresult cuStreamSynchronize_ptsz(CUstream s);
API CUresult cuStreamQuery(CUstream s);
API CUresult cuStreamQuery_ptsz(CUstream s);
API CUresult cuCtxSynchronize(void);
API CUresult cuEventCreate(CUevent *e, unsigned int flags);
API CUresult cuEventDestroy_v2(CUevent e);
API CUresult cuEventDestroy(CUevent e);
API CUresult cuEventRecord(CUevent e, CUstream s);
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags);
API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags);
API CUresult cuEventQuery(CUevent e);
API CUresult cuEventSynchronize(CUevent e);
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags);

/* fake_cuda_graph.c */
API CUresult cuGraphCreate(CUgraph *g, unsigned int flags);
API CUresult cuGraphDestroy(CUgraph g);
API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				  size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p);
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				     size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p);
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
API CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				   size_t logsize);
API CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				size_t logsize);
API CUresult cuGraphExecDestroy(CUgraphExec e);
API CUresult cuGraphLaunch(CUgraphExec e, CUstream s);
API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s);
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode);
API CUresult cuStreamBeginCapture(CUstream s);
API CUresult cuStreamBeginCapture_ptsz(CUstream s);
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
API CUresult cuStreamIsCapturing(CUstream s, int *status);
API CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status);
API CUresult cuStreamGetDevice(CUstream s, CUdevice *d);

/* fake_cuda_proc.c */
API CUresult cuGetErrorString(CUresult r, const char **s);
API CUresult cuGetErrorName(CUresult r, const char **s);
API CUresult cuGetProcAddress(const char *name, void **pfn, int version, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status);

#endif /* FAKE_CUDA_API_H */
