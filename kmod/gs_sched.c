// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * gpushare compute scheduler core (gs_sched.h has the model).
 *
 * Time never goes backwards here: a call whose @now is older than the
 * newest one seen acts at the newest one (no time passes).  Every sum of
 * times saturates, every debt is bounded, so no input overflows.
 */
#include "gs_sched.h"

#ifdef __KERNEL__
#include <linux/math64.h>
#include <linux/stddef.h>

static inline u64 gs_div(u64 a, u64 b)
{
	return div64_u64(a, b);
}

static inline u64 gs_div_rem(u64 a, u32 b, u32 *rem)
{
	return div_u64_rem(a, b, rem);
}
#else
#include <stddef.h>

static inline u64 gs_div(u64 a, u64 b)
{
	return a / b;
}

static inline u64 gs_div_rem(u64 a, u32 b, u32 *rem)
{
	*rem = a % b;
	return a / b;
}
#endif

#define GS_U64_MAX		(~0ull)
#define GS_SLICE_MIN_NS		1000ull
#define GS_SLICE_MAX_NS		(10ull * 1000 * 1000 * 1000)
#define GS_DRAIN_MIN_NS		((u64)GPUSHARE_DRAIN_US_MIN * 1000)
#define GS_DRAIN_MAX_NS		((u64)GPUSHARE_DRAIN_US_MAX * 1000)
#define GS_POLICY_NATIVE	5
#define GS_POLICY_WEAK		4

static inline u64 gs_add(u64 a, u64 b)
{
	return a + b < a ? GS_U64_MAX : a + b;
}

static inline u64 gs_sub0(u64 a, u64 b)
{
	return a > b ? a - b : 0;
}

static inline u64 gs_grace(const struct gs_sched *s)
{
	return GS_SCHED_GRACE(s);
}

/*
 * The deepest debt: a second, a few slices and the longest drain, whatever
 * was reported (a hold can last a slice and drain_ns: below the floor its
 * excess would go uncharged).
 */
static inline s64 gs_floor(const struct gs_sched *s)
{
	return -(s64)(GS_SCHED_SAVE_NS + 4 * s->slice_ns + s->drain_ns);
}

static inline bool gs_native(const struct gs_sched *s)
{
	return s->policy == GS_POLICY_NATIVE;
}

/*
 * An entity that wants the GPU keeps what it accrues while others hold
 * it (their long graphs, their late work), up to a bound; one that wants
 * nothing may save one slice ahead at most.
 */
static inline s64 gs_cap(const struct gs_sched *s,
			 const struct gs_sched_ent *e)
{
	if (e->waiting || e->in_slice || s->holder == e)
		return (s64)(GS_SCHED_SAVE_NS + s->slice_ns);
	return (s64)s->slice_ns;
}

/* Tokens accrue at e->rate ppm, up to gs_cap(). */
static void gs_accrue(const struct gs_sched *s, struct gs_sched_ent *e,
		      u64 dt)
{
	s64 cap = gs_cap(s, e);
	u64 room, need, acc;
	u32 rem;

	if (e->tokens >= cap) {
		e->tokens = cap;
		e->frac = 0;
		return;
	}
	if (!e->rate || !dt)
		return;
	/* room <= cap - floor, so room * PPM fits in 64 bits. */
	room = (u64)(cap - e->tokens);
	need = gs_div(gs_sub0(room * GS_SCHED_PPM, e->frac) + e->rate - 1,
		      e->rate);
	if (dt >= need) {
		e->tokens = cap;
		e->frac = 0;
		return;
	}
	/* dt < need, so dt * rate < room * PPM + rate: no overflow. */
	acc = dt * e->rate + e->frac;
	e->tokens += (s64)gs_div_rem(acc, GS_SCHED_PPM, &rem);
	e->frac = rem;
}

/* Bring every entity's tokens up to @now; returns the time to act at. */
static u64 gs_advance(struct gs_sched *s, u64 now)
{
	u64 dt;
	u32 i;

	if (now <= s->now)
		return s->now;
	dt = now - s->now;
	for (i = 0; i < s->nents; i++)
		gs_accrue(s, s->ents[i], dt);
	s->now = now;
	return now;
}

