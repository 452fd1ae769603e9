// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * test_sched: changes of settings and clients, stopped and hostile holders,
 * offers not taken, idle and late work, the drain's bounds.
 */
#include "test_sched.h"

void test_switch(void)
{
	u64 t = 20 * SEC + 3 * MS + 777 * US, lat, bound;
	int a, b;

	/* 3 -> 2: 10 %/10 % leave the GPU idle, then 50/50 fill it. */
	sim_init(3, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 300 * US, 0, 0, 0);
	run_until(t);
	sim.gap_after = t;
	sim.last_gap_end = t;
	gs_sched_set_policy(&sim.s, 2, t);
	wake_all();
	measure(t, t + 40 * SEC);
	run_until(t + 40 * SEC);
	lat = sim.last_gap_end - t;
	printf("switch 3 -> 2: GPU busy for good %.3f ms after, then %.2f %% %.2f %%\n",
	       (double)lat / MS, share(a), share(b));
	CHECK(lat <= sim.s.slice_ns + GS_SCHED_GRACE(&sim.s));
	CHECK(near(share(a), 50, 1));
	CHECK(near(share(b), 50, 1));

	/* 2 -> 3: weights 10:50 (16.7/83.3), then 50 % is the most. */
	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(50, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 2 * MS, 0, 0, 0);
	run_until(t);
	gs_sched_set_policy(&sim.s, 3, t);
	wake_all();
	measure(t, t + 5 * SEC);
	run_until(t + 5 * SEC);
	bound = 5 * SEC / 2 + sim.s.slice_ns + GS_SCHED_GRACE(&sim.s);
	printf("switch 2 -> 3: 50 %% gets %.3f ms over its share in 5 s\n",
	       ((double)sim.ctr[b].gpu_ns - 2.5 * SEC) / MS);
	CHECK(sim.ctr[b].gpu_ns <= bound);
	measure(t + 5 * SEC, t + 40 * SEC);
	run_until(t + 40 * SEC);
	printf("switch 2 -> 3: then %.2f %% %.2f %%\n", share(a), share(b));
	CHECK(near(share(a), 10, 1));
	CHECK(near(share(b), 50, 1));

	/* 5 -> 3: native grants last a slice, so 10 %/10 % bite within one. */
	sim_init(5, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_until(t);
	CHECK(sim.p[0].until <= t + sim.s.slice_ns);
	CHECK(sim.p[1].until <= t + sim.s.slice_ns);
	gs_sched_set_policy(&sim.s, 3, t);
	wake_all();
	measure(t, t + 1 * SEC);
	run_until(t + 1 * SEC);
	bound = 2 * (SEC / 10 + sim.s.slice_ns + GS_SCHED_GRACE(&sim.s) +
		     1 * MS);
	printf("switch 5 -> 3: 10 %% + 10 %% get %.3f ms in the first second\n",
	       (double)(sim.ctr[a].gpu_ns + sim.ctr[b].gpu_ns) / MS);
	CHECK(sim.ctr[a].gpu_ns + sim.ctr[b].gpu_ns <= bound);
	measure(t + 1 * SEC, t + 40 * SEC);
	run_until(t + 40 * SEC);
	printf("switch 5 -> 3: then %.2f %% %.2f %%\n", share(a), share(b));
	CHECK(near(share(a), 10, 1));
	CHECK(near(share(b), 10, 1));
}

/*
 * Detach tells whether the waiters need waking: only when something they
 * depend on changed (holder, offer, waiting or online set, rates), so a
 * process looping open, ask, close does not wake everybody each time.
 */
void test_detach_wakes(void)
{
	struct gs_sched_client c[5];
	u64 until, now = 1 * SEC;
	int a, b, i;

	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	for (i = 0; i < 3; i++)
		gs_sched_attach(&sim.s, &c[i], &sim.ctr[a].e, 0);
	for (i = 3; i < 5; i++)
		gs_sched_attach(&sim.s, &c[i], &sim.ctr[b].e, 0);
	/* c[3] holds (b's slice); c[0] and c[1] wait. */
	CHECK(gs_sched_acquire(&sim.s, &c[3], now, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_acquire(&sim.s, &c[0], now, &until) == GS_SCHED_WAIT);
	CHECK(gs_sched_acquire(&sim.s, &c[1], now, &until) == GS_SCHED_WAIT);
	/* One of several, neither waiting nor in a slice: nothing changes. */
	CHECK(!gs_sched_detach(&sim.s, &c[2], now + 1 * MS));
	/* A waiter with another of its entity's still waiting: neither. */
	CHECK(!gs_sched_detach(&sim.s, &c[1], now + 2 * MS));
	/* b's other client, not in the slice: neither. */
	CHECK(!gs_sched_detach(&sim.s, &c[4], now + 3 * MS));
	/* The holder's last client in its slice: the GPU is free. */
	CHECK(gs_sched_detach(&sim.s, &c[3], now + 4 * MS));
	CHECK(!sim.s.holder);
	/* b went offline outside a slice: a's rate doubles, a waits. */
	CHECK(sim.ctr[a].e.rate == GS_SCHED_PPM);
	/* a's last waiter, the GPU free: its entity stops waiting. */
	CHECK(gs_sched_detach(&sim.s, &c[0], now + 5 * MS));
	CHECK(!sim.ctr[a].e.waiting && !sim.ctr[a].e.clients);

	/* The last client of an entity, in another's slice: no wake-up. */
	gs_sched_attach(&sim.s, &c[0], &sim.ctr[a].e, now);
	gs_sched_attach(&sim.s, &c[3], &sim.ctr[b].e, now);
	now += 1 * SEC;
	CHECK(gs_sched_acquire(&sim.s, &c[3], now, &until) == GS_SCHED_GRANT);
	CHECK(gs_sched_acquire(&sim.s, &c[0], now, &until) == GS_SCHED_WAIT);
	CHECK(until == sim.s.hold_until);
	CHECK(!gs_sched_detach(&sim.s, &c[0], now + 1 * MS));
	/* Out of the slice (its grace), the same is a change of rates. */
	gs_sched_attach(&sim.s, &c[0], &sim.ctr[a].e, now);
	CHECK(gs_sched_detach(&sim.s, &c[0], sim.s.hold_until + 1 * US));
	/* Never attached, or detached twice: false. */
	CHECK(!gs_sched_detach(&sim.s, &c[0], now + 20 * MS));
}

void test_stopped(void)
{
	u64 t = 10 * SEC + 1 * MS + 5 * US, until;
	int a, b, pa, pb;
	struct gs_sched_client c;

	/* A process stops while holding the slice: never releases. */
	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	pa = add_proc(a, 1 * MS, 0, 0, 0);
	pb = add_proc(b, 1 * MS, 0, 0, 0);
	run_until(t);
	while (sim.s.holder != &sim.ctr[a].e)
		run_until(sim.now + 100 * US);
	sim.p[pa].st = P_STOPPED;
	sim.gap_from = sim.now;
	sim.ctr[b].max_gap = 0;
	sim.ctr[b].last_end = sim.now;
	measure(sim.now, sim.now + 20 * SEC);
	run_until(sim.now + 20 * SEC);
	printf("a holder stops: the other waits at most %.3f ms, then %.2f %%\n",
	       (double)sim.ctr[b].max_gap / MS, share(b));
	CHECK(sim.ctr[b].max_gap <= sim.s.slice_ns +
	      GS_SCHED_GRACE(&sim.s) + 1 * MS);
	/* The stopped one's entity keeps its rate: b gets its half. */
	CHECK(near(share(b), 50, 1));

	/* Its process dies: detach releases, b gets everything. */
	gs_sched_detach(&sim.s, &sim.p[pa].c, sim.now);
	sim.p[pa].attached = false;
	wake_all();
	measure(sim.now, sim.now + 10 * SEC);
	run_until(sim.now + 10 * SEC);
	printf("its process detached: the other gets %.2f %%\n", share(b));
	CHECK(near(share(b), 100, 1));

	/* A waiter that stops after it was woken is passed over. */
	sim_init(1, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	pa = add_proc(a, 1 * MS, 0, 0, 0);
	pb = add_proc(b, 1 * MS, 0, 0, 0);
	run_until(t);
	while (sim.p[pa].st != P_WAIT)
		run_until(sim.now + 100 * US);
	sim.p[pa].st = P_STOPPED;
	sim.gap_from = sim.now;
	sim.ctr[b].max_gap = 0;
	sim.ctr[b].last_end = sim.now;
	measure(sim.now, sim.now + 20 * SEC);
	run_until(sim.now + 20 * SEC);
	printf("a waiter stops: the other waits at most %.3f ms, gets %.2f %%\n",
	       (double)sim.ctr[b].max_gap / MS, share(b));
	CHECK(sim.ctr[b].max_gap <= sim.s.slice_ns +
	      GS_SCHED_GRACE(&sim.s) + 1 * MS);
	CHECK(near(share(b), 50, 1));
	(void)pb;

	/* del of the holder frees the GPU. */
	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(10, 0);
	gs_sched_attach(&sim.s, &c, &sim.ctr[a].e, 0);
	CHECK(gs_sched_acquire(&sim.s, &c, 1, &until) == GS_SCHED_GRANT);
	CHECK(sim.s.holder == &sim.ctr[a].e);
	gs_sched_del(&sim.s, &sim.ctr[a].e, 2 * MS);
	CHECK(!sim.s.holder);
	CHECK(sim.s.nents == 1 && sim.s.ents[0] == &sim.ctr[b].e);
	pb = add_proc(b, 1 * MS, 0, 0, 2 * MS);
	measure(2 * MS, 10 * SEC);
	run_until(10 * SEC);
	printf("holder deleted: the other gets %.2f %%\n", share(b));
	CHECK(near(share(b), 100, 1));
}

void test_hostile(void)
{
	static struct gs_sched_ent ents[GS_SCHED_MAX + 1];
	struct gs_sched_client c[4];
	struct gs_sched s;
	u64 until, t = 1000;
	int i, k, grants = 0;

	gs_sched_init(&s, 0);
	for (i = 0; i < GS_SCHED_MAX; i++)
		CHECK(gs_sched_add(&s, &ents[i], ~0u, i & 1, 0) == 0);
	CHECK(gs_sched_add(&s, &ents[GS_SCHED_MAX], 1, 0, 0) == -ENOSPC);
	CHECK(gs_sched_add(&s, &ents[3], 1, 0, 0) == -EEXIST);
	for (i = 0; i < 4; i++)
		gs_sched_attach(&s, &c[i], &ents[i], 0);
	for (k = 0; k < 6; k++) {
		gs_sched_set_policy(&s, k, t);
		gs_sched_set_max_inst(&s, k & 1 ? 0 : ~0u, t);
		gs_sched_set_prio_ratio(&s, k & 2 ? 0 : ~0u, t);
		gs_sched_set_slice(&s, k & 1 ? 0 : ~0ull, t);
		gs_sched_set_weight(&s, &ents[0], k & 1 ? 0 : ~0u, t);
		for (i = 0; i < 4; i++) {
			/* Time going backwards, huge and absurd reports. */
			t += 7 * MS;
			if (gs_sched_acquire(&s, &c[i], t - (i & 1) * 20 * MS,
					     &until) == GS_SCHED_GRANT)
				grants++;
			gs_sched_release(&s, &c[i], i & 2 ? ~0ull : 0, t);
		}
	}
	CHECK(grants > 0);
	for (i = 0; i < GS_SCHED_MAX; i++)
		CHECK(ents[i].tokens >= -(s64)(GS_SCHED_SAVE_NS +
					       4 * s.slice_ns));

	/* Near the end of time: no wrap, and still decisions. */
	gs_sched_set_policy(&s, 2, t);
	gs_sched_set_slice(&s, 10 * MS, t);
	t = ~0ull - 5 * MS;
	CHECK(gs_sched_acquire(&s, &c[0], t, &until) == GS_SCHED_GRANT);
	CHECK(until >= t);
	gs_sched_release(&s, &c[0], ~0ull, t + MS);
	gs_sched_acquire(&s, &c[1], ~0ull, &until);
	CHECK(until == ~0ull);
	CHECK(gs_sched_used(&s, &ents[0], ~0ull) <= ~0ull);

	/* A fresh one after all that: two busy 1:1 get their halves. */
	sim_init(2, 10 * MS);
	k = add_ctr(~0u, 0);
	i = add_ctr(~0u, 0);
	add_proc(k, 1 * MS, 0, 0, 0);
	add_proc(i, 1 * MS, 0, 0, 0);
	measure(0, 10 * SEC);
	run_until(10 * SEC);
	printf("weights at the u32 bound: %.2f %% %.2f %%\n",
	       share(k), share(i));
	CHECK(near(share(k), 50, 1));
}

/*
 * A client that asks (as with GPUSHARE_SCHED_NOWAIT) only while others
 * hold the GPU, so that it is never granted and never charged, yet is
 * due for the GPU at every change of hands: the grace the others wait
 * for it each time costs it, not them.
 */
void test_offer_grief(void)
{
	static const u32 policies[] = { 3, 2 };
	static const u32 weights[][2] = { { 45, 10 }, { 50, 1 } };
	static const double want[] = { 45, 100.0 * 50 / 101 };
	struct gs_sched_client hc;
	int a, b, h, k;
	u64 until, t;

	for (k = 0; k < 2; k++) {
		sim_init(policies[k], 10 * MS);
		a = add_ctr(weights[k][0], 0);
		b = add_ctr(weights[k][0], 0);
		h = add_ctr(weights[k][1], 0);
		add_proc(a, 1 * MS, 0, 0, 0);
		add_proc(b, 1 * MS, 0, 0, 0);
		gs_sched_attach(&sim.s, &hc, &sim.ctr[h].e, 0);
		measure(0, 20 * SEC);
		for (t = 0; t < 20 * SEC; t += 500 * US) {
			run_until(t);
			if (sim.s.holder && sim.s.holder != &sim.ctr[h].e)
				gs_sched_acquire(&sim.s, &hc, sim.now, &until);
		}
		run_until(20 * SEC);
		printf("policy %u, a waiter that never comes: %.2f %% %.2f %% (want %.2f)\n",
		       policies[k], share(a), share(b), want[k]);
		CHECK(near(share(a), want[k], 1));
		CHECK(near(share(b), want[k], 1));
		CHECK(sim.ctr[h].e.used_ns == 0);
	}
}

/*
 * A process that launched once and went idle: its slice is taken away at
 * the grace and it never reports.  Its container wants nothing, so it
 * saves a slice at most, and does not burst past a fixed share later.
 */
void test_idle_late(void)
{
	struct gs_sched_client idle;
	u64 until;
	int a, b;

	sim_init(3, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(50, 0);
	gs_sched_attach(&sim.s, &idle, &sim.ctr[a].e, 0);
	CHECK(gs_sched_acquire(&sim.s, &idle, 0, &until) == GS_SCHED_GRANT);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_until(10 * SEC);
	CHECK(sim.ctr[a].e.tokens <= (s64)sim.s.slice_ns);
	add_proc(a, 1 * MS, 0, 0, 10 * SEC);
	measure(10 * SEC, 12 * SEC);
	run_until(12 * SEC);
	printf("fixed 10 %% after 10 s idle in a lost slice: %.2f %% over 2 s\n",
	       share(a));
	CHECK(near(share(a), 10, 1));
}

/* drain_ns: 0 is the default, anything else bounded to the uapi's limits. */
void test_drain_bounds(void)
{
	static const u64 in[] = {
		0, 1, GPUSHARE_DRAIN_US_MIN * US - 1, GPUSHARE_DRAIN_US_MIN * US,
		5 * MS, GPUSHARE_DRAIN_US_MAX * US, GPUSHARE_DRAIN_US_MAX * US + 1,
		~0ull,
	};
	static const u64 want[] = {
		GS_SCHED_DRAIN_NS, GPUSHARE_DRAIN_US_MIN * US,
		GPUSHARE_DRAIN_US_MIN * US, GPUSHARE_DRAIN_US_MIN * US, 5 * MS,
		GPUSHARE_DRAIN_US_MAX * US, GPUSHARE_DRAIN_US_MAX * US,
		GPUSHARE_DRAIN_US_MAX * US,
	};
	struct gs_sched s;
	size_t i;

	gs_sched_init(&s, 0);
	CHECK(s.drain_ns == GS_SCHED_DRAIN_NS);
	CHECK(s.drain_ns == GPUSHARE_DRAIN_US_DEFAULT * US);
	CHECK(s.forced_ends == 0);
	for (i = 0; i < ARRAY_SIZE(in); i++) {
		gs_sched_set_drain(&s, in[i], i);
		CHECK(s.drain_ns == want[i]);
	}
}

/* Two entities of weight 10 (policy 2); @ca and @cb attached to each. */
