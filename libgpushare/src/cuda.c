// SPDX-License-Identifier: Apache-2.0
/*
 * The CUDA driver API interposer: every way to allocate device memory, and
 * its free, goes through the ledger; the memory views report the quota.
 *
 * How calls get here.  Programs linked against libcuda call our exports
 * (we are preloaded, so found first).  But the CUDA runtime and most
 * bindings dlopen libcuda, take cuGetProcAddress from it with dlsym, and
 * get every other entry point through it; dlsym on libcuda's handle never
 * searches preloaded libraries.  So we wrap dlsym (libcuda's handle and a
 * name we wrap -> our wrapper) and both cuGetProcAddress forms (the
 * driver's answer, replaced by our wrapper when the (name, version, flags)
 * means an entry point we wrap: lookup.c), including the lookups of
 * cuGetProcAddress itself.  The real driver is reached through the C
 * library's dlsym on dlopen("libcuda.so.1").
 *
 * Accounting.  An allocation reserves its bytes in the ledger before the
 * driver is called (over the quota: CUDA_ERROR_OUT_OF_MEMORY, the driver is
 * not called, nothing is reserved), releases them if the driver fails, and
 * is recorded (handle -> device, bytes) so that its free releases exactly
 * that.  A device is the current context's (cuCtxGetDevice), or the
 * stream's, pool's or allocation property's where the call names one.
 * Choices (README.md): async frees release when cuMemFreeAsync is called;
 * arrays count an estimate from their descriptor; managed memory is
 * refused unless GPUSHARE_ALLOW_MANAGED=1; after fork the child's table
 * starts empty; VMM memory is held until released and unmapped.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "env.h"
#include "interpose.h"
#include "ledger.h"
#include "lookup.h"
#include "sched_gate.h"
#include "table.h"

#define EXPORT __attribute__((visibility("default")))
/* Export @name as the wrapper @impl (a static function of this file). */
#define EXPORT_AS(name, impl) \
	extern __typeof__(impl) name __attribute__((alias(#impl), visibility("default")))

#define MAX_DEVICES 64

/* ---- the real dlsym and the real driver ---- */

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

/* The driver's @fn, or NULL (no driver, or it lacks the entry point). */
static void *driver_fn(enum gs_fn fn)
{
	pthread_once(&driver_once, load_driver);
	return atomic_load(&real[fn]);
}

void *gs_driver_sym(const char *name)
{
	pthread_once(&driver_once, load_driver);
	return driver ? gs_real_dlsym(driver, name) : NULL;
}

/* Call the driver's @fn as type @T; CUDA_ERROR_NOT_FOUND when it has none. */
#define REAL(T, fn, ...) \
	({ T _f = (T)driver_fn(GS_FN_##fn); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

/* ---- devices ---- */

static _Atomic bool attached[MAX_DEVICES];

typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);

/* The driver's cuDeviceGetUuid @fn; a UUID read tells the ledger, once. */
static CUresult get_uuid(enum gs_fn fn, CUuuid *uuid, CUdevice dev)
{
	uuid_fn f = (uuid_fn)driver_fn(fn);
	CUresult r = f ? f(uuid, dev) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_DEVICES && !atomic_load(&attached[dev])) {
		gs_ledger_attach(dev, uuid->bytes);
		atomic_store(&attached[dev], true);
	}
	return r;
}

/* Tell the ledger @dev's UUID, once. */
static void attach(int dev)
{
	CUuuid u;

	if (dev < 0 || dev >= MAX_DEVICES || atomic_load(&attached[dev]))
		return;
	get_uuid(driver_fn(GS_FN_cuDeviceGetUuid_v2) ? GS_FN_cuDeviceGetUuid_v2 :
		 GS_FN_cuDeviceGetUuid, &u, dev);
}

void gs_cuda_attach(int ordinal)
{
	attach(ordinal);
}

/* The current context's device, or -1 (no context: the driver will say). */
static int current_device(void)
{
	CUdevice d;

	pthread_once(&driver_once, load_driver);
	if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS)
		return -1;
	return d;
}

static int stream_device(CUstream s)
{
	CUdevice d;

	pthread_once(&driver_once, load_driver);
	if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD &&
	    real_cuStreamGetDevice && real_cuStreamGetDevice(s, &d) == CUDA_SUCCESS)
		return d;
	return current_device();
}

/* ---- the allocation table and the ledger ---- */

static struct gs_table table = GS_TABLE_INIT;

static void cuda_child_after_fork(void)
{
	/* The parent's allocations are not the child's to free (ledger.c). */
	gs_table_forget_after_fork(&table);
}

__attribute__((constructor)) static void cuda_setup(void)
{
	pthread_atfork(NULL, NULL, cuda_child_after_fork);
}

/*
 * Before an allocation of @bytes on @dev: CUDA_SUCCESS (*counted says
 * whether the ledger holds a reservation for it) or CUDA_ERROR_OUT_OF_MEMORY.
 */
static CUresult admit(int dev, uint64_t bytes, bool *counted)
{
	*counted = false;
	if (dev < 0 || gs_ledger_mode() == GS_LEDGER_OFF)
		return CUDA_SUCCESS;
	attach(dev);
	if (gs_ledger_reserve(dev, bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*counted = true;
	return CUDA_SUCCESS;
}

/* After the driver answered @r: record the allocation, or give it back. */
static void settle(CUresult r, bool counted, enum gs_kind kind, uint64_t key, int dev,
		   uint64_t bytes)
{
	if (!counted)
		return;
	if (r != CUDA_SUCCESS) {
		gs_ledger_release(dev, bytes);
		return;
	}
	if (gs_table_put(&table, kind, key, dev, bytes))
		/* No memory for the record: the bytes stay reserved (a leak of
		 * quota, never an overrun) until the process exits. */
		fprintf(stderr, "gpushare: out of memory recording an allocation\n");
}

/*
 * The driver refused to free @key because it holds no such allocation any
 * more (freed behind our back: a double free racing with the allocation
 * that reused the address, a context destroyed).  Its record must go, or
 * its bytes would stay reserved for good.
 */
static bool gone(CUresult r, enum gs_kind kind)
{
	return r == CUDA_ERROR_INVALID_VALUE ||
	       (r == CUDA_ERROR_INVALID_HANDLE && (kind == GS_KIND_ARRAY || kind == GS_KIND_MIPMAP));
}

/*
 * After the free answered @r: release; or record it again if it failed
 * with the allocation still there.
 */
static void freed(CUresult r, bool had, enum gs_kind kind, uint64_t key, int dev,
		  uint64_t bytes)
{
	if (!had)
		return;
	if (r == CUDA_SUCCESS || gone(r, kind))
		gs_ledger_release(dev, bytes);
	else if (gs_table_put(&table, kind, key, dev, bytes))
		gs_ledger_release(dev, bytes);
}

/*
 * Free @key of @kind by evaluating @call (the driver's free), returning its
 * answer: the record goes before the call (the driver may hand the value
 * out again at once), freed() settles after it.
 */
#define FREE_RECORDED(kind, key, call) ({					\
	int _dev;								\
	uint64_t _bytes;							\
	bool _had = gs_table_take(&table, kind, key, &_dev, &_bytes);		\
	CUresult _r = (call);							\
	freed(_r, _had, kind, key, _dev, _bytes);				\
	_r; })

/* ---- linear memory ---- */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static CUresult w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	bool counted;
	int dev = current_device();
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(alloc_fn, cuMemAlloc_v2, dptr, bytes);
	settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemAlloc_v2, w_cuMemAlloc_v2);

typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);

