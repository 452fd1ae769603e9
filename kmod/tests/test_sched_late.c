// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * test_sched: extends, early renewals, late work's refunds, free slices and
 * late re-acquires.
 */
#include "test_sched.h"

static void extend_setup(struct gs_sched_client *ca, struct gs_sched_client *cb,
			 u64 slice)
{
	sim_init(2, slice);
	add_ctr(10, 0);
	add_ctr(10, 0);
	gs_sched_attach(&sim.s, ca, &sim.ctr[0].e, 0);
	gs_sched_attach(&sim.s, cb, &sim.ctr[1].e, 0);
}

/*
 * EXTEND: heartbeats push the forced end to a grace from now, never back,
 * never beyond drain_ns past the slice's end; only a client in the slice
 * in progress extends; a client that stops sending loses the GPU a grace
 * after its last heartbeat; forced_ends counts the slices ended by force.
 */
void test_extend(void)
{
	struct gs_sched_client ca, ca2, cb, cn = { 0 };
	struct gs_sched *s = &sim.s;
	u64 t0 = 1 * SEC, slice = 10 * MS, grace, until, bound, t, old;
	bool moved = true, later = true;

	extend_setup(&ca, &cb, slice);
	grace = GS_SCHED_GRACE(s);
	gs_sched_attach(s, &ca2, &sim.ctr[0].e, 0);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	bound = until + s->drain_ns;
	/* Not in the slice in progress: false, *until as it was. */
	until = 7;
	CHECK(!gs_sched_extend(s, &cn, t0 + 1 * MS, &until));
	CHECK(!gs_sched_extend(s, &ca2, t0 + 1 * MS, &until));
	CHECK(!gs_sched_extend(s, &cb, t0 + 1 * MS, &until));
	CHECK(until == 7 && !ca2.slice && !cb.waiting);
	CHECK(gs_sched_acquire(s, &cb, t0 + 1 * MS, &until) == GS_SCHED_WAIT);
	CHECK(until == t0 + slice);
	/* Within the slice the forced end does not move back. */
	CHECK(gs_sched_extend(s, &ca, t0 + 5 * MS, &until));
	CHECK(until == t0 + slice + grace && s->hold_grace == until);
	/* Draining: a grace from each heartbeat; the waiter sleeps again. */
	for (t = t0 + slice + 1 * MS; t + grace <= bound; t += 2 * MS) {
		old = s->hold_grace;
		moved &= gs_sched_extend(s, &ca, t, &until) &&
			 until == t + grace && s->hold_grace == until;
		/* A waiter asking at the old forced end is told the new one. */
		later &= gs_sched_acquire(s, &cb, old, &until) ==
			 GS_SCHED_WAIT && until == s->hold_grace && until > old;
	}
	CHECK(moved && later);
	/* Up to the bound, and no further. */
	CHECK(t < s->hold_grace && t + grace > bound);
	CHECK(gs_sched_extend(s, &ca, t, &until) && until == bound);
	CHECK(gs_sched_extend(s, &ca, bound - 1, &until) && until == bound);
	CHECK(s->forced_ends == 0 && s->holder == &sim.ctr[0].e);
	CHECK(gs_sched_used(s, &sim.ctr[0].e, bound + SEC) == bound - t0);
	/* At the bound the slice ends by force, charged up to there. */
	CHECK(!gs_sched_extend(s, &ca, bound, &until));
	CHECK(s->forced_ends == 1 && !s->holder);
	CHECK(sim.ctr[0].e.used_ns == bound - t0);
	CHECK(gs_sched_acquire(s, &cb, bound, &until) == GS_SCHED_GRANT);
	CHECK(!gs_sched_extend(s, &ca, bound + 1, &until));
	printf("extend: a drain held to %llu ms past the slice, %llu forced end\n",
	       (unsigned long long)((bound - t0 - slice) / MS),
	       (unsigned long long)s->forced_ends);

	/* A client that stops: the GPU goes a grace after its heartbeat. */
	extend_setup(&ca, &cb, slice);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	t = t0 + slice + 2 * MS;
	CHECK(gs_sched_extend(s, &ca, t, &until) && until == t + grace);
	CHECK(gs_sched_acquire(s, &cb, t + grace - 1, &until) ==
	      GS_SCHED_WAIT && until == t + grace);
	CHECK(s->forced_ends == 0);
	CHECK(gs_sched_acquire(s, &cb, t + grace, &until) == GS_SCHED_GRANT);
	CHECK(s->forced_ends == 1);
	CHECK(sim.ctr[0].e.used_ns == t + grace - t0);
	/* Its slice was taken away: no extension, no renewal. */
	CHECK(!gs_sched_extend(s, &ca, t + grace + 1, &until));
	CHECK(gs_sched_renew(s, &ca, t + grace + 1, &until) == GS_SCHED_WAIT);

	/* A drain that ends in a release is no forced end. */
	extend_setup(&ca, &cb, slice);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_acquire(s, &cb, t0 + 1 * MS, &until) == GS_SCHED_WAIT);
	for (t = t0 + slice; t < t0 + slice + 50 * MS; t += 2 * MS)
		CHECK(gs_sched_extend(s, &ca, t, &until));
	CHECK(gs_sched_release(s, &ca, 1, t));
	CHECK(s->forced_ends == 0 && !s->holder);
	CHECK(sim.ctr[0].e.used_ns == t - t0);
	CHECK(gs_sched_acquire(s, &cb, t, &until) == GS_SCHED_GRANT);

	/* drain_ns is live: the next heartbeat is held to the new bound. */
	extend_setup(&ca, &cb, slice);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_extend(s, &ca, until, &old) && old == until + grace);
	gs_sched_set_drain(s, 1, until + 1 * MS);
	CHECK(s->drain_ns == 1 * MS);
	CHECK(gs_sched_extend(s, &ca, until + 1 * MS, &old) &&
	      old == until + grace);
	CHECK(gs_sched_extend(s, &ca, until + 2 * MS, &old) &&
	      old == until + grace);
	CHECK(!gs_sched_extend(s, &ca, until + grace, &old));
	CHECK(s->forced_ends == 1);

	/* Native: nothing to extend. */
	extend_setup(&ca, &cb, slice);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	gs_sched_set_policy(s, 5, t0 + 1 * MS);
	CHECK(!gs_sched_extend(s, &ca, t0 + 2 * MS, &old));
}