/*
 * Take @ns of tokens from @e, down to the floor.  Alone (gs_forfeit), for
 * a time the GPU was kept idle for it (an offer it did not take): not GPU
 * time it used, so used_ns stays.  A @free charge takes none, and
 * best-effort entities have no tokens to take.
 */
static u64 gs_forfeit(const struct gs_sched *s, struct gs_sched_ent *e,
		      u64 ns, bool free)
{
	s64 floor = gs_floor(s), before = e->tokens;

	if (free || !e->rate || !ns)
		return 0;
	if (e->tokens <= floor || ns >= (u64)(e->tokens - floor))
		e->tokens = floor;
	else
		e->tokens -= (s64)ns;
	return before > e->tokens ? (u64)(before - e->tokens) : 0;
}

/*
 * Charge @e @ns of GPU time.  A @free charge (a slice nobody eligible
 * wanted: work conservation, or a high-priority entity alone) counts as
 * used but takes no tokens, so that it costs no share once others want
 * theirs.  Returns the tokens it took.
 */
static u64 gs_charge(const struct gs_sched *s, struct gs_sched_ent *e,
		     u64 ns, bool free)
{
	e->used_ns = gs_add(e->used_ns, ns);
	return gs_forfeit(s, e, ns, free);
}

/*
 * Give back the tokens of @ns charged for a hold that others' late work
 * filled.  used_ns stays: it is a counter (procfs gputime, status, metrics)
 * and never goes down; the hold was @e's, even if the GPU was busy.
 */
static void gs_credit(const struct gs_sched *s, struct gs_sched_ent *e,
		      u64 ns, bool free)
{
	s64 cap = gs_cap(s, e);

	if (free || !e->rate)
		return;
	if (ns >= (u64)(cap - e->tokens))
		e->tokens = cap;
	else
		e->tokens += (s64)ns;
}

/* Charge the holder for holding the GPU from @start to @stop. */
static void gs_charge_hold(struct gs_sched *s, u64 start, u64 stop)
{
	struct gs_sched_hold *h;

	if (stop <= start)
		return;
	gs_charge(s, s->holder, stop - start, s->hold_free);
	/* A renewed hold goes on in its entry (renewals do not flush it). */
	h = &s->hist[(s->hist_next + GS_SCHED_HIST - 1) % GS_SCHED_HIST];
	if (s->hist_next && h->ent == s->holder && h->free == s->hold_free &&
	    h->stop == start) {
		h->stop = stop;
		return;
	}
	h = &s->hist[s->hist_next++ % GS_SCHED_HIST];
	*h = (struct gs_sched_hold){
		.ent = s->holder,
		.start = start,
		.stop = stop,
		.free = s->hold_free,
	};
}

/*
 * Late work ran on the GPU from @from to @to (as far as the GPU is
 * serial), and was charged to its entity: whoever held the GPU meanwhile
 * could not use it, so it gets that time back.  The caller bounds @to by
 * the module's clock and the window by the tokens the charge took, so a
 * refund is a transfer, never new tokens.
 */
static void gs_refund(struct gs_sched *s, u64 from, u64 to)
{
	u64 a, b;
	u32 i;

	for (i = 0; i < GS_SCHED_HIST; i++) {
		struct gs_sched_hold *h = &s->hist[i];

		if (!h->ent)
			continue;
		a = from > h->start ? from : h->start;
		b = to < h->stop ? to : h->stop;
		if (a >= b)
			continue;
		gs_credit(s, h->ent, b - a, h->free);
		h->start += b - a;
	}
	if (!s->holder)
		return;
	a = from > s->hold_start ? from : s->hold_start;
	b = to < s->now ? to : s->now;
	if (a < b)
		s->hold_start += b - a;
}

