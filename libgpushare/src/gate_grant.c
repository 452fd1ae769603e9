// SPDX-License-Identifier: Apache-2.0
/*
 * A device's grants (gate.h): how the device is gated, a new grant, and
 * the exchange at a grant's end (renew, or drain, give back and wait).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gate.h"
#include "pace.h"

static _Atomic uint64_t next_gen;

/* A new grant until @until: a new slice (nothing tracked yet) when @in_slice. */
void gate_granted(struct gate *g, uint64_t until, bool in_slice)
{
	g->in_slice = in_slice;
	g->nstreams = 0;
	g->overflow = false;
	g->rel_skip = false;
	atomic_store(&g->gen, atomic_fetch_add(&next_gen, 1) + 1);
	atomic_store(&g->until, until);
	if (in_slice)
		gate_releaser_kick();
}

void gate_pass(struct gate *g)
{
	g->how = HOW_PASS;
	g->in_slice = false;
	atomic_store(&g->until, NEVER);
}

/* The first slow path on @dev: how it is gated. */
void gate_setup(struct gate *g, int dev)
{
	if (atomic_load(&gate_mode) == MODE_MODULE && gate_module_setup(g, dev))
		return;
	gate_standalone_setup(g, dev);
}

/* The slice's work is done (@used ns of GPU time): give the GPU back. */
void gate_give_back(struct gate *g, int dev, uint64_t used)
{
	if (g->how == HOW_MODULE) {
		struct gpushare_sched q;
		gate_sched_op(dev, GPUSHARE_SCHED_RELEASE, 0, used, &q);
	} else {
		gs_sched_release(&g->core, &g->client, used, mono_ns());
	}
	g->in_slice = false;
	if (g->paced) {
		if (g->have_events)
			gate_probes_poll(g);
		/* A drain that gave up leaves the queue (and its probes) as is. */
		if (!g->nlate) {
			gs_pace_drained(&g->pace, mono_ns());
			g->probe_last = -1;
		}
	}
}

/* A drain's bound: paced, drain_ns (kept alive by heartbeats); else a slice. */
static uint64_t drain_bound(const struct gate *g)
{
	return g->held ? g->drain_ns : g->slice_ns;
}

/*
 * The grant is over: renew it, or drain, give back and wait for the next.
 *
 * Only the module renews without draining, and only on time (within a
 * grace of the grant's end): the core charges a slice's holder for the
 * hold, and learns what the work really took only at the release, so a
 * process that queued work far past its slice (or came back long after
 * it) must drain and report it before it gets more.  Standalone, the
 * process is alone: it drains every slice, which costs the GPU one launch
 * latency per slice and keeps the queue from running ahead of the share.
 */
void gate_exchange(struct gate *g, int dev, bool early)
{
	bool module = g->how == HOW_MODULE;

	if (g->in_slice) {
		uint64_t until = atomic_load(&g->until);
		bool on_time = early || mono_ns() < until + g->slice_ns / 4;
		if (module && on_time && gate_module_renew(g, dev, early))
			return;
		/*
		 * Closed until the next grant: every launch waits on the mutex
		 * (an early stop drains before the grant's end, and launches
		 * of other threads must not slip in behind the drain).
		 */
		atomic_store(&g->until, 0);
		uint64_t used = 0;
		gate_drain(g, drain_bound(g), true, &used);
		gate_give_back(g, dev, used);
	}
	if (module)
		gate_module_acquire(g, dev);
	else
		gate_standalone_acquire(g);
}
