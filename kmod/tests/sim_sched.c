// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The deep-queue model's calls into the scheduler core (sim.h), as the
 * module makes them for the gate: the waiters' wake-ups (WAKE_MODULE: by a
 * release that says so, or a call that changes the holder, the slice or
 * the offer; WAKE_POLL, the stand-in: none, its waiters poll), what a
 * tenant reports, and every RELEASE audited (S6: a refund is a transfer).
 */
#include "sim.h"

struct snap {
	const struct gs_sched_ent *holder, *offer;
	u64 slice;
};

static struct snap snap(void)
{
	return (struct snap){ sim.s.holder, sim.s.offer, sim.s.slice };
}

/* The module's wake-ups after a call (see gs_dev.c). */
static void kick(struct snap b, bool changed)
{
	if (changed || b.holder != sim.s.holder || b.offer != sim.s.offer ||
	    b.slice != sim.s.slice)
		gate_wake_all();
}

void gate_wake_all(void)
{
	int i;

	if (sim.cfg.wake != WAKE_MODULE)
		return;
	for (i = 0; i < sim.cfg.n; i++)
		if (sim.p[i].gst == G_ACQ)
			sim.p[i].app_wake = sim.now;
	sim.rot++;
}

bool sim_acquire(struct sim_proc *p, u64 *until)
{
	struct snap b = snap();
	bool ok = gs_sched_acquire(&sim.s, &p->c, sim.now, until) ==
		  GS_SCHED_GRANT;

	if (ok)
		p->granted_at = sim.now;
	kick(b, false);
	return ok;
}

bool sim_renew(struct sim_proc *p, u64 *until)
{
	struct snap b = snap();
	bool ok = gs_sched_renew(&sim.s, &p->c, sim.now, until) ==
		  GS_SCHED_GRANT;

	if (ok)
		p->granted_at = sim.now;
	kick(b, false);
	return ok;
}

void sim_heartbeat(struct sim_proc *p)
{
	u64 u;

	if (p->hb_last && sim.now > p->until && !p->evil &&
	    sim.now - p->hb_last > sim.audit.hb_gap)
		sim.audit.hb_gap = sim.now - p->hb_last;
	gs_sched_extend(&sim.s, &p->c, sim.now, &u);
	p->hb_last = sim.now;
	p->next_hb = sim.now + sim_slice() / 8;
}

/* What the tenant reports for @used ns. */
static u64 report(const struct sim_proc *p, u64 used)
{
	switch (p->evil) {
	case EVIL_X10:
		return used > NEVER / 10 ? NEVER : used * 10;
	case EVIL_MAX:
	case EVIL_LATE:
		return NEVER;
	case EVIL_ZERO:
	case EVIL_EARLY:
		return 0;
	default:
		return used;
	}
}

/*
 * RELEASE, audited: the tokens it gives others (refunds, and the current
 * holder's hold shortened) are at most those it takes from the reporter.
 */
void sim_release(struct sim_proc *p, u64 used)
{
	struct gs_sched *s = &sim.s;
	struct gs_sched_ent *me = &sim.ctr[p->ctr].e;
	const struct gs_sched_ent *h;
	s64 before[SIM_MAXP];
	u64 hs, gain = 0, loss;
	struct snap b = snap();
	bool late, r;
	int i;

	/* Tokens up to now first: what changes below is the release's. */
	gs_sched_set_prio_ratio(s, s->prio_ratio, sim.now);
	for (i = 0; i < sim.cfg.n; i++)
		before[i] = sim.ctr[i].e.tokens;
	h = s->holder;
	hs = s->hold_start;
	late = p->c.slice && (s->holder != me || p->c.slice != s->slice);
	r = gs_sched_release(s, &p->c, report(p, used), sim.now);
	for (i = 0; i < sim.cfg.n; i++)
		if (i != p->ctr && sim.ctr[i].e.tokens > before[i])
			gain += (u64)(sim.ctr[i].e.tokens - before[i]);
	if (h && h == s->holder && h != me && s->hold_start > hs)
		gain += s->hold_start - hs;
	loss = before[p->ctr] > me->tokens ?
	       (u64)(before[p->ctr] - me->tokens) : 0;
	if (late || gain)
		sim.audit.taken += loss;
	sim.audit.credited += gain;
	if (gain > loss)
		sim.audit.refund_bad++;
	kick(b, r);
}
