// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The simulation of test_sched.c: containers with processes that ask a
 * struct gs_sched for the GPU, run work on a serial simulated GPU while
 * granted and release it, event by event in simulated time.
 */
#include "test_sched.h"

struct sim sim;

void sim_init(u32 policy, u64 slice_ns)
{
	memset(&sim, 0, sizeof(sim));
	gs_sched_init(&sim.s, 0);
	gs_sched_set_policy(&sim.s, policy, 0);
	gs_sched_set_slice(&sim.s, slice_ns, 0);
	sim.win_end = NEVER;
	sim.gap_after = NEVER;
}

int add_ctr(u32 weight, u32 highprio)
{
	int i = sim.nctr++;

	CHECK(gs_sched_add(&sim.s, &sim.ctr[i].e, weight, highprio,
			   sim.now) == 0);
	return i;
}

/* A process of container @ctr, first wanting the GPU at @start. */
int add_proc(int ctr, u64 work_ns, u64 busy_ns, u64 idle_ns, u64 start)
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
void wake_all(void)
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
void run_until(u64 t)
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

void measure(u64 from, u64 to)
{
	int i;

	for (i = 0; i < sim.nctr; i++)
		sim.ctr[i].gpu_ns = 0;
	sim.win_start = from;
	sim.win_end = to;
}

double share(int ctr)
{
	return 100.0 * (double)sim.ctr[ctr].gpu_ns /
	       (double)(sim.win_end - sim.win_start);
}

/* Run [0, @len) and measure all of it. */
void run_minute(void)
{
	measure(0, 60 * SEC);
	run_until(60 * SEC);
}
