// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's streams and events (see fake_cuda.c): work
 * completes on the simulated GPU's clock, and every synchronisation sleeps
 * until then.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

struct CUevent_st {
	unsigned flags;
	_Atomic int state;		/* EV_* */
	_Atomic uint64_t t;		/* when it completes */
};
enum { EV_NONE, EV_RECORDED, EV_CAPTURED };

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