/*
 * Early renewal: granted alone (the hold so far charged, a new slice from
 * now, in the same slice), refused when another is due (never making the
 * client a waiter), and refused outside its entity's slice in progress.
 */
void test_renew(void)
{
	struct gs_sched_client ca, ca2, cb, cn = { 0 };
	struct gs_sched *s = &sim.s;
	struct gs_sched_ent *a = &sim.ctr[0].e;
	u64 t0 = 1 * SEC, slice = 10 * MS, grace, until, n;

	extend_setup(&ca, &cb, slice);
	grace = GS_SCHED_GRACE(s);
	gs_sched_attach(s, &ca2, a, 0);
	/* Nothing held: no renewal, no waiting. */
	CHECK(gs_sched_renew(s, &cn, t0, &until) == GS_SCHED_WAIT);
	CHECK(gs_sched_renew(s, &ca, t0, &until) == GS_SCHED_WAIT &&
	      until == t0);
	CHECK(!ca.waiting && !a->waiting && !s->holder);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	n = s->slice;
	/* Alone: granted, charged so far, a new slice from now. */
	CHECK(gs_sched_renew(s, &ca, t0 + 4 * MS, &until) == GS_SCHED_GRANT);
	CHECK(until == t0 + 4 * MS + slice && s->hold_until == until);
	CHECK(s->hold_grace == until + grace && s->hold_start == t0 + 4 * MS);
	CHECK(a->used_ns == 4 * MS && s->slice == n && s->holder == a);
	CHECK(gs_sched_used(s, a, t0 + 6 * MS) == 6 * MS);
	CHECK(!ca.waiting && !a->waiting && a->in_slice == 1);
	/* A client of the entity not in the slice renews nothing. */
	CHECK(gs_sched_renew(s, &ca2, t0 + 5 * MS, &until) == GS_SCHED_WAIT);
	CHECK(until == s->hold_grace && !ca2.waiting && !ca2.slice);
	/* b waits and is due: refused, at once, and ca is no waiter. */
	CHECK(gs_sched_acquire(s, &cb, t0 + 5 * MS, &until) == GS_SCHED_WAIT);
	CHECK(gs_sched_renew(s, &cb, t0 + 5 * MS, &until) == GS_SCHED_WAIT);
	CHECK(gs_sched_renew(s, &ca, t0 + 6 * MS, &until) == GS_SCHED_WAIT);
	CHECK(until == s->hold_grace && until == t0 + 4 * MS + slice + grace);
	CHECK(!ca.waiting && !a->waiting && s->holder == a && s->slice == n);
	CHECK(a->used_ns == 6 * MS);
	/* Past the slice's end: refused (a plain ACQUIRE renews there). */
	CHECK(gs_sched_renew(s, &ca, t0 + 4 * MS + slice, &until) ==
	      GS_SCHED_WAIT && until == s->hold_grace);
	CHECK(!ca.waiting && !a->waiting);
	/* It drains and releases: b is next. */
	CHECK(gs_sched_release(s, &ca, 1, t0 + 15 * MS));
	CHECK(a->used_ns == 15 * MS);
	CHECK(gs_sched_acquire(s, &cb, t0 + 15 * MS, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_renew(s, &ca, t0 + 16 * MS, &until) == GS_SCHED_WAIT);
	/* Native: every ACQUIRE is granted; renewal has nothing to do. */
	gs_sched_set_policy(s, 5, t0 + 17 * MS);
	CHECK(gs_sched_renew(s, &cb, t0 + 17 * MS, &until) == GS_SCHED_WAIT);
}

/*
 * A late report is a transfer: whatever a client whose slice was taken
 * away reports (0, a little, ten times its hold, 2^64 - 1), and however
 * deep in debt it already is, the others' tokens grow by no more than its
 * own shrink, and its charge never goes below its hold and, by the clock,
 * the time its late work may have run (a report of 0 is not free).
 */
void test_refund_conservation(void)
{
	static const u64 reports[] = { 0, 1 * MS, 125 * MS, ~0ull };
	struct gs_sched_client c[3];
	struct gs_sched *s = &sim.s;
	u64 t0 = 1 * SEC, slice = 10 * MS, grace, until, held, t;
	s64 before[3], gain, loss, worst = 0;
	int i, k, deep;

	for (deep = 0; deep < 2; deep++) {
		for (k = 0; k < 4; k++) {
			sim_init(2, slice);
			grace = GS_SCHED_GRACE(s);
			for (i = 0; i < 3; i++) {
				add_ctr(10, 0);
				gs_sched_attach(s, &c[i], &sim.ctr[i].e, 0);
			}
			/* c0 holds and neither releases nor extends. */
			CHECK(gs_sched_acquire(s, &c[0], t0, &until) ==
			      GS_SCHED_GRANT);
			CHECK(gs_sched_acquire(s, &c[1], t0 + 1 * MS,
					       &until) == GS_SCHED_WAIT);
			t = t0 + slice + grace;
			CHECK(gs_sched_acquire(s, &c[1], t, &until) ==
			      GS_SCHED_GRANT && s->forced_ends == 1);
			held = sim.ctr[0].e.used_ns;
			CHECK(held == slice + grace);
			CHECK(gs_sched_release(s, &c[1], 1 * MS, t + 7 * MS));
			CHECK(gs_sched_acquire(s, &c[2], t0 + 20 * MS,
					       &until) == GS_SCHED_GRANT);
			CHECK(gs_sched_release(s, &c[2], 0, t0 + 25 * MS));
			/* Everyone's tokens as of the report. */
			t = t0 + 30 * MS;
			gs_sched_set_prio_ratio(s, s->prio_ratio, t);
			if (deep)
				sim.ctr[0].e.tokens =
					-(s64)(GS_SCHED_SAVE_NS + 4 * slice);
			for (i = 0; i < 3; i++)
				before[i] = sim.ctr[i].e.tokens;
			gs_sched_release(s, &c[0], reports[k], t);
			loss = before[0] - sim.ctr[0].e.tokens;
			gain = sim.ctr[1].e.tokens - before[1] +
			       sim.ctr[2].e.tokens - before[2];
			CHECK(gain <= loss);
			CHECK(loss >= 0 && sim.ctr[0].e.used_ns >= held);
			/*
			 * A report of less than its late tail is charged the
			 * tail by the clock: from the forced end to the release.
			 */
			if (reports[k] <= 1 * MS)
				CHECK(sim.ctr[0].e.used_ns ==
				      held + t - (t0 + slice + grace));
			if (gain - loss > worst)
				worst = gain - loss;
		}
	}
	printf("late reports: others gain at most %lld ns over the reporter's loss\n",
	       (long long)worst);
}

/*
 * A free slice (a high-priority entity alone) is free only while nobody
 * else wants the GPU: a normal container that was between its release and
 * its next ask when the slice was granted makes the rest of it charged.
 * Found when the stand-in's waiters began to wake at once (a futex, as the
 * module's wait queue): the high-priority container then took 63-67 % at
 * prio_ratio 60.
 */
void test_free_slice(void)
{
	struct gs_sched_client ch, cn;
	struct gs_sched *s = &sim.s;
	struct gs_sched_ent *h, *n;
	u64 t0 = 1 * SEC, slice = 10 * MS, until;
	s64 before;

	sim_init(2, slice);
	h = &sim.ctr[add_ctr(50, 1)].e;
	n = &sim.ctr[add_ctr(50, 0)].e;
	gs_sched_attach(s, &ch, h, 0);
	gs_sched_attach(s, &cn, n, 0);
	gs_sched_set_prio_ratio(s, 60, t0);
	/* n released a moment ago and has not asked yet: h alone, free. */
	CHECK(gs_sched_acquire(s, &ch, t0, &until) == GS_SCHED_GRANT);
	CHECK(s->hold_free);
	before = h->tokens;
	CHECK(gs_sched_acquire(s, &cn, t0 + 1 * MS, &until) == GS_SCHED_WAIT);
	CHECK(!s->hold_free && h->used_ns == 1 * MS && h->tokens >= before);
	/* From then on h pays: 9 ms, less its 6 ms accrued over the slice. */
	CHECK(gs_sched_release(s, &ch, 0, t0 + slice));
	CHECK(h->used_ns == slice);
	CHECK(h->tokens == before + (s64)(6 * MS) - (s64)(9 * MS));
	printf("free slice: charged from the other's ask, %lld ns of tokens left\n",
	       (long long)h->tokens);
}

/*
 * A late client that asks again instead of releasing leaves its old slice
 * as a release of 0 would: its tail is charged by the clock (the hostile
 * review's "reacq": a 10 % tenant took 17.4 % by never releasing).  And a
 * drain_us past the debt floor's second does not let a heartbeating hold
 * go uncharged: the floor takes drain_ns in.
 */
void test_late_reacquire(void)
{
	struct gs_sched_client ca, cb;
	struct gs_sched *s = &sim.s;
	u64 t0 = 1 * SEC, slice = 10 * MS, grace, until, end;

	extend_setup(&ca, &cb, slice);
	grace = GS_SCHED_GRACE(s);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_acquire(s, &cb, t0 + 1 * MS, &until) == GS_SCHED_WAIT);
	end = t0 + slice + grace;
	CHECK(gs_sched_acquire(s, &cb, end, &until) == GS_SCHED_GRANT);
	CHECK(sim.ctr[0].e.used_ns == slice + grace);
	/* 40 ms later a asks again, never having released. */
	CHECK(gs_sched_acquire(s, &ca, end + 40 * MS, &until) ==
	      GS_SCHED_WAIT);
	CHECK(sim.ctr[0].e.used_ns == slice + grace + 40 * MS);
	CHECK(ca.slice == 0 && ca.waiting);

	/* The floor takes the drain bound in. */
	sim_init(3, slice);
	gs_sched_set_drain(s, 5000ull * MS, 0);
	CHECK(s->drain_ns == 5000ull * MS);
	add_ctr(10, 0);
	sim.ctr[0].e.tokens = 0;
	gs_sched_attach(s, &ca, &sim.ctr[0].e, 0);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_extend(s, &ca, t0 + slice, &until));
	for (end = t0 + slice; end < t0 + slice + 4900 * MS; end += 2 * MS)
		gs_sched_extend(s, &ca, end, &until);
	CHECK(gs_sched_release(s, &ca, 0, end));
	CHECK(sim.ctr[0].e.tokens <= -(s64)(4 * SEC));
	gs_sched_set_drain(s, 100 * MS, end);
	CHECK(sim.ctr[0].e.tokens >= -(s64)(GS_SCHED_SAVE_NS + 4 * slice +
					    100 * MS));
	printf("late reacquire: charged its 40 ms tail; a 4.9 s drain: %lld ms of debt\n",
	       (long long)(sim.ctr[0].e.tokens / (s64)MS));
}

