// SPDX-License-Identifier: Apache-2.0
/*
 * Lookups: how calls get to the wrappers.  Programs linked against libcuda
 * call our exports (we are preloaded, so found first).  But the CUDA
 * runtime and most bindings dlopen libcuda, take cuGetProcAddress from it
 * with dlsym, and get every other entry point through it; dlsym on
 * libcuda's handle never searches preloaded libraries.  So we wrap dlsym
 * (libcuda's handle and a name we wrap -> our wrapper) and both
 * cuGetProcAddress forms (the driver's answer, replaced by our wrapper
 * when the (name, version, flags) means an entry point we wrap: lookup.c),
 * including the lookups of cuGetProcAddress itself.  The real driver is
 * reached through the C library's dlsym on dlopen("libcuda.so.1")
 * (cuda_driver.c).
 */
#include <dlfcn.h>
#include <link.h>

#include "cuda_abi.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "interpose.h"
#include "lookup.h"

static CUresult w_cuGetProcAddress(const char *, void **, int, cuuint64_t);
static CUresult w_cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
				      CUdriverProcAddressQueryResult *);

/* Our wrapper for each wrapped entry point. */
static void *const wrappers[GS_FN_COUNT] = {
#define W(x) [GS_FN_##x] = (void *)w_##x
	W(cuGetProcAddress),
	W(cuGetProcAddress_v2),
	W(cuMemAlloc_v2),
	W(cuMemAllocPitch_v2),
	W(cuMemFree_v2),
	W(cuMemGetInfo_v2),
	W(cuDeviceTotalMem_v2),
	W(cuDeviceGetUuid),
	W(cuDeviceGetUuid_v2),
	W(cuMemAllocManaged),
	W(cuMemAllocAsync),
	W(cuMemAllocAsync_ptsz),
	W(cuMemAllocFromPoolAsync),
	W(cuMemAllocFromPoolAsync_ptsz),
	W(cuMemFreeAsync),
	W(cuMemFreeAsync_ptsz),
	W(cuMemPoolCreate),
	W(cuMemPoolDestroy),
	W(cuMemCreate),
	W(cuMemRelease),
	W(cuMemMap),
	W(cuMemUnmap),
	W(cuArrayCreate_v2),
	W(cuArray3DCreate_v2),
	W(cuArrayDestroy),
	W(cuMipmappedArrayCreate),
	W(cuMipmappedArrayDestroy),
	W(cuLaunchKernel),
	W(cuLaunchKernel_ptsz),
	W(cuLaunchKernelEx),
	W(cuLaunchKernelEx_ptsz),
	W(cuLaunchCooperativeKernel),
	W(cuLaunchCooperativeKernel_ptsz),
	W(cuLaunchCooperativeKernelMultiDevice),
	W(cuGraphLaunch),
	W(cuGraphLaunch_ptsz),
	W(cuLaunchHostFunc),
	W(cuLaunchHostFunc_ptsz),
#undef W
};

/*
 * The driver found @*pfn for (@name, @version, @flags): hand out our
 * wrapper instead when it is an entry point we wrap.  Should the driver
 * not export that entry point under its name, its pointer from here is
 * the one the wrapper calls.
 */
static void substitute(const char *name, void **pfn, int version, cuuint64_t flags)
{
	int fn = gs_fn_lookup(name, version, flags);

	if (fn < 0 || !pfn || !*pfn || *pfn == wrappers[fn])
		return;
	gs_driver_adopt(fn, *pfn);
	*pfn = wrappers[fn];
}

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*getproc_v2_fn)(const char *, void **, int, cuuint64_t,
				  CUdriverProcAddressQueryResult *);

static CUresult w_cuGetProcAddress(const char *name, void **pfn, int version,
				   cuuint64_t flags)
{
	CUresult r = REAL(getproc_fn, cuGetProcAddress, name, pfn, version, flags);
	if (r == CUDA_SUCCESS)
		substitute(name, pfn, version, flags);
	return r;
}

static CUresult w_cuGetProcAddress_v2(const char *name, void **pfn, int version,
				      cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	CUresult r = REAL(getproc_v2_fn, cuGetProcAddress_v2, name, pfn, version, flags, status);
	if (r == CUDA_SUCCESS)
		substitute(name, pfn, version, flags);
	return r;
}

#ifndef GPUSHARE_NO_LOOKUP_WRAPPERS
EXPORT_AS(cuGetProcAddress, w_cuGetProcAddress);
EXPORT_AS(cuGetProcAddress_v2, w_cuGetProcAddress_v2);

/* libcuda's handle, or NULL when the process has not loaded it (asked
 * without loading it). */
static void *loaded_driver(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (h)
		dlclose(h);
	return h;
}

/*
 * RTLD_NEXT means "after the caller", and the caller is now us: search the
 * objects after the caller's ourselves, in load order, for the first that
 * defines @name itself.
 */
static void *next_after(const void *caller, const char *name)
{
	Dl_info info;
	struct link_map *lm = NULL, *def;

	if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
		return gs_real_dlsym(RTLD_NEXT, name);
	for (struct link_map *l = lm->l_next; l; l = l->l_next) {
		/* A handle proper (a link map is one only once opened); the
		 * vDSO has no file to open, and defines nothing one asks for. */
		void *h = l->l_name && *l->l_name ? dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD) : NULL;
		if (!h)
			continue;
		void *p = gs_real_dlsym(h, name);
		dlclose(h);
		if (p && dladdr1(p, &info, (void **)&def, RTLD_DL_LINKMAP) && def == l)
			return p;
	}
	return NULL;
}

EXPORT void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT)
		return next_after(__builtin_return_address(0), name);
	void *p = gs_real_dlsym(handle, name);
	int fn = gs_fn_by_symbol(name);
	if (fn >= 0) {
		/*
		 * RTLD_DEFAULT finds our own export first.  In a program that has
		 * not loaded the driver (one asking whether CUDA is there), answer
		 * as the C library would without us (the objects after ours), and
		 * do not load the driver into it.
		 */
		if (handle == RTLD_DEFAULT && p == wrappers[fn] && !loaded_driver())
			return gs_real_dlsym(RTLD_NEXT, name);
		if (p && (handle == RTLD_DEFAULT || handle == loaded_driver())) {
			if (!gs_driver_fn(fn))	/* loads the driver; keeps what it had */
				return p;
			return wrappers[fn];
		}
		return p;
	}
	if (gs_nvml_dlsym) {
		void *w = gs_nvml_dlsym(handle, name, p);
		if (w)
			return w;
	}
	return p;
}
#endif
