// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * gpushare compute scheduler core: turns.  Who gets the GPU when it is
 * free (gs_pick()), slices granted, joined, renewed, extended and ended
 * (by the last release, or by force at the grace's end), and the calls a
 * client makes: gs_sched_acquire(), gs_sched_renew(), gs_sched_extend(),
 * gs_sched_release().  gs_sched.h has the model; the caller serialises
 * every call on one struct gs_sched.
 */
#include "gs_sched_int.h"

static void gs_wait(struct gs_sched_client *c)
{
	if (!c->waiting) {
		c->waiting = true;
		c->ent->waiting++;
	}
}

static void gs_unwait(struct gs_sched_client *c)
{
	if (c->waiting) {
		c->waiting = false;
		if (c->ent->waiting)
			c->ent->waiting--;
	}
}

/* The holder's slice is over: it no longer holds the GPU. */
void gs_end_slice(struct gs_sched *s, u64 end)
{
	struct gs_sched_ent *h = s->holder;

	gs_charge_hold(s, s->hold_start, end);
	/* Clients that did not release are late now (see release). */
	h->late += h->in_slice;
	h->in_slice = 0;
	s->holder = NULL;
	s->offer = NULL;
}

/*
 * A holder whose clients did not release within the grace loses the GPU
 * at the grace's end (not later: the GPU was not its own past it).  Its
 * clients' later reports are charged beyond that end, which is kept.
 */
static bool gs_expire(struct gs_sched *s, u64 now)
{
	struct gs_sched_forced *f;
	u64 end;

	if (!s->holder)
		return false;
	end = s->hold_grace;
	if (now < end)
		return false;
	s->forced_ends++;
	f = &s->forced[s->forced_next++ % GS_SCHED_FORCED];
	f->slice = s->slice;
	f->end = end;
	f->cursor = end;
	f->busy = end;
	f->ent = s->holder;
	gs_end_slice(s, end);
	return true;
}

static inline bool gs_waits(const struct gs_sched_ent *e,
			    const struct gs_sched_ent *self)
{
	return e == self || (e->waiting && !e->stale);
}

static inline bool gs_before(const struct gs_sched_ent *a,
			     const struct gs_sched_ent *b)
{
	return !b || a->last_grant < b->last_grant;
}

/*
 * Who gets the GPU if it is free now, among the waiting entities (@self
 * counts as waiting)?  *@free: the slice is a free one (see gs_charge()).
 * NULL: nobody eligible, the GPU stays idle.
 */
static struct gs_sched_ent *gs_pick(const struct gs_sched *s,
				    const struct gs_sched_ent *self,
				    bool *free)
{
	struct gs_sched_ent *best = NULL;
	u32 nwait = 0, i;

	for (i = 0; i < s->nents; i++)
		nwait += gs_waits(s->ents[i], self);

	/* 1. High priority: within its rate while others wait. */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->highprio && gs_waits(e, self) &&
		    (e->tokens >= 0 || nwait == 1) && gs_before(e, best))
			best = e;
	}
	if (best) {
		*free = nwait == 1;
		return best;
	}
	/* 2. Rate-limited entities with tokens, round robin. */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (!e->highprio && e->rate && e->tokens >= 0 &&
		    gs_waits(e, self) && gs_before(e, best))
			best = e;
	}
	if (best) {
		*free = false;
		return best;
	}
	/* 3. Leftovers: to anyone under policy 4, else to best effort. */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (gs_waits(e, self) && gs_before(e, best) &&
		    (s->policy == GS_POLICY_WEAK ||
		     (!e->rate && !e->highprio)))
			best = e;
	}
	*free = true;
	return best;
}

/* When the first waiting entity in debt will have tokens again. */
static u64 gs_next_eligible(const struct gs_sched *s,
			    const struct gs_sched_ent *self, u64 now)
{
	u64 best = GS_U64_MAX, t, need;
	u32 i;

	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (!gs_waits(e, self) || !e->rate || e->tokens >= 0)
			continue;
		need = gs_sub0((u64)(-e->tokens) * GS_SCHED_PPM, e->frac);
		t = gs_add(now, gs_div(need + e->rate - 1, e->rate));
		if (t < best)
			best = t;
	}
	if (best == GS_U64_MAX)
		best = gs_add(now, s->slice_ns);
	return best > now ? best : gs_add(now, 1);
}

/* @c is in its entity's slice from now on. */
static void gs_join(struct gs_sched *s, struct gs_sched_client *c, u64 now)
{
	if (c->slice != s->slice) {
		if (c->slice) {
			gs_leave_late(s, c);
		} else {
			c->since = now;
			c->covered = 0;
		}
		c->slice = s->slice;
		c->granted = now;
		c->ent->in_slice++;
	}
	gs_unwait(c);
}

static void gs_grant_slice(struct gs_sched *s, struct gs_sched_ent *e,
			   bool free, u64 now)
{
	if (s->holder != e) {
		s->holder = e;
		s->slice++;
		e->in_slice = 0;
	}
	s->hold_start = now;
	s->hold_until = gs_add(now, s->slice_ns);
	s->hold_grace = gs_add(s->hold_until, gs_grace(s));
	s->hold_free = free;
	s->offer = NULL;
	e->last_grant = now;
}

/*
 * @c's entity holds the GPU: the hold so far is charged, and a new slice
 * starts now for @c if it is still the entity's turn (true, the grant's
 * end in *@until); else *@until is the slice's forced end.
 */