/*
 * gputime is a counter, the holder's slice in progress too: a refund for
 * late work that ran during the current hold gives its holder tokens
 * back, never lowers what gs_sched_used() has shown.
 */
void test_refund_keeps_gputime(void)
{
	struct gs_sched_client ca, cb;
	struct gs_sched *s = &sim.s;
	u64 t0 = 1 * SEC, slice = 10 * MS, until, end, seen, later;
	s64 tokens;

	extend_setup(&ca, &cb, slice);
	CHECK(gs_sched_acquire(s, &ca, t0, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_acquire(s, &cb, t0 + 1 * MS, &until) == GS_SCHED_WAIT);
	end = t0 + slice + GS_SCHED_GRACE(s);
	CHECK(gs_sched_acquire(s, &cb, end, &until) == GS_SCHED_GRANT);
	/* a's work ran 4 ms into b's hold; b has shown 5 ms so far. */
	seen = gs_sched_used(s, &sim.ctr[1].e, end + 5 * MS);
	tokens = sim.ctr[1].e.tokens;
	gs_sched_release(s, &ca, slice + GS_SCHED_GRACE(s) + 4 * MS,
			 end + 5 * MS);
	later = gs_sched_used(s, &sim.ctr[1].e, end + 5 * MS);
	printf("refund to the holder: gputime %llu -> %llu ns, tokens %+lld ns\n",
	       (unsigned long long)seen, (unsigned long long)later,
	       (long long)(sim.ctr[1].e.tokens - tokens));
	CHECK(later >= seen);
	/* Its tokens come back at its release (4 ms less charged). */
	CHECK(gs_sched_release(s, &cb, 0, end + slice));
	CHECK(sim.ctr[1].e.used_ns >= seen);
}