/*
 * The pitch is the driver's choice: reserve width rounded up to 512 bytes
 * per row (what drivers use), then settle on pitch x height once known.
 */
static CUresult w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
				     size_t height, unsigned int elemsize)
{
	bool counted;
	int dev = current_device();
	uint64_t guess = 0, real_bytes;

	if (width <= SIZE_MAX - 511 && (!height || ((width + 511) & ~(size_t)511) <= UINT64_MAX / height))
		guess = (uint64_t)((width + 511) & ~(size_t)511) * height;
	CUresult r = admit(dev, guess, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(pitch_fn, cuMemAllocPitch_v2, dptr, pitch, width, height, elemsize);
	if (r != CUDA_SUCCESS || !counted) {
		settle(r, counted, GS_KIND_MEM, 0, dev, guess);
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
	settle(r, counted, GS_KIND_MEM, *dptr, dev, real_bytes);
	return r;
}
EXPORT_AS(cuMemAllocPitch_v2, w_cuMemAllocPitch_v2);

static CUresult w_cuMemFree_v2(CUdeviceptr dptr)
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
static CUresult w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
	static atomic_flag said = ATOMIC_FLAG_INIT;
	bool counted;
	uint64_t q;
	int dev = current_device();

	if (dev >= 0 && gs_ledger_mode() != GS_LEDGER_OFF) {
		attach(dev);
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
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(managed_fn, cuMemAllocManaged, dptr, bytes, flags);
	settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemAllocManaged, w_cuMemAllocManaged);

/* ---- views ---- */

typedef CUresult (*info_fn)(size_t *, size_t *);

static CUresult w_cuMemGetInfo_v2(size_t *free_, size_t *total)
{
	uint64_t q, u;
	CUresult r = REAL(info_fn, cuMemGetInfo_v2, free_, total);
	int dev = r == CUDA_SUCCESS ? current_device() : -1;

	if (dev < 0)
		return r;
	attach(dev);
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

static CUresult w_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	uint64_t q;
	CUresult r = REAL(total_fn, cuDeviceTotalMem_v2, bytes, dev);

	if (r != CUDA_SUCCESS || !bytes)
		return r;
	attach(dev);
	if (gs_ledger_quota(dev, &q) && q < *bytes)
		*bytes = (size_t)q;
	return r;
}
EXPORT_AS(cuDeviceTotalMem_v2, w_cuDeviceTotalMem_v2);

static CUresult w_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	return get_uuid(GS_FN_cuDeviceGetUuid, uuid, dev);
}
EXPORT_AS(cuDeviceGetUuid, w_cuDeviceGetUuid);

static CUresult w_cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	return get_uuid(GS_FN_cuDeviceGetUuid_v2, uuid, dev);
}
EXPORT_AS(cuDeviceGetUuid_v2, w_cuDeviceGetUuid_v2);

