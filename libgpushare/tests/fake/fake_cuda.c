// SPDX-License-Identifier: Apache-2.0
/*
 * A fake CUDA driver (libcuda.so.1) for the interposer's tests: "device"
 * memory is host memory, so programs can allocate, copy and free without a
 * GPU.  Configured by the environment:
 *
 *   FAKECUDA_DEVICES  number of devices (default 2, at most 8)
 *   FAKECUDA_MEMORY   bytes of memory per device (default 8 GiB); the fake
 *                     refuses allocations beyond it with OUT_OF_MEMORY, so a
 *                     test can tell a quota from the device's own limit
 *
 *   FAKECUDA_GPU_STATE     a file: the simulated GPU (below) is shared by
 *                          every process that names the same file (unset:
 *                          each process has its own)
 *   FAKECUDA_NS_PER_BLOCK  a kernel's duration per block (default 1000)
 *
 * The simulated GPU: every device runs one kernel at a time.  A kernel of
 * d = gridDimX * gridDimY * gridDimZ * NS_PER_BLOCK nanoseconds submitted
 * at t on stream S starts at max(t, S's last end, the device's busy-until)
 * and ends d later (CLOCK_MONOTONIC); submission returns at once, as the
 * real driver's does.  The device's busy-until lives in the shared file
 * (lock-free atomics), so kernels of several processes queue behind each
 * other.  Events take the time their stream's work ends (or now), and
 * every synchronisation sleeps until then: nothing spins.  Host functions
 * run on a worker thread when their stream reaches them, in order.  Graphs
 * run their kernel nodes as a sequence, in the order they were added (a
 * valid order of their dependencies).  A stream in capture appends its
 * launches to the graph and runs nothing; synchronising it invalidates the
 * capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as the real driver), and
 * an event recorded there cannot be queried or timed
 * (CUDA_ERROR_CAPTURED_EVENT).  Kernel functions are not loaded: any
 * non-NULL CUfunction runs, and cuModuleLoadData / cuModuleGetFunction
 * accept any image and name (bench/launch_loop.c loads its empty kernel).  fakecuda_busy_ns() (not CUDA) is this
 * process's kernel time submitted so far, for the tests' workload.
 *
 * With a shared file, each process also keeps a record there (fake_gpu.h)
 * of its contexts, its memory and the kernel time the device executed for
 * it (each kernel's [start, end), so work queued but not run yet is not
 * counted): the fake NVML's process list and per-process utilisation.
 *
 * Device i has the UUID bytes fa ce 00 .. 00 i, which NVML and
 * GPUSHARE_GPU_UUIDS write as "GPU-face0000-0000-0000-0000-0000000000ii"
 * (ii: i in two lowercase hex digits), e.g. device 1 is
 * GPU-face0000-0000-0000-0000-000000000001.
 *
 * VMM memory (cuMemCreate) stays in use, as on the real driver, until it is
 * released and its last mapping is unmapped; cuMemUnmap refuses a part of a
 * mapping, as the real driver does.
 *
 * Memory is mapped with MAP_NORESERVE, so a large allocation costs nothing
 * until it is touched.  Linked with -Bsymbolic: the pointers cuGetProcAddress
 * hands out are the fake's own functions, as the real driver's are, and never
 * an interposer's exports of the same name.
 *
 * cuGetProcAddress answers every name implemented here, resolving the
 * versioned name as the real driver does ("cuMemAlloc" asked at version
 * >= 3020 is cuMemAlloc_v2; with the per-thread flag, the _ptsz/_ptds
 * variant when there is one), and NULL with CUDA_ERROR_NOT_FOUND otherwise.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../src/cuda_abi.h"
#include "fake_gpu.h"

#define API __attribute__((visibility("default")))
#define MAX_DEV 8
#define GRANULARITY (2u << 20)

struct CUctx_st { int dev; int primary; };
struct CUmemPoolHandle_st { int dev; };
struct CUarray_st { void *mem; size_t bytes; int dev; };
struct CUmipmappedArray_st { void *mem; size_t bytes; int dev; };

/*
 * A physical VMM allocation: a memfd the mappings share.  As with the real
 * driver, its memory stays in use (counted in used[]) until it is released
 * and its last mapping is unmapped.
 */
struct vmm { int fd; size_t bytes; int dev; int maps; int released; };

/* A mapping of a VMM allocation (cuMemMap), for cuMemUnmap. */
struct vmap { uintptr_t va; size_t size; struct vmm *v; struct vmap *next; };
static struct vmap *vmaps;

