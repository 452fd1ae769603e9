/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * The simulation that tests/test_sched*.c drive gs_sched.c with (see
 * test_sched.c), and their checks.
 */
#ifndef _TEST_SCHED_H
#define _TEST_SCHED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gs_sched.h"

#define US		1000ull
#define MS		(1000ull * US)
#define SEC		(1000ull * MS)
#define NEVER		(~0ull)
#define MAXC		8
#define MAXP		16
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* A share in percent is within @tol points of @want. */
static inline bool near(double got, double want, double tol)
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

extern struct sim sim;

void sim_init(u32 policy, u64 slice_ns);
int add_ctr(u32 weight, u32 highprio);
int add_proc(int ctr, u64 work_ns, u64 busy_ns, u64 idle_ns, u64 start);
void wake_all(void);
void run_until(u64 t);
void measure(u64 from, u64 to);
double share(int ctr);
void run_minute(void);

/* test_sched_policy.c */
void test_fair_share(void);
void test_preemptive(void);
void test_weighted(void);
void test_fixed(void);
void test_weak(void);
void test_native(void);
void test_highprio(void);
void test_graphs(void);
void test_live_settings(void);

/* test_sched_hold.c */
void test_switch(void);
void test_detach_wakes(void);
void test_stopped(void);
void test_hostile(void);
void test_offer_grief(void);
void test_idle_late(void);
void test_drain_bounds(void);

/* test_sched_late.c */
void test_extend(void);
void test_renew(void);
void test_refund_conservation(void);
void test_free_slice(void);
void test_late_reacquire(void);
void test_refund_keeps_gputime(void);

#endif /* _TEST_SCHED_H */