/* Every entity's rate from the policy; true when one of them changed. */
static bool gs_rates(struct gs_sched *s)
{
	u32 max_inst = s->max_inst ? s->max_inst : 1;
	u32 ratio = s->prio_ratio < 100 ? s->prio_ratio : 100;
	u64 wsum = 0, rate;
	u32 online = 0, i;
	bool changed = false;

	/* High-priority entities do not dilute the others' shares. */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->highprio || !e->clients)
			continue;
		online++;
		wsum += e->weight < 100 ? e->weight : 100;
	}
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];
		u64 w = e->weight < 100 ? e->weight : 100;

		if (e->highprio) {
			rate = (u64)ratio * GS_SCHED_PPM / 100;
		} else {
			switch (s->policy) {
			case 0:
				rate = GS_SCHED_PPM / max_inst;
				rate = rate ? rate : 1;
				break;
			case 1:
			case GS_POLICY_WEAK:
				rate = e->clients ? GS_SCHED_PPM / online : 0;
				break;
			case 2:
				rate = e->clients && wsum ?
					gs_div(w * GS_SCHED_PPM, wsum) : 0;
				break;
			case 3:
				rate = w * GS_SCHED_PPM / 100;
				break;
			default:
				rate = 0;
				break;
			}
		}
		changed |= e->rate != (u32)rate;
		e->rate = (u32)rate;
	}
	return changed;
}

/*
 * A slice is in progress: until it ends, every other entity's waiter has
 * been told to ask again at its end at the latest (or is woken when the
 * GPU changes hands before), and nothing but the holder's release can
 * let one in earlier; so a change of the waiting or online set, or of the
 * rates, needs no wake-up then: the waiters see it at their next ask.
 */
static inline bool gs_live(const struct gs_sched *s, u64 now)
{
	return s->holder && now < s->hold_until;
}

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
static void gs_end_slice(struct gs_sched *s, u64 end)
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
static struct gs_sched_forced *gs_forced(struct gs_sched *s, u64 slice)
{
	u32 i;

	for (i = 0; i < GS_SCHED_FORCED; i++)
		if (s->forced[i].slice == slice)
			return &s->forced[i];
	return NULL;
}

/* @c leaves a slice taken away: the hold covered it up to the end. */
static void gs_leave_late(struct gs_sched *s, struct gs_sched_client *c)
{
	struct gs_sched_forced *f = gs_forced(s, c->slice);

	if (f)
		c->covered = gs_add(c->covered, gs_sub0(f->end, c->granted));
	if (c->ent->late)
		c->ent->late--;
}

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

void gs_sched_init(struct gs_sched *s, u64 now)
{
	*s = (struct gs_sched){
		.policy = GPUSHARE_POLICY_DEFAULT,
		.prio_ratio = GPUSHARE_PRIO_RATIO_DEFAULT,
		.max_inst = GPUSHARE_MAX_INST_DEFAULT,
		.slice_ns = GS_SCHED_SLICE_NS,
		.drain_ns = GS_SCHED_DRAIN_NS,
		.now = now,
	};
}

int gs_sched_add(struct gs_sched *s, struct gs_sched_ent *e, u32 weight,
		 u32 highprio, u64 now)
{
	u32 i;

	/* @e may be uninitialised memory: look for it, do not read it. */
	for (i = 0; i < s->nents; i++)
		if (s->ents[i] == e)
			return -EEXIST;
	if (s->nents >= GS_SCHED_MAX)
		return -ENOSPC;
	gs_advance(s, now);
	*e = (struct gs_sched_ent){
		.weight = weight,
		.highprio = highprio,
		.added = true,
	};
	s->ents[s->nents++] = e;
	gs_rates(s);
	return 0;
}

void gs_sched_del(struct gs_sched *s, struct gs_sched_ent *e, u64 now)
{
	u32 i, j;

	for (i = 0; i < s->nents; i++)
		if (s->ents[i] == e)
			break;
	if (i == s->nents)
		return;
	now = gs_advance(s, now);
	if (s->holder == e)
		gs_end_slice(s, now);
	if (s->offer == e)
		s->offer = NULL;
	for (i = 0; i < GS_SCHED_HIST; i++)
		if (s->hist[i].ent == e)
			s->hist[i].ent = NULL;
	for (i = 0; i < GS_SCHED_FORCED; i++)
		if (s->forced[i].ent == e)
			s->forced[i].ent = NULL;
	for (i = 0, j = 0; i < s->nents; i++)
		if (s->ents[i] != e)
			s->ents[j++] = s->ents[i];
	s->nents = j;
	e->added = false;
	gs_rates(s);
}

