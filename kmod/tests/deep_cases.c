// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The deep-queue acceptance cases beyond the matrix (test_deep.c):
 *
 *   S5  a tenant reporting x10, 2^64 - 1 or 0 gains at most 0.5 points
 *       (policy 3 at 10 %, policy 2 at 1:2, Q 1..512);
 *   S6  refunds are transfers: every release of every run credits others
 *       no more than it takes from the reporter (test_deep.c's deep_run()),
 *       and a pair whose one member lets its slices end by force and
 *       reports 2^64 - 1 late gets at most its honest share + 0.5;
 *   S7  a hog that heartbeats and submits past its slice gains at most a
 *       point, and the other container waits at most a slice, drain_ns, a
 *       kernel and 1 ms from the hog's last grant;
 *   S8  a tenant that releases without draining and reports 0 gains at most
 *       the work it had queued at its releases, and no more than reporting
 *       0 gave under 94b5eb2 (the residual: recorded);
 *   S9  launches of 50 and 100 ms, drain_ns 120 ms: within a point; with
 *       drain_ns shorter than the launch the loss is recorded, next to the
 *       old gate's;
 *   S11 the pacer: a lone container's queue never exceeds a slice and one
 *       launch; a cost over-estimated 2 or 10 times is within 10 % after
 *       two slices; the first launch of a grant with an empty queue goes;
 *       (every run) no wait past until without heartbeats.
 */
#include <string.h>

#include "deep.h"

#define PAIRS	2	/* S5-S8: policy 3 (a tenant at 10 %), policy 2 1:2 */

static const struct deep_conf *conf(int i)
{
	return &deep_confs[i ? 0 : 3];
}

static double dmax(double a, double b)
{
	return a > b ? a : b;
}

/* Container 0 of @k is @evil, under @gate, Q of 340 us; @len 0: usual. */
static double tenant_for(const struct deep_conf *k, enum sim_evil evil,
			 enum sim_gate gate, int ga, u32 q, u64 len,
			 struct deep_res *r, const char *what)
{
	struct sim_cfg c;

	deep_cfg(&c, k, ga ? GPU_TS : GPU_FIFO, ga ? APP_WINDOW : APP_BATCH, q,
		 340 * US);
	c.evil[0] = evil;
	c.gate = gate;
	if (len)
		c.len_ns = len;
	deep_run(&c, k, r, what);
	return r->share[0];
}

static double tenant(const struct deep_conf *k, enum sim_evil evil,
		     enum sim_gate gate, int ga, u32 q, struct deep_res *r,
		     const char *what)
{
	return tenant_for(k, evil, gate, ga, q, 0, r, what);
}

/*
 * The cells of S5, S6 and S8: FIFO batch and TS window (ga 0, 1) at the
 * depths (from @first) in turn.
 */
static int ncells(int first)
{
	return 2 * ((deep_small ? 2 : 4) - first);
}

static u32 cell(int first, int j, int *ga)
{
	int n = ncells(first) / 2, qi = first + j % n;

	*ga = j / n;
	return deep_small ? deep_q[qi ? 3 : 1] : deep_q[qi];
}

static void s5(void)
{
	static const enum sim_evil ev[] = { EVIL_X10, EVIL_MAX, EVIL_ZERO };
	double honest, s, gain[3], old, now;
	int i, j, ga, e;
	struct deep_res r;
	u32 q;

	for (i = 0; i < PAIRS; i++) {
		memset(gain, 0, sizeof(gain));
		old = 0;
		now = 0;
		for (j = 0; j < ncells(0); j++) {
			q = cell(0, j, &ga);
			honest = tenant(conf(i), EVIL_NONE, GATE_NEW, ga, q, &r, "S5");
			for (e = 0; e < 3; e++) {
				s = tenant(conf(i), ev[e], GATE_NEW, ga, q, &r, "S5");
				gain[e] = dmax(gain[e], s - honest);
				CHECK(s <= honest + 0.5, "S5 %s %d ga %d Q=%u: %.2f > %.2f",
				      conf(i)->name, ev[e], ga, q, s, honest);
			}
			now = dmax(now, tenant(conf(i), EVIL_ZERO, GATE_LEGACY, ga,
					       q, &r, "S5"));
			old = dmax(old, deep_legacy_share(i ? 0 : 3, ga, q, EVIL_ZERO));
		}
		printf("S5 %s, tenant at %.1f %%, most gained reporting x10 %+.2f,",
		       conf(i)->name, conf(i)->want[0], gain[0]);
		printf(" 2^64-1 %+.2f, 0 %+.2f points; reporting 0 with the old",
		       gain[1], gain[2]);
		printf(" gate: %.1f %% (94b5eb2's core), %.1f %% (this one)\n",
		       old, now);
	}
}

static void s6(void)
{
	static const int cfgs[] = { 1, 3 };	/* p2 1:1:2, p3 10/30/50 */
	double honest, pair, gain;
	int i, j, ga, forced;
	struct deep_res r;
	struct sim_cfg c;
	u32 q;

	for (i = 0; i < 2; i++) {
		const struct deep_conf *k = &deep_confs[cfgs[i]];

		gain = -100;
		forced = 0;
		for (j = 0; j < ncells(deep_small ? 0 : 1); j++) {
			q = cell(deep_small ? 0 : 1, j, &ga);
			deep_cfg(&c, k, ga, ga, q, 340 * US);
			deep_run(&c, k, &r, "S6");
			honest = r.share[0] + r.share[1];
			c.evil[0] = EVIL_LATE;
			deep_run(&c, k, &r, "S6");
			pair = r.share[0] + r.share[1];
			forced += (int)r.forced;
			gain = dmax(gain, pair - honest);
			CHECK(pair <= honest + 0.5, "S6 %s %s: pair %.2f > %.2f",
			      k->name, deep_cell(&c), pair, honest);
		}
		printf("S6 %s, the first two colluding (one ends by force and",
		       k->name);
		printf(" reports 2^64-1 late): pair %+.2f points at most,", gain);
		printf(" %d forced ends\n", forced);
	}
}

static void s7(void)
{
	/* A hog's turn is 110 ms: long runs, or one turn is a point. */
	u64 len = deep_full ? 240 * SEC : deep_small ? 30 * SEC : 60 * SEC;
	u64 gap = 0, hgap = 0, bound = 10 * MS + 100 * MS + 340 * US + MS;
	double honest, s, gain;
	int i, j, ga;
	struct deep_res r;
	u32 q;

	for (i = 0; i < PAIRS; i++) {
		gain = -100;
		for (j = 0; j < 6; j++) {
			ga = j / 3;
			q = deep_q[1 + j % 3];
			honest = tenant_for(conf(i), EVIL_NONE, GATE_NEW, ga, q, len,
					    &r, "S7");
			s = tenant_for(conf(i), EVIL_HOG, GATE_NEW, ga, q, len, &r,
				       "S7");
			gain = dmax(gain, s - honest);
			CHECK(s <= honest + 1.0, "S7 %s ga %d Q=%u: %.2f > %.2f",
			      conf(i)->name, ga, q, s, honest);
			if (conf(i)->n != 2)
				continue;
			/* The other's longest wait from the hog's last grant. */
			CHECK(sim.p[1].max_wait <= bound, "S7 ga %d Q=%u: %.2f ms",
			      ga, q, sim.p[1].max_wait / 1e6);
			gap = sim_max(sim.p[1].max_wait, gap);
			hgap = sim_max(sim.p[1].max_gap, hgap);
		}
		printf("S7 %s, tenant at %.1f %% heartbeating past its slices:",
		       conf(i)->name, conf(i)->want[0]);
		printf(" %+.2f points at most\n", gain);
	}
	printf("S7 p2 1:2, the other's longest wait from the hog's last grant:");
	printf(" %.2f ms (bound %.2f; its longest gap %.2f ms)\n", gap / 1e6,
	       bound / 1e6, hgap / 1e6);
}

/*
 * Finding F3: releasing early beats reporting 0 under 94b5eb2 where that
 * report gained nothing (8 queued: no late work to hide), and on the TS
 * GPU with window applications (the tail time-slices with the next
 * holder); releasing early under the old gate gains as much (recorded).
 */
static bool f3(int i, int ga, u32 q)
{
	return q == 8 || (i == 1 && ga);
}

static void s8_cell(int i, int ga, u32 q)
{
	double honest, s, old, now, early, tail;
	const char *name = conf(i)->name;
	struct deep_res r;

	honest = tenant(conf(i), EVIL_NONE, GATE_NEW, ga, q, &r, "S8");
	s = tenant(conf(i), EVIL_EARLY, GATE_NEW, ga, q, &r, "S8");
	tail = 100.0 * sim.p[0].tail_ns / sim.cfg.len_ns;
	CHECK(s - honest <= tail + 0.5, "S8 %s ga %d Q=%u: %+.2f, tail %.2f",
	      name, ga, q, s - honest, tail);
	old = deep_legacy_share(i ? 0 : 3, ga, q, EVIL_ZERO);
	now = tenant(conf(i), EVIL_ZERO, GATE_LEGACY, ga, q, &r, "S8");
	early = tenant(conf(i), EVIL_EARLY, GATE_LEGACY, ga, q, &r, "S8");
	if (f3(i, ga, q))
		XFAIL(s <= old + 0.5, "F3", "S8 %s ga %d Q=%u: %.2f, 0: %.2f",
		      name, ga, q, s, old);
	else
		CHECK(s <= old + 0.5, "S8 %s ga %d Q=%u: %.2f, 0: %.2f", name,
		      ga, q, s, old);
	printf("S8 %s %s Q=%u: releasing early %.2f %% (honest %.2f,", name,
	       ga ? "TS window" : "FIFO batch", q, s, honest);
	printf(" its tail %.2f points); the old gate: reporting 0 %.2f %%",
	       tail, old);
	printf(" (94b5eb2's core), %.2f %% (this one), releasing early",
	       now);
	printf(" %.2f %%\n", early);
}

static void s8(void)
{
	int i, j, ga;
	u32 q;

	for (i = 0; i < PAIRS; i++)
		for (j = 0; j < ncells(deep_small ? 0 : 1); j++) {
			q = cell(deep_small ? 0 : 1, j, &ga);
			s8_cell(i, ga, q);
		}
}

/* Weights 1:2, both with @q launches of @d queued, drain_ns @drain. */
static void long_pair(u64 d, u32 q, u64 drain, enum sim_gate gate, int ga,
		      enum sim_app app, struct deep_res *r)
{
	struct sim_cfg c;

	deep_cfg(&c, &deep_confs[0], ga ? GPU_TS : GPU_FIFO, app, q, d);
	c.drain_ns = drain;
	c.gate = gate;
	c.warm_ns = 2 * SEC;
	c.len_ns = deep_full ? 60 * SEC : deep_small ? 10 * SEC : 20 * SEC;
	deep_run(&c, &deep_confs[0], r, "S9");
}

/*
 * Finding F2: with two launches of 100 ms queued, chat is never learnt (no
 * backlogged pair of probes ends within one hold, and each drain bounded by
 * drain_ns drops the pending ones), so nothing is paced: the queue outlasts
 * slice + drain_ns and every slice ends by force.
 */
static void s9(void)
{
	unsigned long long ms;
	struct deep_res r, o;
	int i, ga;
	u64 d;

	for (i = 0; i < 4; i++) {
		d = (i / 2 + 1) * 50 * MS;
		ga = i % 2;
		ms = d / MS;
		long_pair(d, 1, 120 * MS, GATE_NEW, ga, ga, &r);
		printf("S9 %llu ms launches, %s 1, drain_ns 120 ms: %.2f : %.2f,",
		       ms, ga ? "TS window" : "FIFO batch", r.share[0], r.share[1]);
		printf(" %llu forced ends\n", (unsigned long long)r.forced);
		CHECK(r.err <= 1.0, "S9 %llu ms ga %d: %.2f %.2f", ms, ga,
		      r.share[0], r.share[1]);
		long_pair(d, 1, 20 * MS, GATE_NEW, ga, ga, &r);
		long_pair(d, 1, 20 * MS, GATE_LEGACY, ga, ga, &o);
		printf("S9 the same, drain_ns 20 ms (recorded): %.2f : %.2f,",
		       r.share[0], r.share[1]);
		printf(" %llu forced ends (the old gate: %.2f : %.2f)\n",
		       (unsigned long long)r.forced, o.share[0], o.share[1]);
		long_pair(d, 2, 120 * MS, GATE_NEW, ga, APP_WINDOW, &r);
		printf("S9 %llu ms launches, %s window 2, drain_ns 120 ms:", ms,
		       ga ? "TS" : "FIFO");
		printf(" %.2f : %.2f, %llu forced ends\n", r.share[0],
		       r.share[1], (unsigned long long)r.forced);
		if (d == 100 * MS)
			XFAIL(r.err <= 1.0, "F2", "S9 %llu ms window 2 ga %d: %.2f",
			      ms, ga, r.share[0]);
		else
			CHECK(r.err <= 1.0, "S9 %llu ms window 2 ga %d: %.2f", ms,
			      ga, r.share[0]);
	}
}

/* One container alone on the GPU. */
static const struct deep_conf lone = {
	"alone", 2, 0, 1, { 50 }, { 100 }, true, 0
};

static void s11_unit(void)
{
	struct gs_pace p;

	/* The first launch with an empty queue goes, whatever chat says. */
	gs_pace_init(&p, 10 * MS, 1000);
	CHECK(gs_pace_launch(&p, 1000, 1001) != GS_PACE_STOP, "S11 %s", "1st");
	atomic_store(&p.chat, 10 * SEC);
	gs_pace_drained(&p, 5000);
	CHECK(gs_pace_launch(&p, 5000, 5001) != GS_PACE_STOP, "S11 %s", "drained");
	CHECK(gs_pace_launch(&p, 5000, 5001) == GS_PACE_STOP, "S11 %s", "2nd");
	CHECK(gs_pace_launch(&p, 6000 + 10 * SEC, 6001 + 10 * SEC) !=
	      GS_PACE_STOP, "S11 %s", "ended");
}

/* A lone container's queue: at most a slice and one launch. */
static void s11_alone(void)
{
	int i, g, a, qi, di;
	struct deep_res r;
	struct sim_cfg c;
	u64 worst = 0, q;

	for (i = 0; i < 80; i++) {
		deep_cell_of(i, &g, &a, &qi, &di);
		if (deep_small && i % 4)
			continue;
		deep_cfg(&c, &lone, g, a, deep_q[qi], deep_d[di]);
		c.len_ns = deep_len / 2;
		deep_run(&c, &lone, &r, "S11");
		q = sim.p[0].max_queue;
		if (q > c.slice_ns + c.d[0] + worst)
			worst = q - c.slice_ns - c.d[0];
		CHECK(q <= c.slice_ns + c.d[0], "S11 %s: queue %.3f ms",
		      deep_cell(&c), q / 1e6);
		CHECK(r.busy >= 99.0, "S11 %s: alone %.2f %% busy",
		      deep_cell(&c), r.busy);
	}
	printf("S11 alone: queue at most a slice and one launch (%llu ns over)\n",
	       (unsigned long long)worst);
}

/* Lone, window 512 of @d, cost set to @f x @d at 1 s; *@busy: next 1 s. */
static double overestimate(u64 d, double f, bool no_tail, u64 after,
			   double *busy)
{
	struct sim_cfg c;
	u64 b;

	deep_cfg(&c, &lone, GPU_FIFO, APP_WINDOW, 512, d);
	c.no_tail = no_tail;
	c.warm_ns = 0;
	c.len_ns = 3 * SEC;
	sim_setup(&c);
	sim_run(SEC);
	atomic_store(&sim.p[0].pace.chat, (u64)(f * d));
	b = sim.busy_ns;
	sim_run(SEC + after);
	*busy = 100.0 * (sim.busy_ns - b) / after;
	return (double)atomic_load(&sim.p[0].pace.chat) / d;
}

static void s11(void)
{
	static const u32 f[] = { 2, 10 };
	double got, busy;
	int i;

	s11_unit();
	s11_alone();
	for (i = 0; i < 8; i++) {
		got = overestimate(deep_d[i / 2], f[i % 2], false, 20 * MS, &busy);
		printf("S11 %llu us kernels, cost over-estimated %ux: %.3fx",
		       (unsigned long long)(deep_d[i / 2] / US), f[i % 2], got);
		printf(" after two slices\n");
		CHECK(got >= 0.9 && got <= 1.1, "S11 %llu us x%u: %.3f",
		      (unsigned long long)(deep_d[i / 2] / US), f[i % 2], got);
	}
	/* Recorded: the gate as src/gate*.c has it, without the tail probe. */
	got = overestimate(5 * MS, 2, true, SEC, &busy);
	printf("S11 no tail probe, 5 ms kernels estimated at 10 ms: %.1f %%",
	       busy);
	printf(" busy over the next second, cost then %.2fx\n", got);
	got = overestimate(5 * MS, 2, false, SEC, &busy);
	printf("S11 with it: %.1f %% busy, cost then %.2fx\n", busy, got);
}

void deep_cases(void)
{
	s5();
	s6();
	s7();
	s8();
	s9();
	s11();
}