static int ndev = 2;
static uint64_t devmem = 8ull << 30;
static _Atomic uint64_t used[MAX_DEV];
static struct CUctx_st primary[MAX_DEV];
static struct CUmemPoolHandle_st defpool[MAX_DEV];
static _Thread_local CUcontext current;
static int initialized;

/* Live allocations (pointer -> bytes, device), for cuMemFree and GetInfo. */
struct alloc { uintptr_t ptr; size_t bytes; int dev; struct alloc *next; };
static struct alloc *allocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void gpu_setup(void);
static void mem_note(int dev);
static void ctx_note(int dev);

__attribute__((constructor)) static void fake_setup(void)
{
	const char *s = getenv("FAKECUDA_DEVICES");
	if (s) {
		ndev = atoi(s);
		if (ndev < 0)
			ndev = 0;
		if (ndev > MAX_DEV)
			ndev = MAX_DEV;
	}
	s = getenv("FAKECUDA_MEMORY");
	if (s)
		devmem = strtoull(s, NULL, 10);
	for (int i = 0; i < MAX_DEV; i++) {
		primary[i].dev = i;
		primary[i].primary = 1;
		defpool[i].dev = i;
	}
	gpu_setup();
}

static int cur_dev(void)
{
	return current ? current->dev : -1;
}

/* Take @bytes of device @dev's memory: 0, or -1 when it has no more. */
static int take(int dev, size_t bytes)
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
static void unuse(int dev, size_t bytes)
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

/* ---- init, version, devices ---- */

API CUresult cuInit(unsigned int flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	initialized = 1;
	return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 12090;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = ndev;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

static int bad_dev(CUdevice d)
{
	return d < 0 || d >= ndev;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "Fake CUDA Device %d", d);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	memset(uuid->bytes, 0, 16);
	uuid->bytes[0] = 0xfa;
	uuid->bytes[1] = 0xce;
	uuid->bytes[15] = (unsigned char)d;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d)
{
	return cuDeviceGetUuid_v2(uuid, d);
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = devmem;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	(void)attrib;
	*v = 0;		/* every attribute reads 0 */
	return CUDA_SUCCESS;
}

/* ---- contexts ---- */

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!ctx)
		return CUDA_ERROR_INVALID_VALUE;
	*ctx = &primary[d];
	ctx_note(d);
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	return bad_dev(d) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d)
{
	(void)flags;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!ctx)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUctx_st *c = calloc(1, sizeof(*c));
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->dev = d;
	*ctx = current = c;
	ctx_note(d);
	return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	if (!ctx || ctx->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (current == ctx)
		current = NULL;
	free(ctx);
	return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	current = ctx;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!ctx)
		return CUDA_ERROR_INVALID_VALUE;
	*ctx = current;
	return CUDA_SUCCESS;
}

/* A one-deep stack is all the fake keeps: push saves nothing. */
API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	return cuCtxSetCurrent(ctx);
}

API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	if (ctx)
		*ctx = current;
	current = NULL;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = current->dev;
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

/* ---- the simulated GPU: streams, launches, events, host functions ---- */

/* Driver errors beyond what cuda_abi.h declares. */
enum {
	ERR_ILLEGAL_STATE = 401,
	ERR_CAPTURE_UNSUPPORTED = 900,
	ERR_CAPTURE_INVALIDATED = 901,
	ERR_CAPTURED_EVENT = 907,
};

/* struct gpu_shared (fake_gpu.h): what every process naming the file shares. */
_Static_assert(MAX_DEV == FG_MAX_DEV, "one device count");
static struct gpu_shared private_gpu, *gpu = &private_gpu;
static uint64_t ns_per_block = 1000;

struct CUstream_st {
	int dev;
	_Atomic uint64_t end;		/* when its last work ends */
	unsigned hostfns;		/* host functions not run yet (hlock) */
	struct CUgraph_st *capture;	/* the graph it captures into, or NULL */
	int invalidated;		/* the capture failed */
};

struct CUevent_st {
	unsigned flags;
	_Atomic int state;		/* EV_* */
	_Atomic uint64_t t;		/* when it completes */
};
enum { EV_NONE, EV_RECORDED, EV_CAPTURED };

struct CUgraphNode_st { struct CUgraph_st *g; };
struct CUgraph_st {
	uint64_t *ns;			/* kernel durations, in order */
	struct CUgraphNode_st **nodes;
	unsigned n, cap;
};
struct CUgraphExec_st { uint64_t *ns; unsigned n; };

