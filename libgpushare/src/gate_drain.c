// SPDX-License-Identifier: Apache-2.0
/*
 * The slice's streams and their events (gate.h): which streams a slice
 * launched on, the events that time them, and the drain that waits for
 * their work and measures its GPU time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "gate.h"
#include "pace.h"

/* The handle the driver's calls take for a tracked stream. */
CUstream gate_drv_stream(CUstream s)
{
	return s == CU_STREAM_LEGACY ? NULL : s;
}

/*
 * Is @s being captured?  An error counts as yes: during a capture the
 * driver answers some streams with an error (the legacy stream while
 * another is captured), and then nothing must be recorded into them.
 */
bool gate_capturing(CUstream s)
{
	int status = CU_STREAM_CAPTURE_STATUS_NONE;

	if (!gate_drv.is_capturing)
		return false;
	return gate_drv.is_capturing(gate_drv_stream(s), &status) != CUDA_SUCCESS ||
	       status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Events for timing, made once per device (in the context current then). */
static void make_events(struct gate *g)
{
	int made = 0;

	if (g->events_tried)
		return;
	g->events_tried = true;
	if (!gate_drv.event_create || !gate_drv.event_record || !gate_drv.event_sync ||
	    !gate_drv.elapsed)
		return;
	for (; made < 2 * MAX_STREAMS; made++) {
		CUevent *e = made < MAX_STREAMS ? &g->start[made] : &g->end[made - MAX_STREAMS];
		if (gate_drv.event_create(e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
			break;
	}
	for (int i = 0; made == 2 * MAX_STREAMS && i < GS_PACE_SLOTS; i++)
		if (gate_drv.event_create(&g->probe[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
			for (int k = 0; k < i && gate_drv.event_destroy; k++)
				gate_drv.event_destroy(g->probe[k]);
			made = 0;	/* no probes: no events at all */
			break;
		}
	if (made == 2 * MAX_STREAMS) {
		g->have_events = true;
		if (!gate_drv.ctx_get_current || gate_drv.ctx_get_current(&g->ctx) != CUDA_SUCCESS)
			g->ctx = NULL;
		return;
	}
	for (int i = 0; i < made && gate_drv.event_destroy; i++)
		gate_drv.event_destroy(i < MAX_STREAMS ? g->start[i] : g->end[i - MAX_STREAMS]);
}

/* A launch on @s in the current slice: time @s from here if it is new. */
void gate_track_locked(struct gate *g, CUstream s)
{
	pthread_t self = pthread_self();
	int i;

	if (g->in_slice) {
		for (i = 0; i < g->nstreams; i++)
			if (g->st[i].stream == s &&
			    (s != CU_STREAM_PER_THREAD || pthread_equal(g->st[i].owner, self)))
				break;
		if (i == g->nstreams) {
			if (gate_capturing(s))
				return;		/* not cached: asked again next time */
			if (i == MAX_STREAMS) {
				g->overflow = true;
			} else {
				make_events(g);
				g->st[i].stream = s;
				g->st[i].owner = self;
				g->st[i].timed = g->have_events &&
					gate_drv.event_record(g->start[i], gate_drv_stream(s)) ==
					CUDA_SUCCESS;
				g->nstreams++;
			}
		}
	}
	gate_last.stream = s;
	gate_last.gen = atomic_load_explicit(&g->gen, memory_order_relaxed);
}

/* Elapsed ns between two completed events, 0 when it cannot be read. */
uint64_t gate_span_ns(CUevent a, CUevent b)
{
	float ms = 0;

	if (gate_drv.elapsed(&ms, a, b) != CUDA_SUCCESS || !(ms > 0) || ms >= 1e9f)
		return 0;
	return (uint64_t)((double)ms * 1e6);
}

/* Work left running by earlier drains: what has ended since, in ns. */
static uint64_t late_done(struct gate *g)
{
	uint64_t used = 0;
	int k = 0;

	for (int i = 0; i < g->nlate; i++) {
		CUresult r = gate_drv.event_query(g->late_end[i]);
		if (r == CUDA_ERROR_NOT_READY) {
			g->late_start[k] = g->late_start[i];
			g->late_end[k++] = g->late_end[i];
			continue;
		}
		if (r == CUDA_SUCCESS)
			used += gate_span_ns(g->late_start[i], g->late_end[i]);
		if (gate_drv.event_destroy) {
			gate_drv.event_destroy(g->late_start[i]);
			gate_drv.event_destroy(g->late_end[i]);
		}
	}
	g->nlate = k;
	return used;
}

/*
 * Stream @i's end event has not completed within the drain's bound: keep
 * its pair to report at a later exchange, and give the slot new events.
 */
static void keep_late(struct gate *g, int i)
{
	CUevent s, e;

	if (g->nlate == MAX_STREAMS || !gate_drv.event_destroy ||
	    gate_drv.event_create(&s, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
		return;		/* not measured: the core charges the hold */
	if (gate_drv.event_create(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
		gate_drv.event_destroy(s);
		return;
	}
	g->late_start[g->nlate] = g->start[i];
	g->late_end[g->nlate++] = g->end[i];
	g->start[i] = s;
	g->end[i] = e;
}

/* Can this slice be drained without cuCtxSynchronize (from any thread)? */
bool gate_nameable(const struct gate *g)
{
	if (g->overflow)
		return false;
	for (int i = 0; i < g->nstreams; i++)
		if (g->st[i].stream == CU_STREAM_PER_THREAD)
			return false;
	return true;
}

/*
 * Wait for the slice's work; true with its GPU time in *@used, ns (0: none
 * measured).  The end events are polled for at most @bound: work that runs
 * on longer (a kernel that waits for one this process has not launched
 * yet) is not waited for.  @keep: then the slice is given up all the same,
 * and the unfinished work's time is reported at a later exchange, once it
 * has ended; else (the releaser) false, and the slice stays as it was, to
 * be drained later.  A per-thread
 * default stream of another thread cannot be named here, nor can more
 * streams than tracked: the context is synchronised (unbounded; the
 * releaser leaves such slices to the slow path).  A stream captured since
 * it was tracked cannot be waited for; it is skipped.
 */
bool gate_drain(struct gate *g, uint64_t bound, bool keep, uint64_t *used_out)
{
	pthread_t self = pthread_self();
	bool ended[MAX_STREAMS] = { false };
	bool whole = g->overflow;
	uint64_t used = 0, late = 0;
	int pending = 0;

	if (bound < 1000000)
		bound = 1000000;

	for (int i = 0; i < g->nstreams; i++) {
		struct tracked *t = &g->st[i];
		if (t->stream == CU_STREAM_PER_THREAD && !pthread_equal(t->owner, self)) {
			whole = true;
			continue;
		}
		if (gate_capturing(t->stream))
			continue;
		CUstream s = gate_drv_stream(t->stream);
		if (t->timed && gate_drv.event_record(g->end[i], s) == CUDA_SUCCESS) {
			ended[i] = true;
			pending++;
		} else if (!gate_drv.stream_sync || gate_drv.stream_sync(s) != CUDA_SUCCESS) {
			whole = true;
		}
	}
	uint64_t deadline = mono_ns() + bound, beat = 0;
	while (pending) {
		for (int i = 0; i < g->nstreams; i++) {
			if (!ended[i])
				continue;
			CUresult r = gate_drv.event_query ? gate_drv.event_query(g->end[i]) :
					  gate_drv.event_sync(g->end[i]);
			if (r == CUDA_ERROR_NOT_READY)
				continue;
			ended[i] = false;
			pending--;
			if (r != CUDA_SUCCESS)
				continue;	/* not timed: the core charges the hold */
			uint64_t ns = gate_span_ns(g->start[i], g->end[i]);
			if (ns > used)
				used = ns;
		}
		if (!pending)
			break;
		uint64_t now = mono_ns();
		/* Paced: the drain is part of the hold, kept alive while it runs. */
		if (g->held && now >= beat) {
			gate_heartbeat(g);
			beat = now + g->slice_ns / 8;
		}
		if (now >= deadline) {
			if (!keep)
				return false;
			for (int i = 0; i < g->nstreams; i++)
				if (ended[i])
					keep_late(g, i);
			break;
		}
		poll_nap(now, deadline);
	}
	if (whole && gate_drv.ctx_sync)
		gate_drv.ctx_sync();
	if (g->nlate)
		late = late_done(g);
	g->nstreams = 0;
	g->overflow = false;
	*used_out = used + late;
	return true;
}
