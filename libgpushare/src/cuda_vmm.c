// SPDX-License-Identifier: Apache-2.0
/*
 * Virtual memory management.
 *
 * Counted at cuMemCreate.  The driver keeps the memory until the handle is
 * released AND its last mapping is unmapped (create, map, release at once,
 * use, unmap is the usual order), so the reservation stays as long: the
 * table counts each handle's mappings (table.h), cuMemRelease marks it
 * released, and the bytes go when both are done.  A mapping of a handle not
 * in the table (not counted), and an unmap of a range with no mapping
 * recorded, pass through.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_abi.h"
#include "cuda_account.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "ledger.h"
#include "table.h"

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t,
			      const CUmemAllocationProp *, unsigned long long);

CUresult w_cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
		       const CUmemAllocationProp *prop, unsigned long long flags)
{
	bool counted;
	int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ?
		  prop->location.id : -1;
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(create_fn, cuMemCreate, h, bytes, prop, flags);
	gs_alloc_settle(r, counted, GS_KIND_VMM, r == CUDA_SUCCESS ? *h : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemCreate, w_cuMemCreate);

/* Drop a hold on a VMM entry; release its bytes if it was the last. */
static void vmm_drop(struct gs_node *hold)
{
	int dev;
	uint64_t bytes;

	if (gs_vmm_drop(&gs_alloc_table, hold, &dev, &bytes))
		gs_ledger_release(dev, bytes);
}

typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

/*
 * The handle leaves the table before the driver is called (the driver may
 * hand its value out again at once); its bytes stay held by its mappings.
 * A refusal with the handle still there puts it back; CUDA_ERROR_INVALID_VALUE
 * (no such handle: released behind our back) does not.
 */
CUresult w_cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct gs_node *hold = gs_vmm_release(&gs_alloc_table, h);
	CUresult r = REAL(release_fn, cuMemRelease, h);
	if (!hold)
		return r;
	if (r == CUDA_SUCCESS || gs_alloc_gone(r, GS_KIND_VMM))
		vmm_drop(hold);
	else
		gs_vmm_unrelease(&gs_alloc_table, hold);
	return r;
}
EXPORT_AS(cuMemRelease, w_cuMemRelease);

typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			   unsigned long long);

/* The handle is held across the call, so a release meanwhile keeps its bytes. */
CUresult w_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
		    CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct gs_node *hold = gs_vmm_hold(&gs_alloc_table, h);
	CUresult r = REAL(map_fn, cuMemMap, ptr, size, offset, h, flags);
	if (!hold)
		return r;
	if (r != CUDA_SUCCESS)
		vmm_drop(hold);
	else if (gs_vmm_mapped(&gs_alloc_table, hold, ptr, size))
		/* The hold stays: the bytes stay reserved (a leak of quota,
		 * never an overrun) until the process exits. */
		fprintf(stderr, "gpushare: out of memory recording a mapping\n");
	return r;
}
EXPORT_AS(cuMemMap, w_cuMemMap);

typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);

/*
 * The mappings in the range are marked before the driver is called and
 * forgotten only if it unmapped them (a mapping made at the same address
 * right after is another's).  A handle released, whose last mapping this
 * was, gives its bytes back.
 */
CUresult w_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	uint64_t token = gs_vmm_unmap_begin(&gs_alloc_table, ptr, size);
	CUresult r = REAL(unmap_fn, cuMemUnmap, ptr, size);
	gs_vmm_unmap_end(&gs_alloc_table, token, r == CUDA_SUCCESS, gs_ledger_release);
	return r;
}
EXPORT_AS(cuMemUnmap, w_cuMemUnmap);
