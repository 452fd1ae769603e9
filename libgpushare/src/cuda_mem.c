// SPDX-License-Identifier: Apache-2.0
/*
 * Linear memory (cuMemAlloc, pitched, managed, cuMemFree) and the memory
 * views (cuMemGetInfo, cuDeviceTotalMem), which report the quota.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_abi.h"
#include "cuda_account.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "env.h"
#include "ledger.h"
#include "table.h"

/* ---- linear memory ---- */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

CUresult w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	bool counted;
	int dev = gs_current_device();
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(alloc_fn, cuMemAlloc_v2, dptr, bytes);
	gs_alloc_settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemAlloc_v2, w_cuMemAlloc_v2);

typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);

/*
 * The pitch is the driver's choice: reserve width rounded up to 512 bytes
 * per row (what drivers use), then settle on pitch x height once known.
 */
CUresult w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
			      size_t height, unsigned int elemsize)
{
	bool counted;
	int dev = gs_current_device();
	uint64_t guess = 0, real_bytes;

	if (width <= SIZE_MAX - 511 && (!height || ((width + 511) & ~(size_t)511) <= UINT64_MAX / height))
		guess = (uint64_t)((width + 511) & ~(size_t)511) * height;
	CUresult r = gs_alloc_admit(dev, guess, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(pitch_fn, cuMemAllocPitch_v2, dptr, pitch, width, height, elemsize);
	if (r != CUDA_SUCCESS || !counted) {
		gs_alloc_settle(r, counted, GS_KIND_MEM, 0, dev, guess);
		return r;
	}
	real_bytes = (uint64_t)*pitch * height;
	if (real_bytes > guess && gs_ledger_reserve(dev, real_bytes - guess)) {
		REAL(free_fn, cuMemFree_v2, *dptr);
		gs_ledger_release(dev, guess);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (real_bytes < guess)
		gs_ledger_release(dev, guess - real_bytes);
	gs_alloc_settle(r, counted, GS_KIND_MEM, *dptr, dev, real_bytes);
	return r;
}
EXPORT_AS(cuMemAllocPitch_v2, w_cuMemAllocPitch_v2);

CUresult w_cuMemFree_v2(CUdeviceptr dptr)
{
	return FREE_RECORDED(GS_KIND_MEM, dptr, REAL(free_fn, cuMemFree_v2, dptr));
}
EXPORT_AS(cuMemFree_v2, w_cuMemFree_v2);

static bool allow_managed(void)
{
	return gs_env_true(getenv("GPUSHARE_ALLOW_MANAGED"));
}

typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned int);

/*
 * Managed memory is paged in on demand and can be oversubscribed: a quota
 * cannot hold it.  Refused on a device with a quota, unless allowed, and
 * then counted at its full size on the current device.
 */
CUresult w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
	static atomic_flag said = ATOMIC_FLAG_INIT;
	bool counted;
	uint64_t q;
	int dev = gs_current_device();

	if (dev >= 0 && gs_ledger_mode() != GS_LEDGER_OFF) {
		gs_cuda_attach(dev);
		/* A refused device (ledger.h) gets admit's out-of-memory. */
		if (gs_ledger_quota(dev, &q) && !allow_managed() && !gs_ledger_refused(dev)) {
			if (!atomic_flag_test_and_set(&said))
				fprintf(stderr, "gpushare: cuMemAllocManaged refused: managed memory "
					"can outgrow the GPU memory quota; set "
					"GPUSHARE_ALLOW_MANAGED=1 to allow it (counted at its full "
					"size against the quota)\n");
			return CUDA_ERROR_NOT_SUPPORTED;
		}
	}
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(managed_fn, cuMemAllocManaged, dptr, bytes, flags);
	gs_alloc_settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemAllocManaged, w_cuMemAllocManaged);

/* ---- views ---- */

typedef CUresult (*info_fn)(size_t *, size_t *);

CUresult w_cuMemGetInfo_v2(size_t *free_, size_t *total)
{
	uint64_t q, u;
	CUresult r = REAL(info_fn, cuMemGetInfo_v2, free_, total);
	int dev = r == CUDA_SUCCESS ? gs_current_device() : -1;

	if (dev < 0)
		return r;
	gs_cuda_attach(dev);
	if (!free_ || !total || !gs_ledger_view(dev, &q, &u))
		return r;
	uint64_t f = q > u ? q - u : 0;
	if (f < *free_)
		*free_ = (size_t)f;
	if (q < *total)
		*total = (size_t)q;
	return r;
}
EXPORT_AS(cuMemGetInfo_v2, w_cuMemGetInfo_v2);

typedef CUresult (*total_fn)(size_t *, CUdevice);

CUresult w_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	uint64_t q;
	CUresult r = REAL(total_fn, cuDeviceTotalMem_v2, bytes, dev);

	if (r != CUDA_SUCCESS || !bytes)
		return r;
	gs_cuda_attach(dev);
	if (gs_ledger_quota(dev, &q) && q < *bytes)
		*bytes = (size_t)q;
	return r;
}
EXPORT_AS(cuDeviceTotalMem_v2, w_cuDeviceTotalMem_v2);
