// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * test_sched: each policy's shares and latencies, high priority, graphs.
 */
#include "test_sched.h"

void test_fair_share(void)
{
	int a, b;

	/* Policy 0: 1/max_inst each, even with the GPU otherwise idle. */
	sim_init(0, 10 * MS);
	gs_sched_set_max_inst(&sim.s, 4, 0);
	a = add_ctr(0, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 0, max_inst 4, one busy: %.2f %%\n", share(a));
	CHECK(near(share(a), 25, 1));

	/* Two busy ones, max_inst 3, one of them with 2 processes. */
	sim_init(0, 10 * MS);
	gs_sched_set_max_inst(&sim.s, 3, 0);
	a = add_ctr(0, 0);
	b = add_ctr(0, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 300 * US, 0, 0, 0);
	add_proc(b, 700 * US, 0, 0, 0);
	run_minute();
	printf("policy 0, max_inst 3, two busy: %.2f %% %.2f %%\n",
	       share(a), share(b));
	CHECK(near(share(a), 33.33, 1));
	CHECK(near(share(b), 33.33, 1));
}

void test_preemptive(void)
{
	int a, b, c, d;

	sim_init(1, 10 * MS);
	a = add_ctr(1, 0);
	b = add_ctr(1, 0);
	c = add_ctr(1, 0);
	d = add_ctr(1, 0);	/* no client: not online, skipped */
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 100 * US, 0, 0, 0);
	add_proc(c, 2 * MS, 0, 0, 0);
	run_minute();
	printf("policy 1, three busy, one offline: %.2f %.2f %.2f %.2f %%\n",
	       share(a), share(b), share(c), share(d));
	CHECK(near(share(a), 33.33, 1));
	CHECK(near(share(b), 33.33, 1));
	CHECK(near(share(c), 33.33, 1));
	CHECK(share(d) == 0);
}