static struct CUstream_st legacy[MAX_DEV];
static _Thread_local struct CUstream_st per_thread[MAX_DEV];
static _Atomic uint64_t proc_end[MAX_DEV];	/* this process's last work */
static _Atomic uint64_t proc_busy_ns;		/* its kernel time submitted */

static void gpu_setup(void)
{
	const char *s = getenv("FAKECUDA_NS_PER_BLOCK");
	if (s)
		ns_per_block = strtoull(s, NULL, 10);
	for (int i = 0; i < MAX_DEV; i++)
		legacy[i].dev = i;
	s = getenv("FAKECUDA_GPU_STATE");
	if (!s || !*s)
		return;
	int fd = open(s, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat sb;
	/* Zero-filled when new; only ever grown, so racing creators agree. */
	if (fd < 0 || fstat(fd, &sb) ||
	    ((size_t)sb.st_size < sizeof(*gpu) && ftruncate(fd, sizeof(*gpu)))) {
		fprintf(stderr, "fakecuda: %s: %s\n", s, strerror(errno));
		abort();
	}
	void *p = mmap(NULL, sizeof(*gpu), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		abort();
	close(fd);
	gpu = p;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

static void atomic_max64(_Atomic uint64_t *v, uint64_t x)
{
	uint64_t old = atomic_load(v);
	while (old < x && !atomic_compare_exchange_weak(v, &old, x))
		;
}

/*
 * The stream a handle means: NULL is the legacy default stream, or the
 * per-thread one for a _ptsz entry point; NULL when there is no context.
 */
static struct CUstream_st *stream_of(CUstream s, int ptsz)
{
	int dev = cur_dev();
	if (s == CU_STREAM_PER_THREAD || (!s && ptsz)) {
		if (dev < 0)
			return NULL;
		per_thread[dev].dev = dev;
		return &per_thread[dev];
	}
	if (!s || s == CU_STREAM_LEGACY)
		return dev < 0 ? NULL : &legacy[dev];
	return s;
}

/* Device of a stream: the null and special handles mean the current one. */
static int stream_dev(CUstream s)
{
	struct CUstream_st *st = stream_of(s, 0);
	return st ? st->dev : -1;
}

/*
 * This process's record in the shared file (fake_gpu.h), for the fake
 * NVML; NULL when the GPU is private (nobody else can read it).  Claimed
 * at first use (again in a forked child): a free record, or one of a
 * process that has exited.
 */
static struct fg_proc *me;
static pid_t me_pid;
static pthread_mutex_t me_lock = PTHREAD_MUTEX_INITIALIZER;	/* its writers */

static struct fg_proc *record(void)
{
	pid_t pid = getpid();

	if (gpu == &private_gpu)
		return NULL;
	if (me && me_pid == pid)
		return me;
	me = NULL;
	for (int i = 0; i < FG_PROCS && !me; i++) {
		struct fg_proc *p = &gpu->procs[i];
		int32_t old = atomic_load(&p->pid);
		if (old == pid || ((old == 0 || (kill(old, 0) && errno == ESRCH)) &&
				   atomic_compare_exchange_strong(&p->pid, &old, pid)))
			me = p;
	}
	if (!me)
		return NULL;	/* full: this process is not seen */
	me_pid = pid;
	atomic_store(&me->ctx, 0);
	for (int d = 0; d < FG_MAX_DEV; d++) {
		struct fg_runs *r = &me->dev[d];
		atomic_fetch_add(&r->seq, 1);
		atomic_store(&me->mem[d], atomic_load(&used[d]));
		atomic_store(&r->n, 0);
		atomic_store(&r->done, 0);
		atomic_fetch_add(&r->seq, 1);
	}
	return me;
}

/* Device @dev's memory in use changed: tell the record. */
static void mem_note(int dev)
{
	pthread_mutex_lock(&me_lock);
	struct fg_proc *p = record();
	if (p)
		atomic_store(&p->mem[dev], atomic_load(&used[dev]));
	pthread_mutex_unlock(&me_lock);
}

/* A context on @dev: NVML lists the process there. */
static void ctx_note(int dev)
{
	pthread_mutex_lock(&me_lock);
	struct fg_proc *p = record();
	if (p)
		atomic_fetch_or(&p->ctx, 1u << dev);
	pthread_mutex_unlock(&me_lock);
}

/*
 * Queue a kernel of @ns on @st: it runs when the stream and device are
 * free.  Shared, the record says when it runs (under the record's lock,
 * so that its runs are in the device's order).
 */
static void gpu_run(struct CUstream_st *st, uint64_t ns)
{
	uint64_t now = now_ns(), t = max64(now, atomic_load(&st->end)), start;
	uint64_t busy = atomic_load(&gpu->busy_until[st->dev]);
	struct fg_proc *p = NULL;

	if (gpu != &private_gpu && ns) {
		pthread_mutex_lock(&me_lock);
		p = record();
		if (!p)
			pthread_mutex_unlock(&me_lock);
	}
	do {
		start = max64(busy, t);
	} while (!atomic_compare_exchange_weak(&gpu->busy_until[st->dev], &busy, start + ns));
	if (p) {
		fg_record(&p->dev[st->dev], start, start + ns, now);
		pthread_mutex_unlock(&me_lock);
	}
	atomic_max64(&st->end, start + ns);
	atomic_max64(&proc_end[st->dev], start + ns);
	atomic_fetch_add(&gpu->busy_ns[st->dev], ns);
	atomic_fetch_add(&proc_busy_ns, ns);
}

API uint64_t fakecuda_busy_ns(void)
{
	return atomic_load(&proc_busy_ns);
}

/* Append a kernel of @ns to @g: its node, or NULL (out of memory). */
static struct CUgraphNode_st *graph_add(struct CUgraph_st *g, uint64_t ns)
{
	if (g->n == g->cap) {
		unsigned cap = g->cap ? 2 * g->cap : 16;
		uint64_t *a = realloc(g->ns, cap * sizeof(*a));
		if (!a)
			return NULL;
		g->ns = a;
		struct CUgraphNode_st **b = realloc(g->nodes, cap * sizeof(*b));
		if (!b)
			return NULL;
		g->nodes = b;
		g->cap = cap;
	}
	struct CUgraphNode_st *node = malloc(sizeof(*node));
	if (!node)
		return NULL;
	node->g = g;
	g->ns[g->n] = ns;
	g->nodes[g->n++] = node;
	return node;
}

/* ---- modules: not loaded, any image and name do ---- */

static char fake_module, fake_function;

API CUresult cuModuleLoadData(void **module, const void *image)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!module || !image)
		return CUDA_ERROR_INVALID_VALUE;
	*module = &fake_module;
	return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *f, void *module, const char *name)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!f || module != &fake_module || !name)
		return CUDA_ERROR_INVALID_VALUE;
	*f = (CUfunction)&fake_function;
	return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
		       CUstream s, int ptsz)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t ns = (uint64_t)gx * gy * gz * ns_per_block;
	if (st->capture) {
		if (st->invalidated)
			return ERR_CAPTURE_INVALIDATED;
		return graph_add(st->capture, ns) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
	gpu_run(st, ns);
	return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			    unsigned int bx, unsigned int by, unsigned int bz,
			    unsigned int shared, CUstream s, void **params, void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shared, (void)params, (void)extra;
	return launch(f, gx, gy, gz, s, 0);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				 unsigned int gz, unsigned int bx, unsigned int by,
				 unsigned int bz, unsigned int shared, CUstream s,
				 void **params, void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shared, (void)params, (void)extra;
	return launch(f, gx, gy, gz, s, 1);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
			      void **extra)
{
	(void)params, (void)extra;
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream, 0);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
				   void **extra)
{
	(void)params, (void)extra;
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream, 1);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
				       unsigned int gz, unsigned int bx, unsigned int by,
				       unsigned int bz, unsigned int shared, CUstream s,
				       void **params)
{
	(void)bx, (void)by, (void)bz, (void)shared, (void)params;
	return launch(f, gx, gy, gz, s, 0);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					    unsigned int gz, unsigned int bx, unsigned int by,
					    unsigned int bz, unsigned int shared, CUstream s,
					    void **params)
{
	(void)bx, (void)by, (void)bz, (void)shared, (void)params;
	return launch(f, gx, gy, gz, s, 1);
}

