// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's virtual memory management (see fake_cuda.c):
 * physical allocations, address ranges, mappings.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

#define GRANULARITY (2u << 20)

/*
 * A physical VMM allocation: a memfd the mappings share.  As with the real
 * driver, its memory stays in use (counted in used[]) until it is released
 * and its last mapping is unmapped.
 */
struct vmm { int fd; size_t bytes; int dev; int maps; int released; };

/* A mapping of a VMM allocation (cuMemMap), for cuMemUnmap. */
struct vmap { uintptr_t va; size_t size; struct vmm *v; struct vmap *next; };
static struct vmap *vmaps;

/* ---- virtual memory management ---- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   int option)
{
	(void)option;
	if (!g || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	*g = GRANULARITY;
	return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!h || !prop || flags || bytes == 0 || bytes % GRANULARITY ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || bad_dev(prop->location.id))
		return CUDA_ERROR_INVALID_VALUE;
	int dev = prop->location.id;
	if (take(dev, bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct vmm *v = malloc(sizeof(*v));
	int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
	if (!v || fd < 0 || ftruncate(fd, (off_t)bytes)) {
		free(v);
		if (fd >= 0)
			close(fd);
		unuse(dev, bytes);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	v->fd = fd;
	v->bytes = bytes;
	v->dev = dev;
	v->maps = 0;
	v->released = 0;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)v;
	return CUDA_SUCCESS;
}

/* Under the lock: free @v's memory once it is released and unmapped. */
static void vmm_put(struct vmm *v)
{
	if (!v->released || v->maps)
		return;
	close(v->fd);
	unuse(v->dev, v->bytes);
	free(v);
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct vmm *v = (struct vmm *)(uintptr_t)h;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	if (v->released) {
		pthread_mutex_unlock(&lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	v->released = 1;
	vmm_put(v);
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
				 CUdeviceptr addr, unsigned long long flags)
{
	(void)align;
	(void)addr;
	(void)flags;
	if (!ptr || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	return munmap((void *)(uintptr_t)ptr, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct vmm *v = (struct vmm *)(uintptr_t)h;
	if (!v || v->released || flags || !size || offset + size > v->bytes)
		return CUDA_ERROR_INVALID_VALUE;
	struct vmap *m = malloc(sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *p = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
	if (p == MAP_FAILED) {
		free(m);
		return CUDA_ERROR_INVALID_VALUE;
	}
	m->va = (uintptr_t)ptr;
	m->size = size;
	m->v = v;
	pthread_mutex_lock(&lock);
	v->maps++;
	m->next = vmaps;
	vmaps = m;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/*
 * As the real driver: the range must cover whole mappings (a part of one
 * is refused).  A range that maps nothing is accepted.  The memory of a
 * released allocation goes with its last mapping.
 */
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	uintptr_t a = (uintptr_t)ptr, b = a + size;
	struct vmap **pp, *m;

	if (!ptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (m = vmaps; m; m = m->next) {
		if (m->va < b && a < m->va + m->size && (m->va < a || m->va + m->size > b)) {
			pthread_mutex_unlock(&lock);
			return CUDA_ERROR_INVALID_VALUE;
		}
	}
	void *p = mmap((void *)a, size, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	if (p == MAP_FAILED) {
		pthread_mutex_unlock(&lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (pp = &vmaps; (m = *pp);) {
		if (m->va >= a && m->va + m->size <= b) {
			*pp = m->next;
			m->v->maps--;
			vmm_put(m->v);
			free(m);
		} else {
			pp = &m->next;
		}
	}
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
			    size_t count)
{
	(void)ptr;
	(void)size;
	return desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
