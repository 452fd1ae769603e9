// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * S10: the gate of 94b5eb2 (no pacer, no heartbeat: an ABI 3 library on an
 * ABI 4 module) still works on this core and is no worse than on 94b5eb2's
 * core: each container within 2 points of what it got there, or nearer
 * its target.  Not bit for bit: this core charges a late tail by the clock
 * (a report of 0 is not free), which moves the cells whose slices end by
 * force.  Where nothing is late it executes exactly what it did, and it
 * gives the fake GPU's figures (weights 1:2 at 64 queued: 1:1.508 at
 * 340 us, 1:1.000 at 600 us).
 *
 * The table (test_deep_legacy.h) has each cell's executed GPU time per
 * container, ns, with the old gate, 1 s of warm-up and 10 s measured, as
 * 94b5eb2's gs_sched.c gave it: this model linked against that file (with
 * stubs for the ABI-4 calls, which the old gate never makes).
 * GS_DEEP_LEGACY_TABLE=1 prints the table as the core linked in gives it.
 * Rows with a tenant (container 0 reporting 0) are S8's reference.
 */
#include "deep.h"

struct legacy_cell {
	int conf;
	enum sim_gpu gpu;
	enum sim_app app;
	u32 q;
	u64 d, switch_ns;
	enum sim_wake wake;
	enum sim_evil evil;
	u64 gpu_ns[3];
};

static const struct legacy_cell legacy[] = {
#include "test_deep_legacy.h"
};

static void legacy_cfg(struct sim_cfg *c, const struct legacy_cell *l)
{
	deep_cfg(c, &deep_confs[l->conf], l->gpu, l->app, l->q, l->d);
	c->switch_ns = l->switch_ns;
	c->wake = l->wake;
	c->gate = GATE_LEGACY;
	c->evil[0] = l->evil;
	c->warm_ns = SEC;
	c->len_ns = 10 * SEC;
}

double deep_legacy_share(int conf, enum sim_gpu gpu, u32 q,
			 enum sim_evil evil)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(legacy); i++)
		if (legacy[i].conf == conf && legacy[i].gpu == gpu &&
		    legacy[i].q == q && legacy[i].evil == evil)
			return 100.0 * legacy[i].gpu_ns[0] / (10 * SEC);
	return -1;
}

/*
 * Finding F5: on a time-sliced GPU two entities' late work runs at once,
 * and the late charge's exclusion of others' late windows (right on a
 * serial GPU, where a waiter's work queues behind them) undercharges the
 * later one: the old gate's 10:90 at 64 queued gives 18.9/81.1 here,
 * 15.7/84.3 on 94b5eb2 (both far from 10/90; a paced gate is never late).
 */
static bool f5(const struct legacy_cell *l)
{
	return l->conf == 2 && l->gpu == GPU_TS && l->q == 64;
}

/* Each share within 2 points of 94b5eb2's, or nearer its target. */
static bool no_worse(const struct legacy_cell *l, const struct deep_res *r)
{
	const struct deep_conf *conf = &deep_confs[l->conf];
	double old;
	int j;

	for (j = 0; j < conf->n; j++) {
		old = 100.0 * l->gpu_ns[j] / (10 * SEC);
		if (deep_abs(r->share[j] - old) > 2 &&
		    deep_abs(r->share[j] - conf->want[j]) >
		    deep_abs(old - conf->want[j]))
			return false;
	}
	return true;
}

static void print_row(const struct legacy_cell *l)
{
	printf("\t{ %d, %s, %s, %u, %llu * US, %llu * US, %s, %s,\n",
	       l->conf, l->gpu ? "GPU_TS" : "GPU_FIFO",
	       l->app ? "APP_WINDOW" : "APP_BATCH", l->q,
	       (unsigned long long)(l->d / US),
	       (unsigned long long)(l->switch_ns / US),
	       l->wake ? "WAKE_POLL" : "WAKE_MODULE",
	       l->evil ? "EVIL_ZERO" : "EVIL_NONE");
	printf("\t  { %lluull, %lluull, %lluull } },\n",
	       (unsigned long long)sim.p[0].gpu_ns,
	       (unsigned long long)sim.p[1].gpu_ns,
	       (unsigned long long)sim.p[2].gpu_ns);
}

static void check_row(const struct legacy_cell *l, const struct sim_cfg *c,
		      const struct deep_res *r)
{
	const char *name = deep_confs[l->conf].name;
	double want;
	int j, same;

	for (j = 0, same = 0; j < 3; j++)
		same += sim.p[j].gpu_ns == l->gpu_ns[j];
	printf("S10 %s %s: %.2f %.2f %.2f, busy %.1f %%, forced ends %llu:",
	       name, deep_cell(c), r->share[0], r->share[1], r->share[2],
	       r->busy, (unsigned long long)r->forced);
	printf(" %s 94b5eb2's core (%.2f %.2f %.2f)\n",
	       same == 3 ? "as on" : "NOT as on", l->gpu_ns[0] / 1e8,
	       l->gpu_ns[1] / 1e8, l->gpu_ns[2] / 1e8);
	if (f5(l))
		XFAIL(no_worse(l, r), "F5", "S10 %s %s", name, deep_cell(c));
	else
		CHECK(no_worse(l, r), "S10 %s %s", name, deep_cell(c));
	/* The fake GPU's (and the study's) weights 1:2 at 64 queued. */
	if (l->conf || l->q != 64 || l->switch_ns)
		return;
	want = l->d == 340 * US ? 1.508 : 1.0;
	CHECK(deep_abs(r->share[1] / r->share[0] - want) <= 0.05,
	      "S10 fake GPU: 1:%.3f at %llu us", r->share[1] / r->share[0],
	      (unsigned long long)(l->d / US));
}

void deep_s10(bool table)
{
	const struct legacy_cell *l;
	struct deep_res r;
	struct sim_cfg c;
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(legacy); i++) {
		l = &legacy[i];
		if (!table && l->evil)
			continue;
		legacy_cfg(&c, l);
		deep_run(&c, &deep_confs[l->conf], &r, "S10");
		if (table)
			print_row(l);
		else
			check_row(l, &c, &r);
	}
}

/* GS_DEEP_FULL: how many cells the old gate misses (the study: 253 of 568). */
void deep_legacy_matrix(void)
{
	int ci, i, g, a, qi, di, bad = 0, runs = 0;
	struct deep_res r;
	struct sim_cfg c;

	for (ci = 0; ci < DEEP_NCONF; ci++) {
		for (i = 0; i < 80; i++) {
			deep_cell_of(i, &g, &a, &qi, &di);
			deep_cfg(&c, &deep_confs[ci], g, a, deep_q[qi],
				 deep_d[di]);
			c.gate = GATE_LEGACY;
			deep_run(&c, &deep_confs[ci], &r, "S10");
			runs++;
			bad += r.err > 1.0 ||
			       (deep_confs[ci].fill && r.busy < 97.0);
		}
	}
	printf("S10 the old gate misses S1 in %d of %d cells\n", bad, runs);
}
