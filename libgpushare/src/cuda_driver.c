// SPDX-License-Identifier: Apache-2.0
/*
 * The real driver and its devices (cuda_driver.h): the C library's dlsym,
 * libcuda.so.1 and the entry points the wrappers call, the device of a
 * call, and the UUID wrappers, which tell the ledger which device is which.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "cuda_abi.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "interpose.h"
#include "ledger.h"
#include "lookup.h"

#define MAX_DEVICES 64

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym_ptr;

void *gs_real_dlsym(void *handle, const char *name)
{
	dlsym_fn f = atomic_load(&real_dlsym_ptr);
	if (!f) {
		/* dlvsym is not wrapped: it finds the C library's dlsym. */
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
#ifdef GS_GLIBC_BASE
		if (!f)	/* a C library older than 2.34: libdl's */
			f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", GS_GLIBC_BASE);
#endif
		if (!f)
			return NULL;
		atomic_store(&real_dlsym_ptr, f);
	}
	return f(handle, name);
}

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static void *driver;				/* libcuda.so.1 */
static void *_Atomic real[GS_FN_COUNT];		/* the driver's wrapped entry points */

/* Entry points we call but do not wrap. */
static CUresult (*real_cuCtxGetDevice)(CUdevice *);
static CUresult (*real_cuStreamGetDevice)(CUstream, CUdevice *);
static CUresult (*real_cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
static CUresult (*real_cuDeviceGetCount)(int *);

static void load_driver(void)
{
	driver = dlopen("libcuda.so.1", RTLD_NOW);
	if (!driver)
		return;
	for (int i = 0; i < GS_FN_COUNT; i++)
		atomic_store(&real[i], gs_real_dlsym(driver, gs_fn_symbol(i)));
	real_cuCtxGetDevice = gs_real_dlsym(driver, "cuCtxGetDevice");
	real_cuStreamGetDevice = gs_real_dlsym(driver, "cuStreamGetDevice");
	real_cuDeviceGetDefaultMemPool = gs_real_dlsym(driver, "cuDeviceGetDefaultMemPool");
	real_cuDeviceGetCount = gs_real_dlsym(driver, "cuDeviceGetCount");
}

void *gs_driver_fn(enum gs_fn fn)
{
	pthread_once(&driver_once, load_driver);
	return atomic_load(&real[fn]);
}

void gs_driver_adopt(enum gs_fn fn, void *p)
{
	void *none = NULL;

	atomic_compare_exchange_strong(&real[fn], &none, p);
}

void *gs_driver_sym(const char *name)
{
	pthread_once(&driver_once, load_driver);
	return driver ? gs_real_dlsym(driver, name) : NULL;
}

/* ---- devices ---- */

static _Atomic bool attached[MAX_DEVICES];

typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);

/* The driver's cuDeviceGetUuid @fn; a UUID read tells the ledger, once. */
static CUresult get_uuid(enum gs_fn fn, CUuuid *uuid, CUdevice dev)
{
	uuid_fn f = (uuid_fn)gs_driver_fn(fn);
	CUresult r = f ? f(uuid, dev) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_DEVICES && !atomic_load(&attached[dev])) {
		gs_ledger_attach(dev, uuid->bytes);
		atomic_store(&attached[dev], true);
	}
	return r;
}

void gs_cuda_attach(int dev)
{
	CUuuid u;

	if (dev < 0 || dev >= MAX_DEVICES || atomic_load(&attached[dev]))
		return;
	get_uuid(gs_driver_fn(GS_FN_cuDeviceGetUuid_v2) ? GS_FN_cuDeviceGetUuid_v2 :
		 GS_FN_cuDeviceGetUuid, &u, dev);
}

int gs_current_device(void)
{
	CUdevice d;

	pthread_once(&driver_once, load_driver);
	if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS)
		return -1;
	return d;
}

int gs_stream_device(CUstream s)
{
	CUdevice d;

	pthread_once(&driver_once, load_driver);
	if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD &&
	    real_cuStreamGetDevice && real_cuStreamGetDevice(s, &d) == CUDA_SUCCESS)
		return d;
	return gs_current_device();
}

int gs_default_pool_device(CUmemoryPool pool)
{
	int n;
	CUmemoryPool p;

	pthread_once(&driver_once, load_driver);
	if (real_cuDeviceGetDefaultMemPool && real_cuDeviceGetCount &&
	    real_cuDeviceGetCount(&n) == CUDA_SUCCESS) {
		for (int d = 0; d < n; d++)
			if (real_cuDeviceGetDefaultMemPool(&p, d) == CUDA_SUCCESS && p == pool)
				return d;
	}
	return -1;
}

CUresult w_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	return get_uuid(GS_FN_cuDeviceGetUuid, uuid, dev);
}
EXPORT_AS(cuDeviceGetUuid, w_cuDeviceGetUuid);

CUresult w_cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	return get_uuid(GS_FN_cuDeviceGetUuid_v2, uuid, dev);
}
EXPORT_AS(cuDeviceGetUuid_v2, w_cuDeviceGetUuid_v2);