/* One launch per entry, each on its own stream (and device). */
API CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n,
						  unsigned int flags)
{
	(void)flags;
	if (!list || !n)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned int i = 0; i < n; i++) {
		CUresult r = launch(list[i].function, list[i].gridDimX, list[i].gridDimY,
				    list[i].gridDimZ, list[i].hStream, 0);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}

/* ---- host functions: one worker thread runs them in submission order ---- */

struct hostfn {
	uint64_t t;			/* when its stream reaches it */
	CUhostFn fn;
	void *data;
	struct CUstream_st *st;
	struct hostfn *next;
};
static pthread_mutex_t hlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hcond = PTHREAD_COND_INITIALIZER;
static struct hostfn *hhead, **htail = &hhead;
static unsigned proc_hostfns;			/* queued, not run yet */
static pid_t hpid;				/* the worker's process */

static void *host_worker(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&hlock);
	for (;;) {
		while (!hhead)
			pthread_cond_wait(&hcond, &hlock);
		struct hostfn *h = hhead;	/* stays at the head while it runs */
		pthread_mutex_unlock(&hlock);
		sleep_until(h->t);
		h->fn(h->data);
		pthread_mutex_lock(&hlock);
		hhead = h->next;
		if (!hhead)
			htail = &hhead;
		h->st->hostfns--;
		proc_hostfns--;
		pthread_cond_broadcast(&hcond);
		free(h);
	}
	return NULL;
}

