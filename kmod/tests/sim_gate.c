// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The gates of the deep-queue model (sim.h), on the application's thread.
 *
 * GATE_NEW, libgpushare/src/gate*.c's paced gate (ABI 4; gate_pace.c's
 * gate_paced_launch() and gate_probe_record()), with one addition of this
 * model (gs_pace.h's tail probe, no_tail: without it):
 *   - under a grant (now < until) each launch asks the pacer: GO launches;
 *     PROBE records a probe event, then launches (with GS_PACE_PENDING
 *     pending it first waits for the oldest, polling every POLL_NS; at
 *     until the launch goes unprobed); STOP looks at the probes and asks
 *     again, then (with no probe pending) records one at the queue's tail
 *     and renews early: granted, the launch goes back through the pacer
 *     (still STOP: it waits, polling, never past until, for the queue to
 *     fit); refused, it stops submitting, drains and gives the GPU back;
 *   - at until, within a grace of it: NOWAIT renewal; else, or refused, it
 *     drains (sim_drain.c) and gives the GPU back;
 *   - then a blocking ACQUIRE (sim_sched.c has the wake-ups).
 * GATE_LEGACY, the gate of 94b5eb2 (before ABI 4): no pacer, no
 * heartbeat; at until, NOWAIT renewal within a quarter slice of it, else
 * a drain bounded by a slice.
 * A tenant (sim.h's enum sim_evil) changes the protocol where it says.
 */
#include "sim.h"

static void launched(struct sim_proc *p)
{
	p->renewed = false;
	p->fresh = false;
	if (!p->timed) {
		sim_mark(p, &p->start);
		p->timed = true;
	}
}

static void granted(struct sim_proc *p, u64 until)
{
	p->in_slice = true;
	p->until = until;
	p->timed = false;
	p->renewed = false;
	gate_arm(p);
}

static void renewed(struct sim_proc *p, u64 until)
{
	p->until = until;
	p->renewed = true;
	gate_arm(p);
}

static bool acquire_blocking(struct sim_proc *p)
{
	u64 u = 0, w;

	if (sim_acquire(p, &u)) {
		granted(p, u);
		return true;
	}
	w = u;
	if (sim.cfg.wake == WAKE_POLL)
		w = sim_min(u, sim.now + STANDIN_NS);
	p->app_wake = sim_max(w, sim.now + MINWAIT_NS);
	return false;
}

/* Wait in the gate for a probe or for the queue to fit, never past until. */
static bool wait_in(struct sim_proc *p, enum sim_gst st)
{
	p->gst = st;
	p->app_wake = sim_min(sim.now + POLL_NS, p->until);
	return false;
}

/* Stop submitting: drain (EVIL_EARLY: give the GPU back at once). */
static void stop(struct sim_proc *p)
{
	if (p->evil == EVIL_EARLY) {
		sim_early_tail(p);
		sim_give_back(p, 0);
		p->gst = G_ACQ;
		return;
	}
	sim_drain_start(p, sim_drain_bound(p));
	p->gst = G_DRAIN;
}

/* EVIL_HOG, refused: on past its slice, paced to the forced end's bound. */
static bool hog(struct sim_proc *p)
{
	if (p->evil != EVIL_HOG || p->hogging)
		return false;
	p->hogging = true;
	p->until += sim.cfg.drain_ns - sim_slice() / 8;
	sim_heartbeat(p);
	gate_arm(p);
	return true;
}

/*
 * Stopped with no probe pending: one at the queue's tail, so that a wait
 * ends when the queue really does (and an over-estimate comes down).
 */
static void tail(struct sim_proc *p)
{
	int slot;

	if (sim.cfg.no_tail || gs_pace_oldest(&p->pace) >= 0)
		return;
	slot = gs_pace_tail_slot(&p->pace);
	if (slot >= 0)
		sim_mark(p, &p->probe[slot]);
}

/* A probe's slot, then the launch; or a wait for the oldest probe. */
static bool probe(struct sim_proc *p)
{
	int slot;

	sim_reap(p);
	slot = gs_pace_probe_slot(&p->pace);
	if (slot < 0)
		return wait_in(p, G_PROBE);
	sim_mark(p, &p->probe[slot]);
	p->gst = G_OUT;
	launched(p);
	return true;
}

/*
 * The states both gates share (G_FIT only the new gate's): a blocking
 * ACQUIRE, a drain, the wait for the queue to fit, the releaser holding
 * the lock.  True once in a grant (p->gst G_OUT); false: the thread waits.
 */
static bool gate_ready(struct sim_proc *p)
{
	for (;;) {
		switch (p->gst) {
		case G_ACQ:
			if (!acquire_blocking(p))
				return false;
			break;
		case G_DRAIN:
			if (!sim_drain_poll(p, true, &p->app_wake))
				return false;
			p->gst = G_ACQ;
			continue;
		case G_FIT:
			sim_reap(p);
			break;
		default:
			if (p->rel_drain) {
				p->gst = G_LOCKED;
				p->app_wake = NEVER;
				return false;
			}
			break;
		}
		p->gst = G_OUT;
		if (p->in_slice)
			return true;
		p->gst = G_ACQ;
	}
}

/* Past until, within a grace of it: a NOWAIT renewal; true when granted. */
static bool renew_late(struct sim_proc *p)
{
	u64 u;

	if (sim.now >= p->until + sim_grace() || !sim_acquire(p, &u))
		return false;
	p->until = u;
	gate_arm(p);
	return true;
}

static bool new_launch(struct sim_proc *p)
{
	enum gs_pace_verdict v;
	u64 u;

	for (;;) {
		if (p->gst == G_PROBE) {
			if (sim.now < p->until)
				return probe(p);
			/* At the grant's end: the launch goes, unprobed. */
			p->gst = G_OUT;
			launched(p);
			return true;
		}
		if (!gate_ready(p))
			return false;
		if (sim.now < p->until) {
			v = gs_pace_launch(&p->pace, sim.now, p->until);
			if (v == GS_PACE_STOP) {
				sim_reap(p);	/* the GPU may be further on */
				v = gs_pace_launch(&p->pace, sim.now, p->until);
			}
			if (p->fresh && v == GS_PACE_STOP && !p->evil)
				sim.audit.empty_stops++;
			if (v == GS_PACE_GO) {
				launched(p);
				return true;
			}
			if (v == GS_PACE_PROBE)
				return probe(p);
			tail(p);
			if (p->renewed)
				return wait_in(p, G_FIT);
			p->early_stops++;
			if (!p->hogging && sim_renew(p, &u)) {
				renewed(p, u);
				continue;
			}
			if (!hog(p))
				stop(p);
			continue;
		}
		/* The grant is over. */
		if (!p->hogging && renew_late(p))
			continue;
		if (!hog(p))
			stop(p);
	}
}

static bool legacy_launch(struct sim_proc *p)
{
	for (;;) {
		if (!gate_ready(p))
			return false;
		if (sim.now < p->until) {
			launched(p);
			return true;
		}
		if (renew_late(p))
			continue;
		if (p->evil == EVIL_EARLY) {
			stop(p);
			continue;
		}
		sim_drain_start(p, sim_max(sim_slice(), MS));
		p->gst = G_DRAIN;
	}
}

bool gate_launch(struct sim_proc *p)
{
	return sim_new() ? new_launch(p) : legacy_launch(p);
}
