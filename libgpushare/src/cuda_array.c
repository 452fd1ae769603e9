// SPDX-License-Identifier: Apache-2.0
/* Arrays and mipmapped arrays: counted at an estimate from the descriptor. */
#include <stdbool.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "cuda_account.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "table.h"

/*
 * Bytes per channel of a CUarray_format: the classic formats exactly;
 * any other (normalised, block-compressed, video) at 4, the largest of the
 * classic ones, so the estimate errs high rather than low.
 */
static uint64_t format_bytes(int format)
{
	switch (format) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	default:
		return 4;
	}
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* width x height x depth (0 counted as 1) x channels x bytes per channel. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned int channels)
{
	uint64_t b = mul_sat(format_bytes(format), channels ? channels : 1);
	b = mul_sat(b, w ? w : 1);
	b = mul_sat(b, h ? h : 1);
	return mul_sat(b, d ? d : 1);
}

/* A mipmapped array: every level, each dimension halved (down to 1). */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
	size_t w = desc->Width, h = desc->Height, d = desc->Depth;
	uint64_t total = 0;

	for (unsigned int i = 0; i < levels && i < 64; i++) {
		uint64_t b = array_bytes(w, h, d, desc->Format, desc->NumChannels);
		total = total > UINT64_MAX - b ? UINT64_MAX : total + b;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		d = d > 1 ? d / 2 : d;
	}
	return total;
}

typedef CUresult (*array_fn)(CUarray *, const void *);

static CUresult make_array(enum gs_fn fn, CUarray *a, const void *desc, uint64_t bytes)
{
	bool counted;
	int dev = gs_current_device();
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	array_fn f = (array_fn)gs_driver_fn(fn);
	r = f ? f(a, desc) : CUDA_ERROR_NOT_FOUND;
	gs_alloc_settle(r, counted, GS_KIND_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0,
			dev, bytes);
	return r;
}

CUresult w_cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 0, desc->Format,
					    desc->NumChannels) : 0;
	return make_array(GS_FN_cuArrayCreate_v2, a, desc, bytes);
}
EXPORT_AS(cuArrayCreate_v2, w_cuArrayCreate_v2);

CUresult w_cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth,
					    desc->Format, desc->NumChannels) : 0;
	return make_array(GS_FN_cuArray3DCreate_v2, a, desc, bytes);
}
EXPORT_AS(cuArray3DCreate_v2, w_cuArray3DCreate_v2);

typedef CUresult (*array_destroy_fn)(CUarray);

CUresult w_cuArrayDestroy(CUarray a)
{
	return FREE_RECORDED(GS_KIND_ARRAY, (uint64_t)(uintptr_t)a,
			     REAL(array_destroy_fn, cuArrayDestroy, a));
}
EXPORT_AS(cuArrayDestroy, w_cuArrayDestroy);

typedef CUresult (*mipmap_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
			      unsigned int);

CUresult w_cuMipmappedArrayCreate(CUmipmappedArray *m,
				  const CUDA_ARRAY3D_DESCRIPTOR *desc,
				  unsigned int levels)
{
	bool counted;
	int dev = gs_current_device();
	uint64_t bytes = desc ? mipmap_bytes(desc, levels) : 0;
	CUresult r = gs_alloc_admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(mipmap_fn, cuMipmappedArrayCreate, m, desc, levels);
	gs_alloc_settle(r, counted, GS_KIND_MIPMAP, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*m : 0,
			dev, bytes);
	return r;
}
EXPORT_AS(cuMipmappedArrayCreate, w_cuMipmappedArrayCreate);

typedef CUresult (*mipmap_destroy_fn)(CUmipmappedArray);

CUresult w_cuMipmappedArrayDestroy(CUmipmappedArray m)
{
	return FREE_RECORDED(GS_KIND_MIPMAP, (uint64_t)(uintptr_t)m,
			     REAL(mipmap_destroy_fn, cuMipmappedArrayDestroy, m));
}
EXPORT_AS(cuMipmappedArrayDestroy, w_cuMipmappedArrayDestroy);