static CUresult host_func(CUstream s, CUhostFn fn, void *data, int ptsz)
{
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (st->capture)	/* host nodes are not simulated */
		return st->invalidated ? ERR_CAPTURE_INVALIDATED : CUDA_ERROR_NOT_SUPPORTED;
	struct hostfn *h = malloc(sizeof(*h));
	if (!h)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* Work queued after it starts no sooner than it (as if it took no time). */
	h->t = max64(now_ns(), atomic_load(&st->end));
	atomic_max64(&st->end, h->t);
	h->fn = fn;
	h->data = data;
	h->st = st;
	h->next = NULL;
	pthread_mutex_lock(&hlock);
	if (hpid != getpid()) {		/* first use, or a forked child */
		pthread_t t;
		hhead = NULL;
		htail = &hhead;
		proc_hostfns = 0;
		if (pthread_create(&t, NULL, host_worker, NULL)) {
			pthread_mutex_unlock(&hlock);
			free(h);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		pthread_detach(t);
		hpid = getpid();
	}
	*htail = h;
	htail = &h->next;
	st->hostfns++;
	proc_hostfns++;
	pthread_cond_broadcast(&hcond);
	pthread_mutex_unlock(&hlock);
	return CUDA_SUCCESS;
}

API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data)
{
	return host_func(s, fn, data, 0);
}

API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
	return host_func(s, fn, data, 1);
}

/* Wait for the host functions of @st (NULL: of the process) to have run. */
static void host_wait(struct CUstream_st *st)
{
	pthread_mutex_lock(&hlock);
	while (st ? st->hostfns : proc_hostfns)
		pthread_cond_wait(&hcond, &hlock);
	pthread_mutex_unlock(&hlock);
}

static int host_pending(struct CUstream_st *st)
{
	pthread_mutex_lock(&hlock);
	int n = (int)st->hostfns;
	pthread_mutex_unlock(&hlock);
	return n;
}

/* ---- streams ---- */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	(void)flags;
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUstream_st *st = calloc(1, sizeof(*st));
	if (!st)
		return CUDA_ERROR_OUT_OF_MEMORY;
	st->dev = current->dev;
	*s = st;
	return CUDA_SUCCESS;
}

/* As the real driver's: work queued there still completes. */
API CUresult cuStreamDestroy_v2(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	host_wait(s);
	free(s);
	return CUDA_SUCCESS;
}

/* Synchronising a capturing stream is not allowed, and ends the capture. */
static int capture_broken(struct CUstream_st *st)
{
	if (!st->capture)
		return 0;
	st->invalidated = 1;
	return 1;
}

static CUresult stream_sync(CUstream s, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (capture_broken(st))
		return ERR_CAPTURE_UNSUPPORTED;
	sleep_until(atomic_load(&st->end));
	host_wait(st);
	return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream s)
{
	return stream_sync(s, 0);
}

API CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	return stream_sync(s, 1);
}

static CUresult stream_query(CUstream s, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (capture_broken(st))
		return ERR_CAPTURE_UNSUPPORTED;
	return now_ns() < atomic_load(&st->end) || host_pending(st) ? CUDA_ERROR_NOT_READY
								     : CUDA_SUCCESS;
}

API CUresult cuStreamQuery(CUstream s)
{
	return stream_query(s, 0);
}

API CUresult cuStreamQuery_ptsz(CUstream s)
{
	return stream_query(s, 1);
}

