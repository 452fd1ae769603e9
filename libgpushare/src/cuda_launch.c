// SPDX-License-Identifier: Apache-2.0
/*
 * Launches, through the compute gate (sched_gate.h).
 *
 * Every way to put work on a GPU's queue waits at the gate first, on the
 * stream it is for (a _ptsz entry point's stream 0 is the per-thread
 * default stream).  Only the calling thread is delayed: the work keeps its
 * order in its stream.  Legacy cuLaunch/cuLaunchGrid are not covered.
 */
#include <stdbool.h>

#include "cuda_abi.h"
#include "cuda_driver.h"
#include "cuda_wrappers.h"
#include "lookup.h"
#include "sched_gate.h"

static CUresult launch_kernel(enum gs_fn fn, bool pt, CUfunction f, unsigned int gx,
			      unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			      unsigned int bz, unsigned int shared, CUstream s, void **params,
			      void **extra)
{
	CUresult r = gs_sched_gate(-1, s, pt);
	if (r != CUDA_SUCCESS)
		return r;
	cuLaunchKernel_t real_fn = (cuLaunchKernel_t)gs_driver_fn(fn);
	return real_fn ? real_fn(f, gx, gy, gz, bx, by, bz, shared, s, params, extra) :
			 CUDA_ERROR_NOT_FOUND;
}

CUresult w_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
			  unsigned int gz, unsigned int bx, unsigned int by,
			  unsigned int bz, unsigned int shared, CUstream s,
			  void **params, void **extra)
{
	return launch_kernel(GS_FN_cuLaunchKernel, false, f, gx, gy, gz, bx, by, bz, shared, s,
			     params, extra);
}
EXPORT_AS(cuLaunchKernel, w_cuLaunchKernel);

CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
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
	cuLaunchKernelEx_t real_fn = (cuLaunchKernelEx_t)gs_driver_fn(fn);
	return real_fn ? real_fn(config, f, params, extra) : CUDA_ERROR_NOT_FOUND;
}

CUresult w_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
			    void **extra)
{
	return launch_ex(GS_FN_cuLaunchKernelEx, false, config, f, params, extra);
}
EXPORT_AS(cuLaunchKernelEx, w_cuLaunchKernelEx);

CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
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
	cuLaunchCooperativeKernel_t real_fn = (cuLaunchCooperativeKernel_t)gs_driver_fn(fn);
	return real_fn ? real_fn(f, gx, gy, gz, bx, by, bz, shared, s, params) :
			 CUDA_ERROR_NOT_FOUND;
}

CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
				     unsigned int gz, unsigned int bx, unsigned int by,
				     unsigned int bz, unsigned int shared, CUstream s,
				     void **params)
{
	return launch_coop(GS_FN_cuLaunchCooperativeKernel, false, f, gx, gy, gz, bx, by, bz,
			   shared, s, params);
}
EXPORT_AS(cuLaunchCooperativeKernel, w_cuLaunchCooperativeKernel);

CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
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
CUresult w_cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
						unsigned int n, unsigned int flags)
{
	for (unsigned int i = 0; list && i < n; i++) {
		CUresult r = gs_sched_gate(gs_stream_device(list[i].hStream), list[i].hStream, false);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return REAL(cuLaunchCooperativeKernelMultiDevice_t, cuLaunchCooperativeKernelMultiDevice,
		    list, n, flags);
}
EXPORT_AS(cuLaunchCooperativeKernelMultiDevice, w_cuLaunchCooperativeKernelMultiDevice);

/* A graph is gated as a whole; its time is measured on the GPU like any work. */
CUresult w_cuGraphLaunch(CUgraphExec exec, CUstream s)
{
	CUresult r = gs_sched_gate(-1, s, false);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuGraphLaunch_t, cuGraphLaunch, exec, s);
}
EXPORT_AS(cuGraphLaunch, w_cuGraphLaunch);

CUresult w_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
	CUresult r = gs_sched_gate(-1, s, true);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuGraphLaunch_t, cuGraphLaunch_ptsz, exec, s);
}
EXPORT_AS(cuGraphLaunch_ptsz, w_cuGraphLaunch_ptsz);

/* Gated like a kernel, so nothing queued after it can overtake what was gated. */
CUresult w_cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data)
{
	CUresult r = gs_sched_gate(-1, s, false);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuLaunchHostFunc_t, cuLaunchHostFunc, s, fn, data);
}
EXPORT_AS(cuLaunchHostFunc, w_cuLaunchHostFunc);

CUresult w_cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
	CUresult r = gs_sched_gate(-1, s, true);
	if (r != CUDA_SUCCESS)
		return r;
	return REAL(cuLaunchHostFunc_t, cuLaunchHostFunc_ptsz, s, fn, data);
}
EXPORT_AS(cuLaunchHostFunc_ptsz, w_cuLaunchHostFunc_ptsz);
