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
 *
 * The parts: this file (setup, devices, contexts), fake_cuda_mem.c (memory,
 * pools, arrays), fake_cuda_vmm.c (virtual memory management),
 * fake_cuda_gpu.c (the simulated GPU and its shared file),
 * fake_cuda_launch.c (modules, launches, host functions),
 * fake_cuda_stream.c (streams, events), fake_cuda_graph.c (graphs, stream
 * capture), fake_cuda_proc.c (errors, cuGetProcAddress); fake_cuda.h is
 * what they share, fake_cuda_api.h the entry points.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

static int ndev = 2;
uint64_t devmem = 8ull << 30;
static struct CUctx_st primary[MAX_DEV];
struct CUmemPoolHandle_st defpool[MAX_DEV];
_Thread_local CUcontext current;
int initialized;

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

int cur_dev(void)
{
	return current ? current->dev : -1;
}

int bad_dev(CUdevice d)
{
	return d < 0 || d >= ndev;
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
