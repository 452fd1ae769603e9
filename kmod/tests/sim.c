// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The deep-queue model (sim.h): the GPU, the applications and the event
 * loop.  Events at one instant: the GPU's first (a kernel that ends at t
 * is seen as ended by a thread acting at t), then the threads in a
 * rotating order.
 */
#include <string.h>

#include "sim.h"

struct sim sim;
struct sim_audit sim_total;

static inline bool has_work(const struct sim_proc *p)
{
	return p->sub > p->done;
}

static inline int idx(const struct sim_proc *p)
{
	return (int)(p - sim.p);
}

/* @p's kernels executed from @a to @b. */
static void account(struct sim_proc *p, u64 a, u64 b)
{
	u64 x = sim_max(a, sim.win_start), y = sim_min(b, sim.win_end);
	int i;

	if (x < y) {
		p->gpu_ns += y - x;
		sim.busy_ns += y - x;
	}
	if (a > p->last_end && p->last_end >= sim.win_start &&
	    a <= sim.win_end) {
		if (a - p->last_end > p->max_gap)
			p->max_gap = a - p->last_end;
		x = p->last_end;
		for (i = 0; i < sim.cfg.n; i++)
			if (&sim.p[i] != p && sim.p[i].granted_at > x)
				x = sim.p[i].granted_at;
		if (a > x && a - x > p->max_wait)
			p->max_wait = a - x;
	}
	p->last_end = b;
}

/* The context whose kernel runs, -1: none (idle, or switching). */
static int running(void)
{
	if (sim.cfg.gpu == GPU_FIFO)
		return sim.r_len ? sim.ring[sim.r_head].p : -1;
	return sim.cur;
}

/* The GPU's progress up to @now (no kernel ends before it). */
static void progress(u64 now)
{
	int r = running();
	u64 a = sim.g_t;

	if (r >= 0 && sim.cfg.gpu == GPU_TS)
		a = sim_max(a, sim.sw_until);
	if (r >= 0 && now > a) {
		sim.p[r].head_rem -= now - a;
		account(&sim.p[r], a, now);
	}
	sim.g_t = now;
}

/* TS: does a context other than @r have work? */
static bool others(int r)
{
	int i;

	for (i = 0; i < sim.cfg.n; i++)
		if (i != r && has_work(&sim.p[i]))
			return true;
	return false;
}

/* The GPU's next event: a kernel ends, a turn ends, a switch is done. */
static u64 gpu_next(void)
{
	u64 t;

	if (sim.cfg.gpu == GPU_FIFO)
		return sim.r_len ? sim.g_t + sim.p[sim.ring[sim.r_head].p].head_rem :
				   NEVER;
	if (sim.cur < 0)
		return NEVER;
	if (sim.sw_until > sim.g_t)
		return sim.sw_until;
	t = sim.g_t + sim.p[sim.cur].head_rem;
	if (others(sim.cur) && sim.turn_end < t)
		t = sim_max(sim.turn_end, sim.g_t);
	return t;
}

/* TS: context @n runs from now (-1: the GPU idles). */
static void switch_to(int n)
{
	sim.cur = n;
	if (n < 0)
		return;
	sim.sw_until = sim.now;
	if (n != sim.last)
		sim.sw_until += sim.cfg.switch_ns;
	sim.last = n;
	sim.turn_end = sim.sw_until + sim.cfg.turn_ns;
}

/* TS: the next context after @r (round robin) with work, -1: none. */
static int next_ctx(int r)
{
	int i, k;

	for (i = 1; i <= sim.cfg.n; i++) {
		k = (r + i) % sim.cfg.n;
		if (has_work(&sim.p[k]))
			return k;
	}
	return -1;
}

static void stamp(struct sim_mark *m, u64 done)
{
	if (m->at == NEVER && m->target <= done)
		m->at = sim.now;
}

/* One of @p's kernels ended now. */
static void complete(struct sim_proc *p)
{
	int i;

	p->done++;
	p->head_rem = p->d;
	stamp(&p->start, p->done);
	stamp(&p->end, p->done);
	for (i = 0; i < GS_PACE_SLOTS; i++)
		stamp(&p->probe[i], p->done);
	for (i = 0; i < p->nlate; i++) {
		stamp(&p->late_start[i], p->done);
		stamp(&p->late_end[i], p->done);
	}
	if (p->ast == A_SYNC && !has_work(p)) {
		p->left = p->q;
		p->ast = A_RUN;
		p->app_wake = sim.now;
	} else if (p->ast == A_SLOT && p->sub - p->done < p->q) {
		p->ast = A_RUN;
		p->app_wake = sim.now;
	}
}

static void gpu_event(void)
{
	int r = running();

	if (sim.cfg.gpu == GPU_FIFO) {
		complete(&sim.p[r]);
		if (!--sim.ring[sim.r_head].n) {
			sim.r_head = (sim.r_head + 1) % SIM_RING;
			sim.r_len--;
		}
		return;
	}
	if (!sim.p[r].head_rem) {
		complete(&sim.p[r]);
		if (!has_work(&sim.p[r]))
			switch_to(next_ctx(r));
		return;
	}
	/* The turn is over and another context has work (else a switch ended). */
	if (sim.now >= sim.turn_end && others(r))
		switch_to(next_ctx(r));
}

