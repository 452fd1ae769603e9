// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * User-space unit tests of gs_sched.c, the compute scheduler core, driven
 * by a discrete-event simulation in simulated time: containers with one
 * or more processes that ask for the GPU, run work on a serial simulated
 * GPU while granted, and release it with the GPU time their work took.
 * Each policy's rule is checked as a number (shares over a simulated
 * minute, latencies).  Prints every number, then "N passed, M failed".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gs_sched.h"

#define US		1000ull
#define MS		(1000ull * US)
#define SEC		(1000ull * MS)
#define NEVER		(~0ull)
#define MAXC		8
#define MAXP		16
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

static int passed, failed;

#define CHECK(cond) check((cond), #cond, __LINE__)

static void check(bool ok, const char *what, int line)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
	fprintf(stderr, "test_sched.c:%d: FAILED: %s\n", line, what);
}

/* A share in percent is within @tol points of @want. */
static bool near(double got, double want, double tol)
{
	return got >= want - tol && got <= want + tol;
}

enum pstate { P_IDLE, P_WAIT, P_RUN, P_STOPPED };

struct proc {
	int ctr;
	struct gs_sched_client c;
	enum pstate st;
	u64 wake;		/* next event */
	u64 until;		/* grant's end */
	u64 work_ns;		/* one kernel or one graph, back to back */
	u64 busy_ns, idle_ns;	/* busy/idle cycle; idle_ns 0: always busy */
	u64 used;		/* GPU time since the last report */
	u64 work_end;		/* its work in flight ends */
	bool draining;		/* not renewed: release when the work ends */
	u64 wait_start;		/* first WAIT since running last, NEVER: none */
	u64 max_wait;		/* longest wait for a grant */
	bool attached;
	bool active;		/* has work at all (else online but idle) */
};

struct ctr {
	struct gs_sched_ent e;
	u64 gpu_ns;		/* GPU time in the measuring window */
	u64 last_end;		/* its last work on the GPU ended */
	u64 max_gap;		/* longest time without its work on the GPU */
	u64 seen_used;		/* gs_sched_used() last time: it never goes down */
};

struct sim {
	struct gs_sched s;
	u64 now;
	u64 gpu_free_at;	/* the serial GPU is busy until then */
	u64 win_start, win_end;	/* measuring window */
	u64 gap_after;		/* record idle gaps of the GPU after this */
	u64 last_gap_end;	/* the last idle gap after gap_after ended */
	u64 gap_from;		/* gaps of containers counted from here */
	int nctr, nproc;
	unsigned int rot;
	struct ctr ctr[MAXC];
	struct proc p[MAXP];
};

static struct sim sim;

static void sim_init(u32 policy, u64 slice_ns)
{
	memset(&sim, 0, sizeof(sim));
	gs_sched_init(&sim.s, 0);
	gs_sched_set_policy(&sim.s, policy, 0);
	gs_sched_set_slice(&sim.s, slice_ns, 0);
	sim.win_end = NEVER;
	sim.gap_after = NEVER;
}

static int add_ctr(u32 weight, u32 highprio)
{
	int i = sim.nctr++;

	CHECK(gs_sched_add(&sim.s, &sim.ctr[i].e, weight, highprio,
			   sim.now) == 0);
	return i;
}

/* A process of container @ctr, first wanting the GPU at @start. */
static int add_proc(int ctr, u64 work_ns, u64 busy_ns, u64 idle_ns,
		    u64 start)
{
	int i = sim.nproc++;
	struct proc *p = &sim.p[i];

	memset(p, 0, sizeof(*p));
	p->ctr = ctr;
	p->work_ns = work_ns;
	p->busy_ns = busy_ns;
	p->idle_ns = idle_ns;
	p->st = P_IDLE;
	p->wake = start;
	p->wait_start = NEVER;
	p->active = work_ns > 0;
	if (!p->active)
		p->wake = NEVER;
	gs_sched_attach(&sim.s, &p->c, &sim.ctr[ctr].e, sim.now);
	p->attached = true;
	return i;
}

static bool busy_phase(const struct proc *p, u64 t)
{
	if (!p->idle_ns)
		return true;
	return t % (p->busy_ns + p->idle_ns) < p->busy_ns;
}

static u64 next_busy(const struct proc *p, u64 t)
{
	u64 cyc = p->busy_ns + p->idle_ns;

	return (t / cyc + 1) * cyc;
}

/* The caller's duty: wake every waiter, to re-ask now. */
static void wake_all(void)
{
	int i;

	for (i = 0; i < sim.nproc; i++)
		if (sim.p[i].st == P_WAIT)
			sim.p[i].wake = sim.now;
	sim.rot++;
}

static void account(struct ctr *c, u64 start, u64 end)
{
	u64 a = start > sim.win_start ? start : sim.win_start;
	u64 b = end < sim.win_end ? end : sim.win_end;

	if (a < b)
		c->gpu_ns += b - a;
	if (start >= sim.gap_from && c->last_end >= sim.gap_from &&
	    start - c->last_end > c->max_gap)
		c->max_gap = start - c->last_end;
	c->last_end = end;
}