/* ---- stream-ordered allocation and pools ---- */

typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);

static CUresult alloc_async(enum gs_fn fn, CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	bool counted;
	int dev = stream_device(s);
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	async_fn f = (async_fn)driver_fn(fn);
	r = f ? f(dptr, bytes, s) : CUDA_ERROR_NOT_FOUND;
	settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}

static CUresult w_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	return alloc_async(GS_FN_cuMemAllocAsync, dptr, bytes, s);
}
EXPORT_AS(cuMemAllocAsync, w_cuMemAllocAsync);

static CUresult w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
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
	int dev, n;
	CUmemoryPool p;

	if (gs_table_get(&table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, &dev, NULL))
		return dev;
	pthread_once(&driver_once, load_driver);
	if (real_cuDeviceGetDefaultMemPool && real_cuDeviceGetCount &&
	    real_cuDeviceGetCount(&n) == CUDA_SUCCESS) {
		for (int d = 0; d < n; d++) {
			if (real_cuDeviceGetDefaultMemPool(&p, d) == CUDA_SUCCESS && p == pool) {
				gs_table_put(&table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, d, 0);
				return d;
			}
		}
	}
	return current_device();
}

typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_from_pool(enum gs_fn fn, CUdeviceptr *dptr, size_t bytes,
				CUmemoryPool pool, CUstream s)
{
	bool counted;
	int dev = pool ? pool_device(pool) : -1;
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	pool_alloc_fn f = (pool_alloc_fn)driver_fn(fn);
	r = f ? f(dptr, bytes, pool, s) : CUDA_ERROR_NOT_FOUND;
	settle(r, counted, GS_KIND_MEM, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
	return r;
}

static CUresult w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
					  CUmemoryPool pool, CUstream s)
{
	return alloc_from_pool(GS_FN_cuMemAllocFromPoolAsync, dptr, bytes, pool, s);
}
EXPORT_AS(cuMemAllocFromPoolAsync, w_cuMemAllocFromPoolAsync);

static CUresult w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
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
	free_async_fn f = (free_async_fn)driver_fn(fn);
	return FREE_RECORDED(GS_KIND_MEM, dptr, f ? f(dptr, s) : CUDA_ERROR_NOT_FOUND);
}

static CUresult w_cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
	return free_async(GS_FN_cuMemFreeAsync, dptr, s);
}
EXPORT_AS(cuMemFreeAsync, w_cuMemFreeAsync);

static CUresult w_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
	return free_async(GS_FN_cuMemFreeAsync_ptsz, dptr, s);
}
EXPORT_AS(cuMemFreeAsync_ptsz, w_cuMemFreeAsync_ptsz);

typedef CUresult (*pool_create_fn)(CUmemoryPool *, const CUmemPoolProps *);

