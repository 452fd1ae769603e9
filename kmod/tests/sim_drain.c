// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The deep-queue model's drains and releaser (sim.h).  A drain records an
 * end event on the process's stream and polls it every POLL_NS; the new
 * gate sends a heartbeat (EXTEND) every slice/8 meanwhile and waits up to
 * drain_ns, the old one a slice (its releaser a quarter slice, then it
 * leaves the slice for a slice).  Work a drain did not see end is reported
 * once it has (keep_late).  The release reports the span of the slice's
 * events: a start event before its first launch, the end event.
 */
#include "sim.h"

static u64 span(const struct sim_mark *a, const struct sim_mark *b)
{
	return a->at != NEVER && b->at != NEVER && b->at > a->at ?
	       b->at - a->at : 0;
}

/* Work left running by earlier drains: what has ended since. */
static u64 late_done(struct sim_proc *p)
{
	u64 used = 0;
	int i, k = 0;

	for (i = 0; i < p->nlate; i++) {
		if (p->late_end[i].at == NEVER) {
			p->late_start[k] = p->late_start[i];
			p->late_end[k++] = p->late_end[i];
			continue;
		}
		used += span(&p->late_start[i], &p->late_end[i]);
	}
	p->nlate = k;
	return used;
}

/* Completed probes, oldest first, to the pacer. */
void sim_reap(struct sim_proc *p)
{
	struct sim_mark *m;
	int slot;

	while ((slot = gs_pace_oldest(&p->pace)) >= 0 &&
	       p->probe[slot].at != NEVER) {
		m = &p->probe[slot];
		gs_pace_probe_done(&p->pace, sim.now,
				   p->probe_have ? m->at - p->probe_at : 0);
		p->probe_have = true;
		p->probe_at = m->at;
	}
}

void gate_arm(struct sim_proc *p)
{
	u64 t = NEVER;

	if (p->rel_drain)
		return;
	if (p->hogging)
		t = p->next_hb;		/* its heartbeats; it releases itself */
	else if (p->in_slice)
		t = sim_max(p->until + sim_slice() / 8, p->rel_retry);
	p->rel_wake = t;
}

/*
 * The slice's work is done (or left running): give the GPU back.  The
 * gate resets its pacer after every drain, even a bounded one.
 */
void sim_give_back(struct sim_proc *p, u64 used)
{
	sim_release(p, used);
	p->in_slice = false;
	p->timed = false;
	p->hogging = false;
	p->releases++;
	sim_reap(p);
	gs_pace_drained(&p->pace, sim.now);
	p->probe_have = false;
	p->fresh = true;
	gate_arm(p);
}

void sim_drain_start(struct sim_proc *p, u64 bound)
{
	sim_mark(p, &p->end);
	p->deadline = sim.now + bound;
	p->hb_last = 0;
	p->next_hb = sim.now;
}

/* The new gate's drain bound (EVIL_LATE: past its forced end). */
u64 sim_drain_bound(const struct sim_proc *p)
{
	if (p->evil == EVIL_LATE)
		return (p->until > sim.now ? p->until - sim.now : 0) +
		       sim_grace() + 2 * sim_slice();
	return sim.cfg.drain_ns;
}

/*
 * One poll of a drain: 1 the GPU is given back, 0 not yet (*@wake set),
 * -1 (@keep false: the legacy releaser) unfinished at its bound.
 */
int sim_drain_poll(struct sim_proc *p, bool keep, u64 *wake)
{
	bool ended = p->end.at != NEVER;
	u64 used;

	if (sim_new() && p->evil != EVIL_LATE && sim.now >= p->next_hb)
		sim_heartbeat(p);
	if (ended && p->evil != EVIL_LATE) {
		used = p->timed ? span(&p->start, &p->end) : 0;
		sim_give_back(p, used + late_done(p));
		return 1;
	}
	if (sim.now < p->deadline) {
		*wake = sim_min(sim.now + POLL_NS, p->deadline);
		if (sim_new() && p->evil != EVIL_LATE)
			*wake = sim_min(*wake, p->next_hb);
		return 0;
	}
	if (!keep)
		return -1;
	if (!ended && p->timed && p->nlate < SIM_LATE) {
		p->late_start[p->nlate] = p->start;
		p->late_end[p->nlate++] = p->end;
	}
	used = ended && p->timed ? span(&p->start, &p->end) : 0;
	sim_give_back(p, used + late_done(p));
	return 1;
}

/* EVIL_EARLY's queued work at a release (in the measuring window). */
void sim_early_tail(struct sim_proc *p)
{
	if (sim.now >= sim.win_start && sim.now < sim.win_end)
		p->tail_ns += sim_queued_ns(p);
}

static void rel_done(struct sim_proc *p, int r)
{
	p->rel_drain = false;
	if (r < 0)
		p->rel_retry = sim.now + sim_slice();	/* still working */
	if (p->gst == G_LOCKED) {
		p->gst = G_OUT;
		p->app_wake = sim.now;
	}
	gate_arm(p);
}

void gate_releaser(struct sim_proc *p)
{
	int r;

	if (p->rel_drain) {
		r = sim_drain_poll(p, sim_new(), &p->rel_wake);
		if (r)
			rel_done(p, r);
		return;
	}
	if (p->hogging && sim.now >= p->next_hb)
		sim_heartbeat(p);
	if (p->hogging || !p->in_slice || sim.now < p->until + sim_slice() / 8 ||
	    sim.now < p->rel_retry) {
		gate_arm(p);
		return;
	}
	if (p->gst != G_OUT) {
		/* The application's thread is in the gate: it decides. */
		p->rel_retry = sim.now + MS;
		gate_arm(p);
		return;
	}
	p->rel_retry = 0;
	if (p->evil == EVIL_EARLY) {
		sim_early_tail(p);
		sim_give_back(p, 0);
		return;
	}
	sim_drain_start(p, sim_new() ? sim_drain_bound(p) : sim_max(sim_slice() / 4, MS));
	p->rel_drain = true;
	r = sim_drain_poll(p, sim_new(), &p->rel_wake);
	if (r)
		rel_done(p, r);
}

/*
 * Audited at every event: an honest new gate's process past its slice's
 * end, still in it, has sent a heartbeat within slice/8 and a poll; and
 * no thread waits in the gate for a probe or a fit past until.
 */
void gate_audit(const struct sim_proc *p)
{
	u64 t;

	if (!sim_new() || p->evil)
		return;
	if ((p->gst == G_PROBE || p->gst == G_FIT) && p->app_wake > p->until)
		sim.audit.wait_bad++;
	if (!p->in_slice || sim.now <= p->until)
		return;
	t = sim_max(p->until, p->hb_last);
	if (sim.now - t > sim_slice() / 8 + POLL_NS)
		sim.audit.wait_bad++;
}