static bool gs_renew_turn(struct gs_sched *s, struct gs_sched_client *c,
			  u64 now, u64 *until)
{
	struct gs_sched_ent *e = c->ent;
	bool free;

	gs_charge_hold(s, s->hold_start, now);
	s->hold_start = now;
	if (gs_pick(s, e, &free) != e) {
		*until = s->hold_grace;
		return false;
	}
	gs_grant_slice(s, e, free, now);
	gs_join(s, c, now);
	*until = s->hold_until;
	return true;
}

enum gs_sched_answer gs_sched_acquire(struct gs_sched *s,
				      struct gs_sched_client *c,
				      u64 now, u64 *until)
{
	struct gs_sched_ent *e = c->ent, *p;
	bool free;

	now = gs_advance(s, now);
	gs_expire(s, now);
	/*
	 * A late client (its slice was taken away) asking again leaves that
	 * slice as a release of 0 would: its tail is charged by the clock, as
	 * it is for a release (else asking instead of releasing escapes it).
	 */
	if (e && c->slice && !gs_holding(s, c))
		gs_leave(s, c, 0, now);
	/* Native, or a process of no container: nothing to schedule. */
	if (gs_native(s) || !e) {
		if (e)
			gs_unwait(c);
		*until = gs_add(now, s->slice_ns);
		return GS_SCHED_GRANT;
	}
	e->stale = false;

	if (s->holder == e) {
		if (now < s->hold_until) {
			gs_join(s, c, now);
			*until = s->hold_until;
			return GS_SCHED_GRANT;
		}
		/* The slice is over: renew it if it is still e's turn. */
		if (gs_renew_turn(s, c, now, until))
			return GS_SCHED_GRANT;
		/* e keeps the GPU until its clients release or the grace ends. */
		gs_wait(c);
		return GS_SCHED_WAIT;
	}

	gs_wait(c);
	if (s->holder) {
		/*
		 * A free slice is free only while nobody else wants the GPU
		 * (a waiter that was between its release and its next ask
		 * when it was granted): from now on it is charged.
		 */
		if (s->hold_free) {
			gs_charge_hold(s, s->hold_start, now);
			s->hold_start = now;
			s->hold_free = false;
		}
		*until = now < s->hold_until ? s->hold_until : s->hold_grace;
		return GS_SCHED_WAIT;
	}

	for (;;) {
		p = gs_pick(s, e, &free);
		if (p == e) {
			gs_grant_slice(s, e, free, now);
			gs_join(s, c, now);
			*until = s->hold_until;
			return GS_SCHED_GRANT;
		}
		if (!p) {
			*until = gs_next_eligible(s, e, now);
			return GS_SCHED_WAIT;
		}
		/*
		 * p is due: it is woken and takes the GPU.  If it has not come
		 * within a grace (stopped, or gone without detaching), it is
		 * passed over until one of its clients asks again.
		 */
		if (s->offer != p) {
			s->offer = p;
			s->offer_at = now;
		}
		if (now < gs_add(s->offer_at, gs_grace(s))) {
			*until = gs_add(s->offer_at, gs_grace(s));
			return GS_SCHED_WAIT;
		}
		/*
		 * The GPU stood idle a grace for p: that is p's cost, not the
		 * others' (or a client that only ever asks while others hold
		 * the GPU, never taking it, would idle it at every change of
		 * hands for free), and p goes to the back of the round robin.
		 */
		gs_forfeit(s, p, gs_grace(s), free);
		p->last_grant = now;
		p->stale = true;
		s->offer = NULL;
	}
}

enum gs_sched_answer gs_sched_renew(struct gs_sched *s,
				    struct gs_sched_client *c,
				    u64 now, u64 *until)
{
	now = gs_advance(s, now);
	gs_expire(s, now);
	if (gs_native(s) || !gs_holding(s, c) || now >= s->hold_until) {
		*until = s->holder ? s->hold_grace : now;
		return GS_SCHED_WAIT;
	}
	/* As at the slice's end, but no waiter if refused. */
	return gs_renew_turn(s, c, now, until) ? GS_SCHED_GRANT : GS_SCHED_WAIT;
}

bool gs_sched_extend(struct gs_sched *s, struct gs_sched_client *c, u64 now,
		     u64 *until)
{
	u64 end, bound;

	now = gs_advance(s, now);
	gs_expire(s, now);
	if (gs_native(s) || !gs_holding(s, c))
		return false;
	end = gs_add(now, gs_grace(s));
	bound = gs_add(s->hold_until, s->drain_ns);
	if (end > bound)
		end = bound;
	if (end > s->hold_grace)
		s->hold_grace = end;
	*until = s->hold_grace;
	return true;
}

bool gs_sched_release(struct gs_sched *s, struct gs_sched_client *c,
		      u64 used_ns, u64 now)
{
	struct gs_sched_ent *e = c->ent;
	bool changed, waited = c->waiting;

	if (!e)
		return false;
	now = gs_advance(s, now);
	changed = gs_expire(s, now);
	gs_unwait(c);
	/*
	 * Its entity no longer waits: an offer to it, or a decision that
	 * counted it among the waiters (high priority alone), may change.
	 */
	if (waited && !e->waiting && !gs_live(s, now))
		changed = true;
	if (c->slice && gs_leave(s, c, used_ns, now))
		changed = true;
	return changed;
}
