/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * The deep-queue model of test_deep.c, in simulated time (ns).  One GPU,
 * containers of one process each, the scheduler core (gs_sched.c) and the
 * gate's pacer (libgpushare/src/pace.c) linked in as they are, and the
 * gate (libgpushare/src/gate*.c) modelled on its design: sim_gate.c (the
 * launch path), sim_drain.c (drains, the releaser), sim_sched.c (the
 * module's side: wake-ups, audited releases).
 *
 * The GPU (sim.c) runs each process's kernels in order, on its stream:
 *   FIFO  one kernel at a time, in submission order across processes (the
 *         tests' fake GPU);
 *   TS    a GPU without MPS: while more than one context has work they
 *         take turns of turn_ns, a kernel is preempted at its turn's end,
 *         and every change of the running context costs switch_ns.
 * An event recorded on a stream completes when the GPU has finished the
 * work queued on that stream before it.  Shares are the GPU time each
 * process's kernels actually executed, never what anybody reported.
 *
 * An application keeps up to q kernels of d ns queued: APP_BATCH launches
 * q, then synchronises; APP_WINDOW launches whenever fewer than q are in
 * flight.  A launch costs LAUNCH_NS of CPU; its kernel is queued when the
 * call starts.  Every launch goes through the gate first.
 */
#ifndef _GS_TEST_SIM_H
#define _GS_TEST_SIM_H

#include "gs_sched.h"
#include "pace.h"

#define US		1000ull
#define MS		(1000ull * US)
#define SEC		(1000ull * MS)
#define NEVER		(~0ull)
#define SIM_MAXP	4		/* processes (= containers) */
#define SIM_RING	4096		/* FIFO runs queued on the GPU */
#define SIM_LATE	4		/* unfinished drains kept for later */
#define LAUNCH_NS	(2 * US)	/* CPU time of one launch */
#define POLL_NS		(100 * US)	/* the gate polls events this often */
#define STANDIN_NS	(250 * US)	/* the stand-in's ACQUIRE poll */
#define MINWAIT_NS	(20 * US)	/* the module's shortest sleep */

enum sim_gpu { GPU_FIFO, GPU_TS };
enum sim_app { APP_BATCH, APP_WINDOW };
enum sim_gate { GATE_NEW, GATE_LEGACY };
enum sim_wake { WAKE_MODULE, WAKE_POLL };

/* What a process's gate does besides the protocol (the tenant's). */
enum sim_evil {
	EVIL_NONE,
	EVIL_X10,	/* reports ten times its GPU time */
	EVIL_MAX,	/* reports 2^64 - 1 */
	EVIL_ZERO,	/* reports 0 */
	EVIL_HOG,	/* submits past its slice while heartbeating */
	EVIL_EARLY,	/* releases without draining, reports 0 */
	EVIL_LATE,	/* lets its slices end by force, reports 2^64 - 1 late */
};

/* The application thread: where it is. */
enum sim_ast { A_RUN, A_SYNC, A_SLOT, A_GATE };

/* The gate, on the application's thread. */
enum sim_gst {
	G_OUT,		/* not in the gate's slow path */
	G_ACQ,		/* blocking ACQUIRE */
	G_DRAIN,	/* draining its queue before a release */
	G_PROBE,	/* waiting for its oldest probe (new gate) */
	G_FIT,		/* renewed early: waiting for the queue to fit */
	G_LOCKED,	/* the releaser holds the gate's lock */
};

/* An event recorded on a process's stream. */
struct sim_mark {
	u64 target;		/* completes when this many kernels have */
	u64 at;			/* when it completed, NEVER: not yet */
};

struct sim_proc {
	/* Set up by the test. */
	int ctr;
	enum sim_app app;
	u32 q;
	u64 d;
	enum sim_evil evil;
	/* The GPU's side. */
	u64 sub, done;		/* kernels submitted, completed */
	u64 head_rem;		/* the head kernel's time left */
	u64 gpu_ns;		/* executed in the measuring window */
	u64 last_end;		/* its last execution ended */
	u64 max_gap;		/* longest time between its executions */
	u64 max_wait;		/* ... counted from another's last grant */
	u64 granted_at;		/* its last grant or renewal */
	u64 max_queue;		/* most work queued at a launch, ns */
	/* The application's thread. */
	enum sim_ast ast;
	u64 app_wake;
	u32 left;		/* batch: launches left before the sync */
	/* The gate (sim_gate.c). */
	enum sim_gst gst;
	struct gs_sched_client c;
	struct gs_pace pace;
	bool in_slice;		/* something to drain and release */
	bool renewed;		/* renewed, no launch since */
	bool timed;		/* the slice's start event is recorded */
	bool fresh;		/* drained, no launch since */
	u64 until;		/* the grant's end */
	u64 deadline;		/* the drain's bound */
	u64 next_hb;		/* the drain's next heartbeat */
	u64 hb_last;		/* its last heartbeat (0: none) */
	struct sim_mark start, end;
	struct sim_mark probe[GS_PACE_SLOTS];
	bool probe_have;	/* a completed probe to time from */
	u64 probe_at;		/* its completion */
	bool hogging;		/* EVIL_HOG: submitting past its slice */
	u64 hog_end;		/* until then */
	int nlate;
	struct sim_mark late_start[SIM_LATE], late_end[SIM_LATE];
	/* The releaser thread. */
	bool rel_drain;		/* it is draining (holds the gate's lock) */
	u64 rel_wake, rel_retry;
	/* Figures. */
	u64 tail_ns;		/* EVIL_EARLY: queued work left at releases */
	u64 releases, early_stops;
};

struct sim_ctr {
	struct gs_sched_ent e;
};

struct sim_cfg {
	u32 policy;
	u32 max_inst;		/* policy 0 */
	int n;			/* containers, one process each */
	u32 weight[SIM_MAXP];
	enum sim_gpu gpu;
	u64 turn_ns, switch_ns;	/* TS */
	enum sim_app app[SIM_MAXP];
	u32 q[SIM_MAXP];
	u64 d[SIM_MAXP];
	enum sim_evil evil[SIM_MAXP];
	enum sim_gate gate;
	enum sim_wake wake;
	bool no_tail;		/* the gate records no tail probe at a STOP */
	u64 slice_ns, drain_ns;
	u64 warm_ns, len_ns;	/* measured from warm_ns for len_ns */
};

/* Audits over a run (and over every run: the totals). */
struct sim_audit {
	u64 credited, taken;	/* refunds to others, tokens of late reporters */
	u64 refund_bad;		/* releases that credited others more */
	u64 wait_bad;		/* waits past until without heartbeating */
	u64 hb_gap;		/* longest heartbeat gap past a slice's end */
	u64 empty_stops;	/* STOPs of a launch after a drain */
};

struct sim {
	struct sim_cfg cfg;
	struct gs_sched s;
	u64 now;
	u64 win_start, win_end;
	u64 busy_ns;		/* the GPU executed, in the window */
	/* The GPU. */
	u64 g_t;		/* progress applied up to here */
	int cur;		/* TS: the running context, -1: none */
	int last;		/* the context that ran last */
	u64 sw_until;		/* TS: switching until then */
	u64 turn_end;
	struct { int p; u32 n; } ring[SIM_RING];	/* FIFO */
	u32 r_head, r_len;
	unsigned int rot;
	u64 last_t, same;	/* steps at one instant */
	bool stuck;		/* too many: the run stopped */
	struct sim_audit audit;
	struct sim_proc p[SIM_MAXP];
	struct sim_ctr ctr[SIM_MAXP];
};

extern struct sim sim;
extern struct sim_audit sim_total;

/* sim.c: the GPU, the applications, the run. */
void sim_setup(const struct sim_cfg *cfg);
void sim_run(u64 end);
void sim_submit(struct sim_proc *p);
u64 sim_queued_ns(const struct sim_proc *p);
void sim_mark(struct sim_proc *p, struct sim_mark *m);
double sim_share(int i);
double sim_busy(void);

/* sim_gate.c: the gates, on the application's thread. */
bool gate_launch(struct sim_proc *p);

/* sim_drain.c: drains, the releaser, the audit at every event. */
void gate_releaser(struct sim_proc *p);
void gate_arm(struct sim_proc *p);
void gate_audit(const struct sim_proc *p);
void sim_reap(struct sim_proc *p);
void sim_give_back(struct sim_proc *p, u64 used);
void sim_drain_start(struct sim_proc *p, u64 bound);
u64 sim_drain_bound(const struct sim_proc *p);
int sim_drain_poll(struct sim_proc *p, bool keep, u64 *wake);
void sim_early_tail(struct sim_proc *p);

/* sim_sched.c: the module's side of the gate's calls. */
void gate_wake_all(void);
bool sim_acquire(struct sim_proc *p, u64 *until);
bool sim_renew(struct sim_proc *p, u64 *until);
void sim_heartbeat(struct sim_proc *p);
void sim_release(struct sim_proc *p, u64 used);

static inline u64 sim_min(u64 a, u64 b)
{
	return a < b ? a : b;
}

static inline u64 sim_max(u64 a, u64 b)
{
	return a > b ? a : b;
}

static inline u64 sim_slice(void)
{
	return sim.cfg.slice_ns;
}

/* GS_SCHED_GRACE(): how long a holder keeps the GPU past its slice. */
static inline u64 sim_grace(void)
{
	return sim.cfg.slice_ns / 4;
}

static inline bool sim_new(void)
{
	return sim.cfg.gate == GATE_NEW;
}

#endif /* _GS_TEST_SIM_H */
