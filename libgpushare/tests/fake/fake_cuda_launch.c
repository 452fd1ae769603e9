// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's launches (see fake_cuda.c): modules (not loaded),
 * kernels on the simulated GPU, host functions on a worker thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

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
void host_wait(struct CUstream_st *st)
{
	pthread_mutex_lock(&hlock);
	while (st ? st->hostfns : proc_hostfns)
		pthread_cond_wait(&hcond, &hlock);
	pthread_mutex_unlock(&hlock);
}

int host_pending(struct CUstream_st *st)
{
	pthread_mutex_lock(&hlock);
	int n = (int)st->hostfns;
	pthread_mutex_unlock(&hlock);
	return n;
}
