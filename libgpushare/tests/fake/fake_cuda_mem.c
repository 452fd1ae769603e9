// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's memory (see fake_cuda.c): each device's memory in
 * use, allocations, copies, stream-ordered allocation and pools, arrays.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

struct CUarray_st { void *mem; size_t bytes; int dev; };
struct CUmipmappedArray_st { void *mem; size_t bytes; int dev; };

_Atomic uint64_t used[MAX_DEV];

/* Live allocations (pointer -> bytes, device), for cuMemFree and GetInfo. */
struct alloc { uintptr_t ptr; size_t bytes; int dev; struct alloc *next; };
static struct alloc *allocs;
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Take @bytes of device @dev's memory: 0, or -1 when it has no more. */
int take(int dev, size_t bytes)
{
	uint64_t old = atomic_load(&used[dev]);
	do {
		if (bytes > devmem || old > devmem - bytes)
			return -1;
	} while (!atomic_compare_exchange_weak(&used[dev], &old, old + bytes));
	mem_note(dev);
	return 0;
}

/* Give back @bytes of device @dev's memory. */
void unuse(int dev, size_t bytes)
{
	atomic_fetch_sub(&used[dev], bytes);
	mem_note(dev);
}

static void *host_map(size_t bytes)
{
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytes, int dev)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!dptr || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (take(dev, bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *p = host_map(bytes);
	struct alloc *a = malloc(sizeof(*a));
	if (!p || !a) {
		if (p)
			munmap(p, bytes);
		free(a);
		unuse(dev, bytes);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->ptr = (uintptr_t)p;
	a->bytes = bytes;
	a->dev = dev;
	pthread_mutex_lock(&lock);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&lock);
	*dptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

static CUresult mem_free(CUdeviceptr dptr)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!dptr)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&lock);
	struct alloc **pp = &allocs, *a;
	while ((a = *pp) && a->ptr != dptr)
		pp = &a->next;
	if (a)
		*pp = a->next;
	pthread_mutex_unlock(&lock);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)a->ptr, a->bytes);
	unuse(a->dev, a->bytes);
	free(a);
	return CUDA_SUCCESS;
}

/* ---- memory ---- */

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	return mem_alloc(dptr, bytes, cur_dev());
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
				size_t height, unsigned int elemsize)
{
	if (!pitch || width == 0 || height == 0 ||
	    (elemsize != 4 && elemsize != 8 && elemsize != 16))
		return CUDA_ERROR_INVALID_VALUE;
	size_t p = (width + 511) & ~(size_t)511;	/* rows aligned to 512 */
	CUresult r = mem_alloc(dptr, p * height, cur_dev());
	if (r == CUDA_SUCCESS)
		*pitch = p;
	return r;
}

API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return mem_free(dptr);
}

API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
	int d = cur_dev();
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!free_ || !total)
		return CUDA_ERROR_INVALID_VALUE;
	*total = devmem;
	*free_ = devmem - atomic_load(&used[d]);
	return CUDA_SUCCESS;
}

API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
	(void)flags;
	return mem_alloc(dptr, bytes, cur_dev());
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
	if (!dst)
		return CUDA_ERROR_INVALID_VALUE;
	memset((void *)(uintptr_t)dst, v, n);
	return CUDA_SUCCESS;
}

/* ---- stream-ordered allocation and pools (work is done at once) ---- */

API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	return mem_alloc(dptr, bytes, stream_dev(s));
}

API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	return cuMemAllocAsync(dptr, bytes, s);
}

API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	(void)s;
	return mem_free(dptr);
}

API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	return cuMemFreeAsync(dptr, s);
}

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	*pool = &defpool[d];
	return CUDA_SUCCESS;
}

API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    bad_dev(props->location.id))
		return CUDA_ERROR_INVALID_VALUE;
	struct CUmemPoolHandle_st *p = malloc(sizeof(*p));
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->dev = props->location.id;
	*pool = p;
	return CUDA_SUCCESS;
}

API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	if (pool >= &defpool[0] && pool < &defpool[MAX_DEV])
		return CUDA_ERROR_INVALID_VALUE;
	free(pool);
	return CUDA_SUCCESS;
}

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
				     CUmemoryPool pool, CUstream s)
{
	(void)s;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	return mem_alloc(dptr, bytes, pool->dev);
}

API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
					  CUmemoryPool pool, CUstream s)
{
	return cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
}

/* ---- arrays: element size x channels x extent, like the interposer ---- */

static size_t fmt_bytes(int f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT: return 4;
	default: return 0;
	}
}

static CUresult array_new(void **mem, size_t *out, size_t bytes, int *devp)
{
	int dev = cur_dev();
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (take(dev, bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*mem = host_map(bytes);
	if (!*mem) {
		unuse(dev, bytes);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = bytes;
	*devp = dev;
	return CUDA_SUCCESS;
}

static size_t ext(size_t v)
{
	return v ? v : 1;
}

static CUresult array3d(CUarray *a, size_t w, size_t h, size_t d, int fmt, unsigned ch)
{
	if (!a || !w || !fmt_bytes(fmt) || (ch != 1 && ch != 2 && ch != 4))
		return CUDA_ERROR_INVALID_VALUE;
	struct CUarray_st *x = malloc(sizeof(*x));
	if (!x)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = array_new(&x->mem, &x->bytes, w * ext(h) * ext(d) * fmt_bytes(fmt) * ch,
			       &x->dev);
	if (r != CUDA_SUCCESS) {
		free(x);
		return r;
	}
	*a = x;
	return CUDA_SUCCESS;
}

API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	if (!desc)
		return CUDA_ERROR_INVALID_VALUE;
	return array3d(a, desc->Width, desc->Height, 0, desc->Format, desc->NumChannels);
}

API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	if (!desc)
		return CUDA_ERROR_INVALID_VALUE;
	return array3d(a, desc->Width, desc->Height, desc->Depth, desc->Format,
		       desc->NumChannels);
}

API CUresult cuArrayDestroy(CUarray a)
{
	if (!a)
		return CUDA_ERROR_INVALID_HANDLE;
	munmap(a->mem, a->bytes);
	unuse(a->dev, a->bytes);
	free(a);
	return CUDA_SUCCESS;
}

API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *desc,
				    unsigned int levels)
{
	if (!m || !desc || !levels || !desc->Width || !fmt_bytes(desc->Format))
		return CUDA_ERROR_INVALID_VALUE;
	size_t w = desc->Width, h = ext(desc->Height), d = ext(desc->Depth), bytes = 0;
	for (unsigned int i = 0; i < levels; i++) {
		bytes += w * h * d * fmt_bytes(desc->Format) * desc->NumChannels;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : 1;
		d = d > 1 ? d / 2 : 1;
	}
	struct CUmipmappedArray_st *x = malloc(sizeof(*x));
	if (!x)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = array_new(&x->mem, &x->bytes, bytes, &x->dev);
	if (r != CUDA_SUCCESS) {
		free(x);
		return r;
	}
	*m = x;
	return CUDA_SUCCESS;
}

API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	munmap(m->mem, m->bytes);
	unuse(m->dev, m->bytes);
	free(m);
	return CUDA_SUCCESS;
}