static CUresult w_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	CUresult r = REAL(pool_create_fn, cuMemPoolCreate, pool, props);
	if (r == CUDA_SUCCESS && pool && props) {
		/* A pool of host memory is no device's: -1, not counted. */
		int dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ?
			  props->location.id : -1;
		gs_table_put(&table, GS_KIND_POOL, (uint64_t)(uintptr_t)*pool, dev, 0);
	}
	return r;
}
EXPORT_AS(cuMemPoolCreate, w_cuMemPoolCreate);

typedef CUresult (*pool_destroy_fn)(CUmemoryPool);

static CUresult w_cuMemPoolDestroy(CUmemoryPool pool)
{
	CUresult r = REAL(pool_destroy_fn, cuMemPoolDestroy, pool);
	if (r == CUDA_SUCCESS)
		gs_table_take(&table, GS_KIND_POOL, (uint64_t)(uintptr_t)pool, NULL, NULL);
	return r;
}
EXPORT_AS(cuMemPoolDestroy, w_cuMemPoolDestroy);

/*
 * ---- virtual memory management ----
 *
 * Counted at cuMemCreate.  The driver keeps the memory until the handle is
 * released AND its last mapping is unmapped (create, map, release at once,
 * use, unmap is the usual order), so the reservation stays as long: the
 * table counts each handle's mappings (table.h), cuMemRelease marks it
 * released, and the bytes go when both are done.  A mapping of a handle not
 * in the table (not counted), and an unmap of a range with no mapping
 * recorded, pass through.
 */

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t,
			      const CUmemAllocationProp *, unsigned long long);

static CUresult w_cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
			      const CUmemAllocationProp *prop, unsigned long long flags)
{
	bool counted;
	int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ?
		  prop->location.id : -1;
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(create_fn, cuMemCreate, h, bytes, prop, flags);
	settle(r, counted, GS_KIND_VMM, r == CUDA_SUCCESS ? *h : 0, dev, bytes);
	return r;
}
EXPORT_AS(cuMemCreate, w_cuMemCreate);

/* Drop a hold on a VMM entry; release its bytes if it was the last. */
static void vmm_drop(struct gs_node *hold)
{
	int dev;
	uint64_t bytes;

	if (gs_vmm_drop(&table, hold, &dev, &bytes))
		gs_ledger_release(dev, bytes);
}

typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

/*
 * The handle leaves the table before the driver is called (the driver may
 * hand its value out again at once); its bytes stay held by its mappings.
 * A refusal with the handle still there puts it back; CUDA_ERROR_INVALID_VALUE
 * (no such handle: released behind our back) does not.
 */
static CUresult w_cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct gs_node *hold = gs_vmm_release(&table, h);
	CUresult r = REAL(release_fn, cuMemRelease, h);
	if (!hold)
		return r;
	if (r == CUDA_SUCCESS || gone(r, GS_KIND_VMM))
		vmm_drop(hold);
	else
		gs_vmm_unrelease(&table, hold);
	return r;
}
EXPORT_AS(cuMemRelease, w_cuMemRelease);

typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			   unsigned long long);

/* The handle is held across the call, so a release meanwhile keeps its bytes. */
static CUresult w_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			   CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct gs_node *hold = gs_vmm_hold(&table, h);
	CUresult r = REAL(map_fn, cuMemMap, ptr, size, offset, h, flags);
	if (!hold)
		return r;
	if (r != CUDA_SUCCESS)
		vmm_drop(hold);
	else if (gs_vmm_mapped(&table, hold, ptr, size))
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
static CUresult w_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	uint64_t token = gs_vmm_unmap_begin(&table, ptr, size);
	CUresult r = REAL(unmap_fn, cuMemUnmap, ptr, size);
	gs_vmm_unmap_end(&table, token, r == CUDA_SUCCESS, gs_ledger_release);
	return r;
}
EXPORT_AS(cuMemUnmap, w_cuMemUnmap);

/* ---- arrays: counted at an estimate from the descriptor ---- */

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
	int dev = current_device();
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	array_fn f = (array_fn)driver_fn(fn);
	r = f ? f(a, desc) : CUDA_ERROR_NOT_FOUND;
	settle(r, counted, GS_KIND_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0, dev,
	       bytes);
	return r;
}