void gs_sched_set_policy(struct gs_sched *s, u32 policy, u64 now)
{
	s64 slice = (s64)s->slice_ns;
	u32 i;

	now = gs_advance(s, now);
	/* The hold so far is part of the old debts too. */
	if (s->holder) {
		gs_charge_hold(s, s->hold_start, now);
		s->hold_start = now;
	}
	s->policy = policy;
	/*
	 * Old debts are forgiven and savings cut to a slice, so the new
	 * shares hold from the next decision (a debt would be paid in idle
	 * time when the new rates add up to the whole GPU).
	 */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->tokens < 0)
			e->tokens = 0;
		if (e->tokens > slice)
			e->tokens = slice;
	}
	gs_rates(s);
}

void gs_sched_set_prio_ratio(struct gs_sched *s, u32 prio_ratio, u64 now)
{
	gs_advance(s, now);
	s->prio_ratio = prio_ratio;
	gs_rates(s);
}

void gs_sched_set_max_inst(struct gs_sched *s, u32 max_inst, u64 now)
{
	gs_advance(s, now);
	s->max_inst = max_inst;
	gs_rates(s);
}

/* After the floor moved (and, @cap, the savings were cut to a slice). */
static void gs_clamp_tokens(struct gs_sched *s, bool cap)
{
	s64 floor = gs_floor(s);
	u32 i;

	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->tokens < floor)
			e->tokens = floor;
		if (cap && e->tokens > (s64)s->slice_ns)
			e->tokens = (s64)s->slice_ns;
	}
}

void gs_sched_set_slice(struct gs_sched *s, u64 slice_ns, u64 now)
{
	gs_advance(s, now);
	if (!slice_ns)
		slice_ns = GS_SCHED_SLICE_NS;
	if (slice_ns < GS_SLICE_MIN_NS)
		slice_ns = GS_SLICE_MIN_NS;
	if (slice_ns > GS_SLICE_MAX_NS)
		slice_ns = GS_SLICE_MAX_NS;
	s->slice_ns = slice_ns;
	gs_clamp_tokens(s, true);
}

void gs_sched_set_drain(struct gs_sched *s, u64 drain_ns, u64 now)
{
	gs_advance(s, now);
	if (!drain_ns)
		drain_ns = GS_SCHED_DRAIN_NS;
	if (drain_ns < GS_DRAIN_MIN_NS)
		drain_ns = GS_DRAIN_MIN_NS;
	if (drain_ns > GS_DRAIN_MAX_NS)
		drain_ns = GS_DRAIN_MAX_NS;
	s->drain_ns = drain_ns;
	gs_clamp_tokens(s, false);
}

void gs_sched_set_weight(struct gs_sched *s, struct gs_sched_ent *e,
			 u32 weight, u64 now)
{
	gs_advance(s, now);
	e->weight = weight;
	gs_rates(s);
}

void gs_sched_set_highprio(struct gs_sched *s, struct gs_sched_ent *e,
			   u32 highprio, u64 now)
{
	gs_advance(s, now);
	e->highprio = highprio;
	gs_rates(s);
}

void gs_sched_attach(struct gs_sched *s, struct gs_sched_client *c,
		     struct gs_sched_ent *e, u64 now)
{
	gs_advance(s, now);
	*c = (struct gs_sched_client){ .ent = e };
	e->clients++;
	gs_rates(s);
}

bool gs_sched_detach(struct gs_sched *s, struct gs_sched_client *c, u64 now)
{
	struct gs_sched_ent *e = c->ent;
	bool changed;

	if (!e)
		return false;
	changed = gs_sched_release(s, c, 0, now);
	if (e->clients)
		e->clients--;
	c->ent = NULL;
	/* Its entity went offline: the others' rates may be higher now. */
	if (gs_rates(s) && !gs_live(s, s->now))
		changed = true;
	return changed;
}

