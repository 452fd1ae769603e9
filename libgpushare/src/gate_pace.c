// SPDX-License-Identifier: Apache-2.0
/*
 * Pacing (gate.h, pace.h): held drains kept alive by heartbeats, the
 * pacer's probes, and the paced launch.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gate.h"
#include "pace.h"

/*
 * Held drains (heartbeats, up to drain_ns) when the scheduler has a drain
 * bound (ABI 4, or standalone's own core); pacing too in module mode,
 * where the holder is alone on the GPU.  Standalone is not paced: its
 * neighbours' kernels run between its probes (the GPU is not its own),
 * which inflates the cost estimate until the process starves itself.
 */
void gate_pace_setup(struct gate *g, uint64_t drain_ns, bool pacer)
{
	g->held = gate_cfg.pace_on && drain_ns > 0;
	g->paced = g->held && pacer;
	g->drain_ns = drain_ns;
	g->probe_last = -1;
	gs_pace_init(&g->pace, g->slice_ns, mono_ns());
	if (gate_cfg.debug)
		fprintf(stderr, "gpushare: pid %d: CUDA device %d %s\n", (int)getpid(),
			(int)(g - gates), g->paced ? "paced" : g->held ? "drains held, not paced" :
			"not paced (old module or GPUSHARE_SCHED_PACE=0)");
}

/* Draining, paced: the forced end moves to a grace from now (bounded). */
void gate_heartbeat(struct gate *g)
{
	if (g->how == HOW_MODULE) {
		struct gpushare_sched q;
		gate_sched_op((int)(g - gates), GPUSHARE_SCHED_EXTEND, 0, 0, &q);
	} else if (g->how == HOW_STANDALONE) {
		u64 until;
		gs_sched_extend(&g->core, &g->client, mono_ns(), &until);
	}
}

/* The pacer learns from the probes completed since it last looked. */
void gate_probes_poll(struct gate *g)
{
	int i;

	while ((i = gs_pace_oldest(&g->pace)) >= 0) {
		CUresult r = gate_drv.event_query(g->probe[i]);
		if (r == CUDA_ERROR_NOT_READY)
			return;
		if (r != CUDA_SUCCESS) {
			gs_pace_probe_lost(&g->pace);
			g->probe_last = -1;
			continue;
		}
		uint64_t el = g->probe_last >= 0 ?
			      gate_span_ns(g->probe[g->probe_last], g->probe[i]) : 0;
		gs_pace_probe_done(&g->pace, mono_ns(), el);
		g->probe_last = i;
	}
}

/*
 * A probe before this launch on @s.  With GS_PACE_PENDING pending, wait for
 * the oldest first (never past the grant's end): the run-ahead is capped
 * by the GPU's real progress.
 */
void gate_probe_record(struct gate *g, CUstream s)
{
	int slot;

	if (!g->have_events || !gate_drv.event_query || gate_capturing(s))
		return;
	gate_probes_poll(g);
	while ((slot = gs_pace_probe_slot(&g->pace)) < 0) {
		uint64_t now = mono_ns(), until = atomic_load(&g->until);
		if (now >= until)
			return;
		poll_nap(now, until);
		gate_probes_poll(g);
	}
	if (gate_drv.event_record(g->probe[slot], gate_drv_stream(s)) != CUDA_SUCCESS)
		gs_pace_probe_cancel(&g->pace);
}

/*
 * Stopped with no probe pending: one at the queue's tail, so that waiting
 * for the queue ends when it really does, and an over-estimated chat
 * (which keeps the queue too short for a backlogged sample) comes down.
 */
static void probe_tail(struct gate *g, CUstream s)
{
	int slot;

	if (gs_pace_oldest(&g->pace) >= 0 || gate_capturing(s))
		return;
	slot = gs_pace_tail_slot(&g->pace);
	if (slot >= 0 && gate_drv.event_record(g->probe[slot], gate_drv_stream(s)) != CUDA_SUCCESS)
		gs_pace_probe_cancel(&g->pace);
}

/*
 * Paced, a launch under a grant (the mutex held): may it go now?  A launch
 * whose queue would outlast the grant renews early; granted, it waits for
 * the queue to fit the new grant; refused, the process drains, gives the
 * GPU back and waits for its next turn (gate_exchange()).  Every new grant
 * goes back through the pacer.  False: the device is no longer gated.
 */
bool gate_paced_launch(struct gate *g, int dev, CUstream s)
{
	bool renewed = false;

	for (;;) {
		uint64_t now = mono_ns(), until = atomic_load(&g->until);
		if (g->how != HOW_MODULE && g->how != HOW_STANDALONE)
			return false;
		if (now >= until) {
			gate_exchange(g, dev, false);
			renewed = false;
			continue;
		}
		if (!g->in_slice)
			return true;	/* a native grant: nothing to pace */
		enum gs_pace_verdict v = gs_pace_launch(&g->pace, now, until);
		if (v == GS_PACE_STOP && g->have_events) {
			gate_probes_poll(g);		/* the GPU may be further on */
			v = gs_pace_launch(&g->pace, now, until);
			if (v == GS_PACE_STOP)
				probe_tail(g, s);
		}
		if (v == GS_PACE_PROBE)
			gate_probe_record(g, s);
		if (v != GS_PACE_STOP)
			return true;
		if (renewed) {
			/* Renewed, but the queue is still longer: let it run. */
			poll_nap(now, until);
			continue;
		}
		gate_exchange(g, dev, true);
		renewed = true;
	}
}