/* Work @p has queued on the GPU, ns. */
u64 sim_queued_ns(const struct sim_proc *p)
{
	return has_work(p) ? p->head_rem + (p->sub - p->done - 1) * p->d : 0;
}

/* Record an event on @p's stream now. */
void sim_mark(struct sim_proc *p, struct sim_mark *m)
{
	m->target = p->sub;
	m->at = p->done >= m->target ? sim.now : NEVER;
}

/* @p's launch now: one kernel of p->d queued. */
void sim_submit(struct sim_proc *p)
{
	bool had = has_work(p);
	u64 q = sim_queued_ns(p) + p->d;
	u32 tail;

	if (sim.now >= sim.win_start && q > p->max_queue)
		p->max_queue = q;
	p->sub++;
	if (!had)
		p->head_rem = p->d;
	if (sim.cfg.gpu == GPU_FIFO) {
		if (sim.r_len == SIM_RING) {
			sim.stuck = true;	/* more runs than the model holds */
			return;
		}
		tail = (sim.r_head + sim.r_len + SIM_RING - 1) % SIM_RING;
		if (sim.r_len && sim.ring[tail].p == idx(p)) {
			sim.ring[tail].n++;
			return;
		}
		tail = (sim.r_head + sim.r_len) % SIM_RING;
		sim.ring[tail].p = idx(p);
		sim.ring[tail].n = 1;
		sim.r_len++;
		return;
	}
	if (sim.cur < 0)
		switch_to(idx(p));
	else if (sim.cur != idx(p) && sim.turn_end <= sim.now)
		sim.turn_end = sim.now + sim.cfg.turn_ns;	/* contention begins */
}

/* The application's thread: launch, or wait for its queue. */
static void app_step(struct sim_proc *p)
{
	if (p->ast == A_RUN && p->app == APP_WINDOW && p->sub - p->done >= p->q) {
		p->ast = A_SLOT;
		p->app_wake = NEVER;
		return;
	}
	if (!gate_launch(p)) {
		p->ast = A_GATE;
		return;
	}
	sim_submit(p);
	p->ast = A_RUN;
	p->app_wake = sim.now + LAUNCH_NS;
	if (p->app == APP_BATCH && !--p->left) {
		p->ast = A_SYNC;
		p->app_wake = NEVER;
	}
}

void sim_setup(const struct sim_cfg *cfg)
{
	int i;

	memset(&sim, 0, sizeof(sim));
	sim.cfg = *cfg;
	if (!sim.cfg.turn_ns)
		sim.cfg.turn_ns = 2 * MS;
	gs_sched_init(&sim.s, 0);
	gs_sched_set_policy(&sim.s, cfg->policy, 0);
	gs_sched_set_max_inst(&sim.s, cfg->max_inst ? cfg->max_inst : 4, 0);
	gs_sched_set_slice(&sim.s, cfg->slice_ns, 0);
	gs_sched_set_drain(&sim.s, cfg->drain_ns, 0);
	sim.cfg.slice_ns = sim.s.slice_ns;
	sim.cfg.drain_ns = sim.s.drain_ns;
	sim.cur = -1;
	sim.last = -1;
	sim.win_start = cfg->warm_ns;
	sim.win_end = cfg->warm_ns + cfg->len_ns;
	for (i = 0; i < cfg->n; i++) {
		struct sim_proc *p = &sim.p[i];

		gs_sched_add(&sim.s, &sim.ctr[i].e, cfg->weight[i], 0, 0);
		p->ctr = i;
		p->app = cfg->app[i];
		p->q = cfg->q[i] ? cfg->q[i] : 1;
		p->d = cfg->d[i];
		p->evil = cfg->evil[i];
		p->left = p->q;
		p->app_wake = i * US;	/* not all at one instant */
		p->rel_wake = NEVER;
		gs_sched_attach(&sim.s, &p->c, &sim.ctr[i].e, 0);
		gs_pace_init(&p->pace, sim.cfg.slice_ns, 0);
	}
}

void sim_run(u64 end)
{
	int i, k, n = 2 * sim.cfg.n, best;
	struct sim_proc *p;
	u64 t, w;

	for (;;) {
		/* A model that loops at one instant is a failure, not a hang. */
		if (sim.stuck || (sim.now == sim.last_t && ++sim.same > 1000000)) {
			sim.stuck = true;
			break;
		}
		if (sim.now != sim.last_t) {
			sim.last_t = sim.now;
			sim.same = 0;
		}
		t = gpu_next();
		best = -1;
		for (i = 0; i < n; i++) {
			k = (int)((i + sim.rot) % (unsigned int)n);
			p = &sim.p[k / 2];
			w = k & 1 ? p->rel_wake : p->app_wake;
			if (w < t) {
				t = w;
				best = k;
			}
		}
		if (t >= end)
			break;
		progress(t);
		sim.now = t;
		for (i = 0; i < sim.cfg.n; i++)
			gate_audit(&sim.p[i]);
		if (best < 0)
			gpu_event();
		else if (best & 1)
			gate_releaser(&sim.p[best / 2]);
		else
			app_step(&sim.p[best / 2]);
	}
	if (sim.stuck)
		return;
	progress(end);
	sim.now = end;
}

double sim_share(int i)
{
	return 100.0 * (double)sim.p[i].gpu_ns /
	       (double)(sim.win_end - sim.win_start);
}

double sim_busy(void)
{
	return 100.0 * (double)sim.busy_ns / (double)(sim.win_end - sim.win_start);
}