/* @p submits one piece of work (it never has two in flight). */
static void submit(struct proc *p)
{
	u64 start = sim.gpu_free_at > sim.now ? sim.gpu_free_at : sim.now;

	if (start > sim.gpu_free_at && sim.gpu_free_at >= sim.gap_after)
		sim.last_gap_end = start;
	sim.gpu_free_at = start + p->work_ns;
	account(&sim.ctr[p->ctr], start, sim.gpu_free_at);
	p->used += p->work_ns;
	p->work_end = sim.gpu_free_at;
	p->st = P_RUN;
}

/* Running: wake when the work ends, or at the grant's end to renew. */
static void run_next(struct proc *p)
{
	p->wake = p->work_end;
	if (!p->draining && p->until > sim.now && p->until < p->wake)
		p->wake = p->until;
}

static void do_release(struct proc *p)
{
	if (gs_sched_release(&sim.s, &p->c, p->used, sim.now))
		wake_all();
	p->used = 0;
}

static bool ask(struct proc *p)
{
	u64 until = 0;

	if (gs_sched_acquire(&sim.s, &p->c, sim.now, &until) ==
	    GS_SCHED_GRANT) {
		CHECK(until > sim.now);
		if (p->wait_start != NEVER &&
		    sim.now - p->wait_start > p->max_wait)
			p->max_wait = sim.now - p->wait_start;
		p->wait_start = NEVER;
		p->until = until;
		return true;
	}
	if (p->wait_start == NEVER)
		p->wait_start = sim.now;
	/* Asking again at once would spin: the core must move time on. */
	CHECK(until > sim.now);
	p->until = until > sim.now ? until : sim.now + 1;
	return false;
}

/* Ask with no work in flight: run, or wait. */
static void do_acquire(struct proc *p)
{
	if (ask(p)) {
		submit(p);
		run_next(p);
		return;
	}
	p->st = P_WAIT;
	p->wake = p->until;
}

/*
 * The interposer's protocol: submit while granted; at the grant's end ask
 * again (work may still run): renewed, go on; else wait for the work to
 * finish, release with its GPU time, and wait for the next grant.
 */
static void step(struct proc *p)
{
	switch (p->st) {
	case P_IDLE:
	case P_WAIT:
		do_acquire(p);
		break;
	case P_RUN:
		if (sim.now < p->work_end) {
			if (!ask(p))
				p->draining = true;
			run_next(p);
			break;
		}
		if (p->draining) {
			p->draining = false;
			do_release(p);
			do_acquire(p);
			break;
		}
		if (!busy_phase(p, sim.now)) {
			do_release(p);
			p->st = P_IDLE;
			p->wake = next_busy(p, sim.now);
			break;
		}
		if (sim.now < p->until) {
			submit(p);
			run_next(p);
			break;
		}
		if (ask(p)) {
			submit(p);
			run_next(p);
			break;
		}
		do_release(p);
		do_acquire(p);
		break;
	case P_STOPPED:
		break;
	}
}

/* Run the simulation until @t. */
static void run_until(u64 t)
{
	for (;;) {
		int i, best = -1, n = sim.nproc;

		for (i = 0; i < n; i++) {
			/* Ties in a rotating order: fair among waiters. */
			struct proc *p = &sim.p[(i + sim.rot) % n];

			if (p->st == P_STOPPED || !p->attached)
				continue;
			if (best < 0 || p->wake < sim.p[best].wake)
				best = (i + sim.rot) % n;
		}
		if (best < 0 || sim.p[best].wake >= t)
			break;
		sim.now = sim.p[best].wake;
		step(&sim.p[best]);
		for (i = 0; i < sim.nctr; i++) {
			struct ctr *c = &sim.ctr[i];
			u64 used;

			if (!c->e.added)
				continue;
			used = gs_sched_used(&sim.s, &c->e, sim.now);
			if (used < c->seen_used)
				CHECK(used >= c->seen_used);	/* a counter */
			c->seen_used = used;
		}
	}
	sim.now = t;
}

static void measure(u64 from, u64 to)
{
	int i;

	for (i = 0; i < sim.nctr; i++)
		sim.ctr[i].gpu_ns = 0;
	sim.win_start = from;
	sim.win_end = to;
}

static double share(int ctr)
{
	return 100.0 * (double)sim.ctr[ctr].gpu_ns /
	       (double)(sim.win_end - sim.win_start);
}

/* Run [0, @len) and measure all of it. */
static void run_minute(void)
{
	measure(0, 60 * SEC);
	run_until(60 * SEC);
}

static void test_fair_share(void)
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

static void test_preemptive(void)
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

static void test_weighted(void)
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

static void test_fixed(void)
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

static void test_weak(void)
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

static void test_native(void)
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

static void test_highprio(void)
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

static void test_graphs(void)
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

static void test_switch(void)
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
static void test_detach_wakes(void)
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

static void test_stopped(void)
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

static void test_hostile(void)
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
static void test_offer_grief(void)
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
static void test_idle_late(void)
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
static void test_drain_bounds(void)
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
static void test_extend(void)
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
static void test_renew(void)
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
static void test_refund_conservation(void)
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
static void test_free_slice(void)
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
static void test_late_reacquire(void)
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

int main(void)
{
	test_fair_share();
	test_preemptive();
	test_weighted();
	test_fixed();
	test_weak();
	test_native();
	test_highprio();
	test_graphs();
	test_switch();
	test_stopped();
	test_hostile();
	test_offer_grief();
	test_idle_late();
	test_detach_wakes();
	test_drain_bounds();
	test_extend();
	test_renew();
	test_refund_conservation();
	test_free_slice();
	test_late_reacquire();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