/*
 * A late release's charge beyond its holds: what it reported (@extra), but
 * at least, by the module's clock, the time from slice @f's forced end to
 * now (drain_ns at most), so that a report of 0 does not make a late tail
 * free (a late client's next ACQUIRE leaves its slice the same way); only
 * releasing before the work ends escapes it.  That time starts after the
 * late work of other entities charged so far that it falls in (their
 * [end, busy), never past the clock when charged): on a serial GPU this
 * client's work queued behind it, and it was charged to them.
 */
static u64 gs_late_floor(const struct gs_sched *s,
			 const struct gs_sched_forced *f, u64 extra, u64 now)
{
	u64 from = f->busy > f->cursor ? f->busy : f->cursor, to;
	bool moved = true;
	u32 i, n;

	/* Past every other late window [end, busy) it starts in (chained). */
	for (n = 0; moved && n < GS_SCHED_FORCED; n++) {
		moved = false;
		for (i = 0; i < GS_SCHED_FORCED; i++) {
			const struct gs_sched_forced *o = &s->forced[i];

			if (o->ent && o->ent != f->ent && o->end <= from &&
			    o->busy > from) {
				from = o->busy;
				moved = true;
			}
		}
	}
	to = gs_add(f->end, s->drain_ns);
	to = to < now ? to : now;
	return gs_sub0(to, from) > extra ? to - from : extra;
}

/* Is @c in the slice in progress (its entity holds the GPU)? */
static inline bool gs_holding(const struct gs_sched *s,
			      const struct gs_sched_client *c)
{
	return c->ent && s->holder == c->ent && c->slice == s->slice;
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

/*
 * @c leaves the slice it is in (@c->slice set), having reported @used_ns
 * since its last report; true when the GPU changed hands or became free.
 */
static bool gs_leave(struct gs_sched *s, struct gs_sched_client *c,
		     u64 used_ns, u64 now)
{
	struct gs_sched_ent *e = c->ent;
	struct gs_sched_forced *f = NULL;
	bool changed = false;
	u64 extra, from, to, taken;

	if (used_ns > now - c->since)
		used_ns = now - c->since;

	if (gs_holding(s, c)) {
		/* The hold covers its work since it joined. */
		c->covered = gs_add(c->covered, now - c->granted);
		if (e->in_slice)
			e->in_slice--;
		if (!e->in_slice) {
			gs_end_slice(s, now);
			changed = true;
		}
	} else {
		f = gs_forced(s, c->slice);
		gs_leave_late(s, c);
	}
	/*
	 * What ran past the holds is charged on top (all of it if the end
	 * of its slice is no longer known); the holders it kept off the GPU
	 * meanwhile get their time back.
	 */
	extra = gs_sub0(used_ns, c->covered);
	if (f)
		extra = gs_late_floor(s, f, extra, now);
	if (extra) {
		taken = gs_charge(s, e, extra, false);
		if (f) {
			/*
			 * The refund window starts where the slice's late work
			 * reported so far ends, and is no longer than the
			 * tokens this charge took, nor past now.
			 */
			from = f->cursor > f->end ? f->cursor : f->end;
			f->cursor = gs_add(from, extra);
			to = gs_add(from, taken);
			if (to > now)
				to = now;
			if (to > f->busy)
				f->busy = to;
			gs_refund(s, from, to);
		}
	}
	c->slice = 0;
	c->covered = 0;
	return changed;
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

u64 gs_sched_used(const struct gs_sched *s, const struct gs_sched_ent *e,
		  u64 now)
{
	u64 end;

	if (s->holder != e)
		return e->used_ns;
	/*
	 * A slice not given back is ended by force at its grace's end (by the
	 * next call, gs_expire()) and charged no further: a reader before
	 * that call never sees more than will be charged.
	 */
	end = s->hold_grace;
	if (now > end)
		now = end;
	return gs_add(e->used_ns, gs_sub0(now, s->hold_start));
}