static CUresult w_cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 0, desc->Format,
					    desc->NumChannels) : 0;
	return make_array(GS_FN_cuArrayCreate_v2, a, desc, bytes);
}
EXPORT_AS(cuArrayCreate_v2, w_cuArrayCreate_v2);

static CUresult w_cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth,
					    desc->Format, desc->NumChannels) : 0;
	return make_array(GS_FN_cuArray3DCreate_v2, a, desc, bytes);
}
EXPORT_AS(cuArray3DCreate_v2, w_cuArray3DCreate_v2);

typedef CUresult (*array_destroy_fn)(CUarray);

static CUresult w_cuArrayDestroy(CUarray a)
{
	return FREE_RECORDED(GS_KIND_ARRAY, (uint64_t)(uintptr_t)a,
			     REAL(array_destroy_fn, cuArrayDestroy, a));
}
EXPORT_AS(cuArrayDestroy, w_cuArrayDestroy);

typedef CUresult (*mipmap_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
			      unsigned int);

static CUresult w_cuMipmappedArrayCreate(CUmipmappedArray *m,
					 const CUDA_ARRAY3D_DESCRIPTOR *desc,
					 unsigned int levels)
{
	bool counted;
	int dev = current_device();
	uint64_t bytes = desc ? mipmap_bytes(desc, levels) : 0;
	CUresult r = admit(dev, bytes, &counted);
	if (r != CUDA_SUCCESS)
		return r;
	r = REAL(mipmap_fn, cuMipmappedArrayCreate, m, desc, levels);
	settle(r, counted, GS_KIND_MIPMAP, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*m : 0,
	       dev, bytes);
	return r;
}
EXPORT_AS(cuMipmappedArrayCreate, w_cuMipmappedArrayCreate);

typedef CUresult (*mipmap_destroy_fn)(CUmipmappedArray);

static CUresult w_cuMipmappedArrayDestroy(CUmipmappedArray m)
{
	return FREE_RECORDED(GS_KIND_MIPMAP, (uint64_t)(uintptr_t)m,
			     REAL(mipmap_destroy_fn, cuMipmappedArrayDestroy, m));
}
EXPORT_AS(cuMipmappedArrayDestroy, w_cuMipmappedArrayDestroy);

/*
 * ---- launches: the compute gate (sched_gate.h) ----
 *
 * Every way to put work on a GPU's queue waits at the gate first, on the
 * stream it is for (a _ptsz entry point's stream 0 is the per-thread
 * default stream).  Only the calling thread is delayed: the work keeps its
 * order in its stream.  Legacy cuLaunch/cuLaunchGrid are not covered.
 */

static CUresult launch_kernel(enum gs_fn fn, bool pt, CUfunction f, unsigned int gx,
			      unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			      unsigned int bz, unsigned int shared, CUstream s, void **params,
			      void **extra)
{
	CUresult r = gs_sched_gate(-1, s, pt);
	if (r != CUDA_SUCCESS)
		return r;
	cuLaunchKernel_t real_fn = (cuLaunchKernel_t)driver_fn(fn);
	return real_fn ? real_fn(f, gx, gy, gz, bx, by, bz, shared, s, params, extra) :
			 CUDA_ERROR_NOT_FOUND;
}

static CUresult w_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
				 unsigned int gz, unsigned int bx, unsigned int by,
				 unsigned int bz, unsigned int shared, CUstream s,
				 void **params, void **extra)
{
	return launch_kernel(GS_FN_cuLaunchKernel, false, f, gx, gy, gz, bx, by, bz, shared, s,
			     params, extra);
}
EXPORT_AS(cuLaunchKernel, w_cuLaunchKernel);

static CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				      unsigned int gz, unsigned int bx, unsigned int by,
				      unsigned int bz, unsigned int shared, CUstream s,
				      void **params, void **extra)
{
	return launch_kernel(GS_FN_cuLaunchKernel_ptsz, true, f, gx, gy, gz, bx, by, bz, shared,
			     s, params, extra);
}
EXPORT_AS(cuLaunchKernel_ptsz, w_cuLaunchKernel_ptsz);

static CUresult launch_ex(enum gs_fn fn, bool pt, const CUlaunchConfig *config, CUfunction f,
			  void **params, void **extra)
{
	CUresult r = config ? gs_sched_gate(-1, config->hStream, pt) : CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)	/* (a NULL config: the driver refuses it) */
		return r;
	cuLaunchKernelEx_t real_fn = (cuLaunchKernelEx_t)driver_fn(fn);
	return real_fn ? real_fn(config, f, params, extra) : CUDA_ERROR_NOT_FOUND;
}