void test_weighted(void)
{
	int a, b;

	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(20, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 2, weights 10:20: %.2f %% %.2f %%\n",
	       share(a), share(b));
	CHECK(near(share(a), 33.33, 1));
	CHECK(near(share(b), 66.67, 1));

	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 2, alone: %.2f %%\n", share(a));
	CHECK(near(share(a), 100, 1));

	/* An online but idle container keeps its share. */
	sim_init(2, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(20, 0);
	add_proc(a, 0, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 2, 10 online idle, 20 busy: %.2f %% %.2f %%\n",
	       share(a), share(b));
	CHECK(share(a) == 0);
	CHECK(near(share(b), 66.67, 1));
}

void test_fixed(void)
{
	static const u32 w[3] = { 10, 30, 50 };
	int i, k, be;

	for (i = 0; i < 3; i++) {
		sim_init(3, 10 * MS);
		k = add_ctr(w[i], 0);
		add_proc(k, 1 * MS, 0, 0, 0);
		run_minute();
		printf("policy 3, %u alone: %.2f %%\n", w[i], share(k));
		CHECK(near(share(k), w[i], 1));
	}
	sim_init(3, 10 * MS);
	for (i = 0; i < 3; i++) {
		add_ctr(w[i], 0);
		add_proc(i, (u64)(i + 1) * 400 * US, 0, 0, 0);
	}
	be = add_ctr(0, 0);	/* best effort: the leftover */
	add_proc(be, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 3, 10/30/50 + best effort: %.2f %.2f %.2f %.2f %%\n",
	       share(0), share(1), share(2), share(be));
	for (i = 0; i < 3; i++)
		CHECK(near(share(i), w[i], 1));
	CHECK(near(share(be), 10, 1));
}

void test_weak(void)
{
	int a, b;

	/* Policy 4: an online idle container's share goes to the busy. */
	sim_init(4, 10 * MS);
	a = add_ctr(1, 0);
	b = add_ctr(1, 0);
	add_proc(a, 0, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 4, one online idle, one busy: %.2f %% %.2f %%\n",
	       share(a), share(b));
	CHECK(near(share(b), 100, 1));

	/* Both busy: halves.  Then one pauses: the other takes all. */
	sim_init(4, 10 * MS);
	a = add_ctr(1, 0);
	b = add_ctr(1, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 4, two busy: %.2f %% %.2f %%\n", share(a), share(b));
	CHECK(near(share(a), 50, 1));
	CHECK(near(share(b), 50, 1));

	/* One busy half of the time: the other gets 75 %. */
	sim_init(4, 10 * MS);
	a = add_ctr(1, 0);
	b = add_ctr(1, 0);
	add_proc(a, 1 * MS, 500 * MS, 500 * MS, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 4, half-busy and busy: %.2f %% %.2f %%\n",
	       share(a), share(b));
	CHECK(near(share(a), 25, 1));
	CHECK(near(share(b), 75, 1));
}

void test_native(void)
{
	struct gs_sched_client c[3];
	u64 until;
	int a, b, i;

	sim_init(5, 10 * MS);
	a = add_ctr(10, 0);
	b = add_ctr(0, 0);
	for (i = 0; i < 3; i++)
		gs_sched_attach(&sim.s, &c[i], &sim.ctr[i % 2].e, 0);
	for (i = 0; i < 3; i++) {
		CHECK(gs_sched_acquire(&sim.s, &c[i], 5, &until) ==
		      GS_SCHED_GRANT);
		CHECK(until == 5 + sim.s.slice_ns);
	}
	CHECK(!gs_sched_release(&sim.s, &c[0], 1 * MS, 6));
	CHECK(!sim.s.holder);
	for (i = 0; i < 3; i++)
		gs_sched_detach(&sim.s, &c[i], 7);
	/* Busy processes share the GPU as it comes: nobody waits. */
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 1 * MS, 0, 0, 0);
	run_minute();
	printf("policy 5, two busy: %.2f %% %.2f %%, waits %llu ns\n",
	       share(a), share(b),
	       (unsigned long long)(sim.p[0].max_wait + sim.p[1].max_wait));
	CHECK(near(share(a) + share(b), 100, 1));
	CHECK(sim.p[0].max_wait == 0 && sim.p[1].max_wait == 0);
}

void test_highprio(void)
{
	int h, n, ph;
	u64 lat;

	sim_init(2, 10 * MS);
	gs_sched_set_prio_ratio(&sim.s, 70, 0);
	h = add_ctr(10, 1);
	n = add_ctr(10, 0);
	add_proc(h, 1 * MS, 0, 0, 0);
	add_proc(n, 1 * MS, 0, 0, 0);
	run_minute();
	printf("highprio, ratio 70, with a busy one: %.2f %% %.2f %%\n",
	       share(h), share(n));
	CHECK(near(share(h), 70, 1));
	CHECK(near(share(n), 30, 1));

	sim_init(3, 10 * MS);
	h = add_ctr(10, 1);
	add_proc(h, 1 * MS, 0, 0, 0);
	run_minute();
	printf("highprio alone (policy 3, weight 10): %.2f %%\n", share(h));
	CHECK(near(share(h), 100, 1));

	/*
	 * Latency: a high-priority container that was busy alone a while,
	 * idle, then starts again while a normal one is busy.
	 */
	sim_init(2, 10 * MS);
	h = add_ctr(10, 1);
	n = add_ctr(10, 0);
	ph = add_proc(h, 1 * MS, 2 * SEC, 3 * SEC + 3 * MS + 170 * US, 0);
	add_proc(n, 700 * US, 0, 0, 0);
	run_minute();
	lat = sim.p[ph].max_wait;
	printf("highprio, busy 2 s in 5 s: %.2f %% %.2f %%, longest wait %.3f ms\n",
	       share(h), share(n), (double)lat / MS);
	/* The other's slice ends, then its work in flight. */
	CHECK(lat <= sim.s.slice_ns + 700 * US);
	/* It gets prio_ratio (80 %) of its busy time, 2 s in 5.003. */
	CHECK(near(share(h), 80 * 2.0 / 5.00317, 1));
}

void test_graphs(void)
{
	int g, k;

	/* One 50 ms graph at a time against 100 us kernels. */
	sim_init(2, 10 * MS);
	g = add_ctr(10, 0);
	k = add_ctr(10, 0);
	add_proc(g, 50 * MS, 0, 0, 0);
	add_proc(k, 100 * US, 0, 0, 0);
	run_minute();
	printf("policy 2, 50 ms graphs vs 100 us kernels: %.2f %% %.2f %%\n",
	       share(g), share(k));
	CHECK(near(share(g), 50, 1));
	CHECK(near(share(k), 50, 1));

	sim_init(3, 10 * MS);
	g = add_ctr(30, 0);
	k = add_ctr(30, 0);
	add_proc(g, 50 * MS, 0, 0, 0);
	add_proc(k, 100 * US, 0, 0, 0);
	run_minute();
	printf("policy 3 at 30, 50 ms graphs vs 100 us kernels: %.2f %% %.2f %%\n",
	       share(g), share(k));
	CHECK(near(share(g), 30, 1));
	CHECK(near(share(k), 30, 1));
}

/*
 * Live settings (a resize): weight and highprio written while both
 * containers are busy, as the module's procfs store does (the setting,
 * then every waiter woken).  The new shares hold from the next decision:
 * over the first second after the write, a is off its new share by at
 * most a few slices' worth (the slice in progress, tokens saved under the
 * old rates), and exact after.
 */
static void live_case(u32 policy, u32 wa, u32 wb, bool prio, u32 nb,
		      double want_a, double want_b)
{
	const u64 at = 10 * SEC;
	double fa, fb, off_a, off_b;
	int a, b;

	sim_init(policy, 10 * MS);
	a = add_ctr(wa, 0);
	b = add_ctr(wb, 0);
	add_proc(a, 1 * MS, 0, 0, 0);
	add_proc(b, 700 * US, 0, 0, 0);
	run_until(at);
	if (prio)
		gs_sched_set_highprio(&sim.s, &sim.ctr[b].e, nb, sim.now);
	else
		gs_sched_set_weight(&sim.s, &sim.ctr[b].e, nb, sim.now);
	wake_all();
	measure(at, at + 1 * SEC);
	run_until(at + 1 * SEC);
	fa = share(a);
	fb = share(b);
	/* GPU time each got in the first second beyond (or short of) its share. */
	off_a = (fa - want_a) * 10;
	off_b = (fb - want_b) * 10;
	measure(at + 1 * SEC, at + 10 * SEC);
	run_until(at + 10 * SEC);
	printf("policy %u %u:%u, b %s %u: 1st s %.2f/%.2f %% (%+.1f/%+.1f ms), then %.2f/%.2f %%\n",
	       policy, wa, wb, prio ? "highprio" : "weight", nb, fa, fb,
	       off_a, off_b, share(a), share(b));
	CHECK(off_a <= 3 * 10 && off_a >= -3 * 10);
	CHECK(off_b <= 3 * 10 && off_b >= -3 * 10);
	CHECK(near(share(a), want_a, 1));
	CHECK(near(share(b), want_b, 1));
}

void test_live_settings(void)
{
	/* Weighted 30:60 -> 30:10: a's share 33 % -> 75 %. */
	live_case(2, 30, 60, false, 10, 75, 25);
	/* 30:10 -> 30:60, back again. */
	live_case(2, 30, 10, false, 60, 33.33, 66.67);
	/* b becomes high priority: it takes prio_ratio, 80 %. */
	live_case(2, 30, 10, true, 1, 20, 80);
	/* Fixed shares 30 + 60 -> 30 + 10: each its own, never more. */
	live_case(3, 30, 60, false, 10, 30, 10);
	/* A best-effort one (the leftover, 80 %) given a fixed 70. */
	live_case(3, 20, 0, false, 70, 20, 70);
}
