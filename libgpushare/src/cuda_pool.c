// SPDX-License-Identifier: Apache-2.0
/*
 * Stream-ordered allocation and memory pools: counted on the stream's
 * device, or the pool's (remembered when the pool is made here; default
 * pools are recognised through cuDeviceGetDefaultMemPool).
 */
#include <stdbool.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "cuda_account.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "lookup.h"
#include "table.h"

typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);

static CUresult alloc_async(enum gs_fn fn, CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	bool counted;
	int dev = gs_stream_device(s);
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	async_fn f = (async_fn)gs_driver_fn(fn);
	r = f ? f(dptr, bytes, s) : CUDA_ERROR_NOT_FOUND;
	gs_alloc_settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}

CUresult w_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	return alloc_async(GS_FN_cuMemAllocAsync, dptr, bytes, s);
}
EXPORT_AS(cuMemAllocAsync, w_cuMemAllocAsync);

CUresult w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	return alloc_async(GS_FN_cuMemAllocAsync_ptsz, dptr, bytes, s);
}
EXPORT_AS(cuMemAllocAsync_ptsz, w_cuMemAllocAsync_ptsz);

/*
 * A pool's device: recorded when it was created here, else one of the
 * devices' default pools (looked up once), else the current device.
 */
static int pool_device(CUmemoryPool pool)
{
	int dev;

	if (gs_table_get(&gs_alloc_table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, &dev, NULL))
		return dev;
	dev = gs_default_pool_device(pool);
	if (dev >= 0) {
		gs_table_put(&gs_alloc_table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, dev, 0);
		return dev;
	}
	return gs_current_device();
}

typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_from_pool(enum gs_fn fn, CUdeviceptr *dptr, size_t bytes,
				CUmemoryPool pool, CUstream s)
{
	bool counted;
	int dev = pool ? pool_device(pool) : -1;
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	pool_alloc_fn f = (pool_alloc_fn)gs_driver_fn(fn);
	r = f ? f(dptr, bytes, pool, s) : CUDA_ERROR_NOT_FOUND;
	gs_alloc_settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}

CUresult w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
				   CUmemoryPool pool, CUstream s)
{
	return alloc_from_pool(GS_FN_cuMemAllocFromPoolAsync, dptr, bytes, pool, s);
}
EXPORT_AS(cuMemAllocFromPoolAsync, w_cuMemAllocFromPoolAsync);

CUresult w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
					CUmemoryPool pool, CUstream s)
{
	return alloc_from_pool(GS_FN_cuMemAllocFromPoolAsync_ptsz, dptr, bytes, pool, s);
}
EXPORT_AS(cuMemAllocFromPoolAsync_ptsz, w_cuMemAllocFromPoolAsync_ptsz);

typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

/*
 * Released when the free is called, not when the stream reaches it: the
 * driver may then hand the bytes to the next allocation in stream order,
 * which is what they are for.
 */
static CUresult free_async(enum gs_fn fn, CUdeviceptr dptr, CUstream s)
{
	free_async_fn f = (free_async_fn)gs_driver_fn(fn);
	return FREE_RECORDED(GS_KIND_MEM, dptr, f ? f(dptr, s) : CUDA_ERROR_NOT_FOUND);
}

CUresult w_cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	return free_async(GS_FN_cuMemFreeAsync, dptr, s);
}
EXPORT_AS(cuMemFreeAsync, w_cuMemFreeAsync);

CUresult w_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	return free_async(GS_FN_cuMemFreeAsync_ptsz, dptr, s);
}
EXPORT_AS(cuMemFreeAsync_ptsz, w_cuMemFreeAsync_ptsz);

typedef CUresult (*pool_create_fn)(CUmemoryPool *, const CUmemPoolProps *);

CUresult w_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	CUresult r = REAL(pool_create_fn, cuMemPoolCreate, pool, props);
	if (r == CUDA_SUCCESS && pool && props) {
		/* A pool of host memory is no device's: -1, not counted. */
		int dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ?
			  props->location.id : -1;
		gs_table_put(&gs_alloc_table, GS_KIND_POOL, (uint64_t)(uintptr_t)*pool, dev, 0);
	}
	return r;
}
EXPORT_AS(cuMemPoolCreate, w_cuMemPoolCreate);

typedef CUresult (*pool_destroy_fn)(CUmemoryPool);

CUresult w_cuMemPoolDestroy(CUmemoryPool pool)
{
	CUresult r = REAL(pool_destroy_fn, cuMemPoolDestroy, pool);
	if (r == CUDA_SUCCESS)
		gs_table_take(&gs_alloc_table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, NULL, NULL);
	return r;
}
EXPORT_AS(cuMemPoolDestroy, w_cuMemPoolDestroy);