static CUresult w_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
				   void **extra)
{
	return launch_ex(GS_FN_cuLaunchKernelEx, false, config, f, params, extra);
}
EXPORT_AS(cuLaunchKernelEx, w_cuLaunchKernelEx);

static CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
					void **params, void **extra)
{
	return launch_ex(GS_FN_cuLaunchKernelEx_ptsz, true, config, f, params, extra);
}
EXPORT_AS(cuLaunchKernelEx_ptsz, w_cuLaunchKernelEx_ptsz);

static CUresult launch_coop(enum gs_fn fn, bool pt, CUfunction f, unsigned int gx,
			    unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			    unsigned int bz, unsigned int shared, CUstream s, void **params)
{
	CUresult r = gs_sched_gate(-1, s, pt);
	if (r != CUDA_SUCCESS)
		return r;
	cuLaunchCooperativeKernel_t real_fn = (cuLaunchCooperativeKernel_t)driver_fn(fn);
	return real_fn ? real_fn(f, gx, gy, gz, bx, by, bz, shared, s, params) :
			 CUDA_ERROR_NOT_FOUND;
}

static CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
					    unsigned int gz, unsigned int bx, unsigned int by,
					    unsigned int bz, unsigned int shared, CUstream s,
					    void **params)
{
	return launch_coop(GS_FN_cuLaunchCooperativeKernel, false, f, gx, gy, gz, bx, by, bz,
			   shared, s, params);
}
EXPORT_AS(cuLaunchCooperativeKernel, w_cuLaunchCooperativeKernel);

static CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
						 unsigned int gy, unsigned int gz,
						 unsigned int bx, unsigned int by,
						 unsigned int bz, unsigned int shared, CUstream s,
						 void **params)
{
	return launch_coop(GS_FN_cuLaunchCooperativeKernel_ptsz, true, f, gx, gy, gz, bx, by, bz,
			   shared, s, params);
}
EXPORT_AS(cuLaunchCooperativeKernel_ptsz, w_cuLaunchCooperativeKernel_ptsz);

/* One gate per listed launch, on its stream's device (in list order). */
static CUresult w_cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
						       unsigned int n, unsigned int flags)
{
	for (unsigned int i = 0; list && i < n; i++) {
		CUresult r = gs_sched_gate(stream_device(list[i].hStream), list[i].hStream, false);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return REAL(cuLaunchCooperativeKernelMultiDevice_t, cuLaunchCooperativeKernelMultiDevice,
		    list, n, flags);
}
EXPORT_AS(cuLaunchCooperativeKernelMultiDevice, w_cuLaunchCooperativeKernelMultiDevice);

/* A graph is gated as a whole; its time is measured on the GPU like any work. */
static CUresult w_cuGraphLaunch(CUgraphExec exec, CUstream s)
{
	CUresult r = gs_sched_gate(-1, s, false);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuGraphLaunch_t, cuGraphLaunch, exec, s);
}
EXPORT_AS(cuGraphLaunch, w_cuGraphLaunch);

static CUresult w_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
	CUresult r = gs_sched_gate(-1, s, true);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuGraphLaunch_t, cuGraphLaunch_ptsz, exec, s);
}
EXPORT_AS(cuGraphLaunch_ptsz, w_cuGraphLaunch_ptsz);

/* Gated like a kernel, so nothing queued after it can overtake what was gated. */
static CUresult w_cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data)
{
	CUresult r = gs_sched_gate(-1, s, false);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuLaunchHostFunc_t, cuLaunchHostFunc, s, fn, data);
}
EXPORT_AS(cuLaunchHostFunc, w_cuLaunchHostFunc);

static CUresult w_cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
	CUresult r = gs_sched_gate(-1, s, true);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuLaunchHostFunc_t, cuLaunchHostFunc_ptsz, s, fn, data);
}
EXPORT_AS(cuLaunchHostFunc_ptsz, w_cuLaunchHostFunc_ptsz);

/* ---- lookups: dlsym and cuGetProcAddress ---- */

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
	void *none = NULL;

	if (fn < 0 || !pfn || !*pfn || *pfn == wrappers[fn])
		return;
	atomic_compare_exchange_strong(&real[fn], &none, *pfn);
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
			if (!driver_fn(fn))	/* loads the driver; keeps what it had */
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