API CUresult cuCtxSynchronize(void)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	sleep_until(atomic_load(&proc_end[current->dev]));
	host_wait(NULL);
	return CUDA_SUCCESS;
}

/* ---- events ---- */

API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
	if (!e || flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | 0x4))
		return CUDA_ERROR_INVALID_VALUE;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUevent_st *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ev->flags = flags;
	*e = ev;
	return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	return CUDA_SUCCESS;
}

API CUresult cuEventDestroy(CUevent e)
{
	return cuEventDestroy_v2(e);
}

/* The event completes when the stream's work queued so far is done. */
static CUresult event_record(CUevent e, CUstream s, int ptsz)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (st->capture) {	/* becomes a node of the graph: no time of its own */
		atomic_store(&e->state, EV_CAPTURED);
		return st->invalidated ? ERR_CAPTURE_INVALIDATED : CUDA_SUCCESS;
	}
	atomic_store(&e->t, max64(now_ns(), atomic_load(&st->end)));
	atomic_store(&e->state, EV_RECORDED);
	return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent e, CUstream s)
{
	return event_record(e, s, 0);
}

API CUresult cuEventRecord_ptsz(CUevent e, CUstream s)
{
	return event_record(e, s, 1);
}

API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags)
{
	(void)flags;
	return event_record(e, s, 0);
}

API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags)
{
	(void)flags;
	return event_record(e, s, 1);
}

/* A never-recorded event counts as complete, as in the real driver. */
API CUresult cuEventQuery(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	int state = atomic_load(&e->state);
	if (state == EV_CAPTURED)
		return ERR_CAPTURED_EVENT;
	return state == EV_RECORDED && now_ns() < atomic_load(&e->t) ? CUDA_ERROR_NOT_READY
								      : CUDA_SUCCESS;
}

API CUresult cuEventSynchronize(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	int state = atomic_load(&e->state);
	if (state == EV_CAPTURED)
		return ERR_CAPTURED_EVENT;
	if (state == EV_RECORDED)
		sleep_until(atomic_load(&e->t));
	return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	if (!start || !end || (start->flags | end->flags) & CU_EVENT_DISABLE_TIMING)
		return CUDA_ERROR_INVALID_HANDLE;
	int a = atomic_load(&start->state), b = atomic_load(&end->state);
	if (a == EV_CAPTURED || b == EV_CAPTURED)
		return ERR_CAPTURED_EVENT;
	if (a != EV_RECORDED || b != EV_RECORDED)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t t0 = atomic_load(&start->t), t1 = atomic_load(&end->t), now = now_ns();
	if (now < t0 || now < t1)
		return CUDA_ERROR_NOT_READY;
	*ms = (float)(((double)t1 - (double)t0) / 1e6);
	return CUDA_SUCCESS;
}

static CUresult wait_event(CUstream s, CUevent e, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!st->capture && atomic_load(&e->state) == EV_RECORDED)
		atomic_max64(&st->end, atomic_load(&e->t));
	return CUDA_SUCCESS;
}

API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
	(void)flags;
	return wait_event(s, e, 0);
}

API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags)
{
	(void)flags;
	return wait_event(s, e, 1);
}

/* ---- graphs and stream capture ---- */

API CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
	if (!g || flags)
		return CUDA_ERROR_INVALID_VALUE;
	*g = calloc(1, sizeof(**g));
	return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuGraphDestroy(CUgraph g)
{
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned int i = 0; i < g->n; i++)
		free(g->nodes[i]);
	free(g->nodes);
	free(g->ns);
	free(g);
	return CUDA_SUCCESS;
}

/* The nodes run in the order they were added: a valid order of @deps. */
API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				  size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
	if (!node || !g || !p || (ndeps && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < ndeps; i++)
		if (!deps[i] || deps[i]->g != g)
			return CUDA_ERROR_INVALID_VALUE;
	if (!p->func)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!p->gridDimX || !p->gridDimY || !p->gridDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	*node = graph_add(g, (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ * ns_per_block);
	return *node ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* _v2's parameters begin with version 1's (then a CUkernel and a context). */
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				     size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
	return cuGraphAddKernelNode(node, g, deps, ndeps, p);
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	if (!e || !g || flags)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraphExec_st *x = malloc(sizeof(*x));
	uint64_t *ns = malloc((g->n ? g->n : 1) * sizeof(*ns));
	if (!x || !ns) {
		free(x);
		free(ns);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memcpy(ns, g->ns, g->n * sizeof(*ns));
	x->ns = ns;
	x->n = g->n;
	*e = x;
	return CUDA_SUCCESS;
}

/* Before CUDA 12: (exec, graph, error node, log buffer, its size). */
API CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				   size_t logsize)
{
	(void)err;
	if (log && logsize)
		log[0] = 0;
	return cuGraphInstantiateWithFlags(e, g, 0);
}

API CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				size_t logsize)
{
	return cuGraphInstantiate_v2(e, g, err, log, logsize);
}

