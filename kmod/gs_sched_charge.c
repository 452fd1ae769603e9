// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * gpushare compute scheduler core: charges.  A hold is charged to its
 * entity's tokens and recorded in the recent holds (s->hist); a client
 * leaving a slice is charged what its work took beyond the holds; one
 * leaving a slice taken away (s->forced) late is charged by the clock at
 * least, and the holders its late work kept off the GPU get that time
 * back (gs_refund()), a transfer bounded by the tokens the charge took.
 * gs_sched.h has the model.
 */
#include "gs_sched_int.h"

/*
 * Take @ns of tokens from @e, down to the floor.  Alone (gs_forfeit), for
 * a time the GPU was kept idle for it (an offer it did not take): not GPU
 * time it used, so used_ns stays.  A @free charge takes none, and
 * best-effort entities have no tokens to take.
 */
u64 gs_forfeit(const struct gs_sched *s, struct gs_sched_ent *e, u64 ns,
	       bool free)
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
void gs_charge_hold(struct gs_sched *s, u64 start, u64 stop)
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
	/*
	 * The current hold: that much less is charged when it ends (its
	 * tokens back), but it stays in used_ns now, as a past hold's does,
	 * so that the gputime shown so far never goes down.
	 */
	a = from > s->hold_start ? from : s->hold_start;
	b = to < s->now ? to : s->now;
	if (a < b) {
		s->holder->used_ns = gs_add(s->holder->used_ns, b - a);
		s->hold_start += b - a;
	}
}

static struct gs_sched_forced *gs_forced(struct gs_sched *s, u64 slice)
{
	u32 i;

	for (i = 0; i < GS_SCHED_FORCED; i++)
		if (s->forced[i].slice == slice)
			return &s->forced[i];
	return NULL;
}

/* @c leaves a slice taken away: the hold covered it up to the end. */
void gs_leave_late(struct gs_sched *s, struct gs_sched_client *c)
{
	struct gs_sched_forced *f = gs_forced(s, c->slice);

	if (f)
		c->covered = gs_add(c->covered, gs_sub0(f->end, c->granted));
	if (c->ent->late)
		c->ent->late--;
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

/*
 * @c leaves the slice it is in (@c->slice set), having reported @used_ns
 * since its last report; true when the GPU changed hands or became free.
 */
bool gs_leave(struct gs_sched *s, struct gs_sched_client *c, u64 used_ns,
	      u64 now)
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