API CUresult cuGraphExecDestroy(CUgraphExec e)
{
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	free(e->ns);
	free(e);
	return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec e, CUstream s, int ptsz)
{
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (st->capture) {
		if (st->invalidated)
			return ERR_CAPTURE_INVALIDATED;
		for (unsigned int i = 0; i < e->n; i++)
			if (!graph_add(st->capture, e->ns[i]))
				return CUDA_ERROR_OUT_OF_MEMORY;
		return CUDA_SUCCESS;
	}
	for (unsigned int i = 0; i < e->n; i++)
		gpu_run(st, e->ns[i]);
	return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	return graph_launch(e, s, 0);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
	return graph_launch(e, s, 1);
}

/* The legacy default stream cannot be captured, as with the real driver. */
static CUresult begin_capture(CUstream s, int mode, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (mode < 0 || mode > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if (st >= &legacy[0] && st < &legacy[MAX_DEV])
		return ERR_CAPTURE_UNSUPPORTED;
	if (st->capture)
		return ERR_ILLEGAL_STATE;
	CUgraph g;
	CUresult r = cuGraphCreate(&g, 0);
	if (r != CUDA_SUCCESS)
		return r;
	st->capture = g;
	st->invalidated = 0;
	return CUDA_SUCCESS;
}

API CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	return begin_capture(s, mode, 0);
}

API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
	return begin_capture(s, mode, 1);
}

API CUresult cuStreamBeginCapture(CUstream s)
{
	return begin_capture(s, 0, 0);
}

API CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return begin_capture(s, 0, 1);
}

static CUresult end_capture(CUstream s, CUgraph *g, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!st->capture)
		return ERR_ILLEGAL_STATE;
	*g = st->capture;
	st->capture = NULL;
	if (st->invalidated) {
		cuGraphDestroy(*g);
		*g = NULL;
		return ERR_CAPTURE_INVALIDATED;
	}
	return CUDA_SUCCESS;
}

API CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	return end_capture(s, g, 0);
}

API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	return end_capture(s, g, 1);
}

static CUresult is_capturing(CUstream s, int *status, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	*status = !st->capture ? CU_STREAM_CAPTURE_STATUS_NONE :
		  st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED :
		  CU_STREAM_CAPTURE_STATUS_ACTIVE;
	return CUDA_SUCCESS;
}

API CUresult cuStreamIsCapturing(CUstream s, int *status)
{
	return is_capturing(s, status, 0);
}

API CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status)
{
	return is_capturing(s, status, 1);
}

API CUresult cuStreamGetDevice(CUstream s, CUdevice *d)
{
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = stream_dev(s);
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = dev;
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

/* ---- errors ---- */

static const struct { CUresult r; const char *name, *text; } errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ ERR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
	  "the operation cannot be performed in the present state" },
	{ ERR_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	  "operation not permitted when stream is capturing" },
	{ ERR_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	  "operation failed due to a previous error during capture" },
	{ ERR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
	  "operation not permitted on an event last recorded in a capturing stream" },
};

static int error_index(CUresult r)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].r == r)
			return (int)i;
	return -1;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	int i = error_index(r);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = i < 0 ? NULL : errors[i].text;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	int i = error_index(r);
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = i < 0 ? NULL : errors[i].name;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

API CUresult cuGetProcAddress(const char *name, void **pfn, int version, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status);

/*
 * The name table: a name as callers ask for it, the first driver version
 * the entry answers for, whether it is a per-thread default stream variant,
 * and the function.  Several rows per name: the one with the highest
 * version not above the caller's wins (and a per-thread row wins over the
 * default one only when the caller asks for per-thread).
 */
#define E(n, v, f) { n, v, 0, (void *)f }
#define PT(n, v, f) { n, v, 1, (void *)f }
static const struct proc {
	const char *name;
	int version;
	int per_thread;
	void *fn;
} procs[] = {
	E("cuInit", 2000, cuInit),
	E("cuDriverGetVersion", 2020, cuDriverGetVersion),
	E("cuDeviceGet", 2000, cuDeviceGet),
	E("cuDeviceGetCount", 2000, cuDeviceGetCount),
	E("cuDeviceGetName", 2000, cuDeviceGetName),
	E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
	E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	E("cuCtxCreate", 3020, cuCtxCreate_v2),
	E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	E("cuCtxGetDevice", 2000, cuCtxGetDevice),
	E("cuCtxSynchronize", 2000, cuCtxSynchronize),
	E("cuMemAlloc", 3020, cuMemAlloc_v2),
	E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
	E("cuMemFree", 3020, cuMemFree_v2),
	E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	E("cuMemAllocManaged", 6000, cuMemAllocManaged),
	E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
	E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
	E("cuMemsetD8", 3020, cuMemsetD8_v2),
	E("cuStreamCreate", 2000, cuStreamCreate),
	E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	E("cuStreamSynchronize", 2000, cuStreamSynchronize),
	PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
	E("cuStreamQuery", 2000, cuStreamQuery),
	PT("cuStreamQuery", 7000, cuStreamQuery_ptsz),
	E("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
	PT("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz),
	E("cuEventCreate", 2000, cuEventCreate),
	E("cuEventDestroy", 2000, cuEventDestroy),
	E("cuEventDestroy", 4000, cuEventDestroy_v2),
	E("cuEventRecord", 2000, cuEventRecord),
	PT("cuEventRecord", 7000, cuEventRecord_ptsz),
	E("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags),
	PT("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags_ptsz),
	E("cuEventQuery", 2000, cuEventQuery),
	E("cuEventSynchronize", 2000, cuEventSynchronize),
	E("cuEventElapsedTime", 2000, cuEventElapsedTime),
	E("cuModuleLoadData", 2000, cuModuleLoadData),
	E("cuModuleGetFunction", 2000, cuModuleGetFunction),
	E("cuLaunchKernel", 4000, cuLaunchKernel),
	PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
	E("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
	PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
	E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
	PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
	E("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
	E("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
	PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc_ptsz),
	E("cuGraphCreate", 10000, cuGraphCreate),
	E("cuGraphDestroy", 10000, cuGraphDestroy),
	E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
	E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
	E("cuGraphInstantiate", 10000, cuGraphInstantiate),
	E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
	E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
	E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
	E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
	E("cuGraphLaunch", 10000, cuGraphLaunch),
	PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
	E("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
	PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
	E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
	PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
	E("cuStreamEndCapture", 10000, cuStreamEndCapture),
	PT("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
	E("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
	PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
	E("cuStreamGetDevice", 12080, cuStreamGetDevice),
	E("cuMemAllocAsync", 11020, cuMemAllocAsync),
	PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
	E("cuMemFreeAsync", 11020, cuMemFreeAsync),
	PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
	E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
	PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
	E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	E("cuMemPoolCreate", 11020, cuMemPoolCreate),
	E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	E("cuMemCreate", 10020, cuMemCreate),
	E("cuMemRelease", 10020, cuMemRelease),
	E("cuMemAddressReserve", 10020, cuMemAddressReserve),
	E("cuMemAddressFree", 10020, cuMemAddressFree),
	E("cuMemMap", 10020, cuMemMap),
	E("cuMemUnmap", 10020, cuMemUnmap),
	E("cuMemSetAccess", 10020, cuMemSetAccess),
	E("cuArrayCreate", 3020, cuArrayCreate_v2),
	E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
	E("cuArrayDestroy", 2000, cuArrayDestroy),
	E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
	E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
	E("cuGetErrorString", 6000, cuGetErrorString),
	E("cuGetErrorName", 6000, cuGetErrorName),
	E("cuGetProcAddress", 11030, cuGetProcAddress),
	E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult lookup(const char *name, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	int known = 0;

	if (!name || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		const struct proc *p = &procs[i];
		if (strcmp(p->name, name))
			continue;
		known = 1;
		if (p->version > version || (p->per_thread && !want_pt))
			continue;
		if (!best || p->version > best->version ||
		    (p->version == best->version && p->per_thread))
			best = p;
	}
	*pfn = best ? best->fn : NULL;
	if (status)
		*status = best ? CU_GET_PROC_ADDRESS_SUCCESS :
			  known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT :
			  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress(const char *name, void **pfn, int version, cuuint64_t flags)
{
	return lookup(name, pfn, version, flags, NULL);
}

API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	return lookup(name, pfn, version, flags, status);
}
