/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * gpushare compute scheduler core: who may submit work to one GPU, when.
 *
 * Plain C with no kernel service and no clock of its own: every call is
 * given the time (@now, nanoseconds of one monotonic clock), so the same
 * files (gs_sched.c, gs_sched_turn.c, gs_sched_charge.c) run in
 * gpushare.ko (ktime_get_ns(), under a spinlock), in
 * libgpushare.so's standalone mode (CLOCK_MONOTONIC, under a mutex), in
 * the /dev/gpushare stand-in of the interposer's tests, and in a
 * user-space unit test driven by simulated time.  The caller serialises
 * every call on one struct gs_sched; nothing here sleeps or allocates.
 *
 * The model.  The GPU is time-sliced between containers (entities): one
 * entity at a time *holds* it, for a slice of slice_ns, and only its
 * processes (clients) submit work meanwhile.  A client asks with
 * gs_sched_acquire(): GS_SCHED_GRANT means "submit until *until", and
 * GS_SCHED_WAIT means "not yet: ask again at *until, or when woken" (the
 * caller wakes its waiters after every release or detach that returns
 * true, every acquire that changes the holder, the slice or the offer,
 * and every change of a setting or of the entities).  When the slice is
 * over, a client waits for its work to finish (so that the next holder
 * runs alone) and calls
 * gs_sched_release() with the GPU time its work took, measured on the
 * GPU.  The drain is part of the hold: a holder's own work ends inside
 * its own hold, so the next holder runs alone.  While it drains, a client
 * sends heartbeats (gs_sched_extend()) that push the slice's forced end
 * to a grace from now, never beyond drain_ns past the slice's end.  A
 * holder whose clients neither release nor extend within GS_SCHED_GRACE(s)
 * loses the GPU anyway, so a stopped or dead process can stall the others
 * for at most one slice and a grace, and a live one for a slice and
 * drain_ns, charged to it.  A client that sees its queued work would
 * outlast the slice renews early (gs_sched_renew()): a new slice from now
 * if it is still its entity's turn, else it stops submitting and drains.
 *
 * Accounting.  An entity is charged for the time it held the GPU (grant
 * to release: nobody else could use it meanwhile; a client cannot make
 * that smaller), plus whatever a client reports beyond it (work that ran
 * on after a slice was taken away).  Each entity has a token bucket:
 * tokens (ns of GPU time) accrue at its rate, at most one slice ahead;
 * charges take them away, into debt.  A rate-limited entity may be
 * granted a slice only with tokens >= 0, so over time it gets exactly its
 * rate, never more, whatever its work looks like (one long CUDA graph or
 * a thousand small kernels).  An entity that waits (or holds) keeps what
 * it accrues meanwhile, up to GS_SCHED_SAVE_NS and a slice, so others'
 * long work does not cost it its share.  Work reported past a slice taken
 * away is charged to its entity and refunded to the holders it kept off
 * the serial GPU meanwhile.  A slice granted to an entity with no
 * tokens (work conservation, or a high-priority entity alone) is
 * counted in used_ns but takes no tokens.  A policy switch forgives
 * debts and cuts savings to a slice.  A report can only add to its own
 * entity's charge, and a refund to others is a transfer: it is bounded by
 * the tokens the late report actually took and by the time the late work
 * could have run (up to now), so no report creates tokens.
 *
 * Rates by policy (ppm of the GPU; "online" entities have a client):
 *   0 fair share    1/max_inst each, used or not
 *   1 preemptive    1/(online entities); offline ones' slices are skipped
 *   2 weighted      weight / (sum of online entities' weights); alone, the
 *                   whole GPU
 *   3 fixed share   weight percent, never more
 *   4 weak          as 1, but work-conserving: a slice nobody eligible
 *                   wants goes to any waiter
 *   5 native        no scheduling: every acquire is granted at once, for
 *                   one slice (so that a switch away from 5 bites within
 *                   a slice: the client just asks again then)
 * Under 2 and 3, an entity of weight 0 has no rate: it is best effort,
 * served only when no rate-limited entity is eligible and waiting.
 * High priority: a highprio entity that waits is served first, at a rate
 * of prio_ratio percent while others wait too; alone it takes what it
 * wants; with no work it takes nothing.
 */
#ifndef _GS_SCHED_H
#define _GS_SCHED_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/types.h>
#else
/*
 * User space (libgpushare.so, the tests): the kernel's type names.  The
 * core is dual-licensed so that the Apache-2.0 interposer can link it.
 */
#include <errno.h>
#include <stdbool.h>
#include <linux/types.h>
typedef __u32 u32;
typedef __u64 u64;
typedef __s64 s64;
#endif

#include <gpushare.h>

#define GS_SCHED_MAX		GPUSHARE_MAX_INST_MAX	/* entities per GPU */
#define GS_SCHED_PPM		1000000u		/* the whole GPU */
#define GS_SCHED_SLICE_NS	(10ull * 1000 * 1000)	/* default slice */
/* How long past its slice a holder keeps the GPU waiting for a release. */
#define GS_SCHED_GRACE(s)	((s)->slice_ns / 4)
/* The default bound of a drain past the slice (gs_sched_set_drain()). */
#define GS_SCHED_DRAIN_NS	((u64)GPUSHARE_DRAIN_US_DEFAULT * 1000)
/* What a waiting entity may save, and (with a few slices) its deepest debt. */
#define GS_SCHED_SAVE_NS	(1000ull * 1000 * 1000)

enum gs_sched_answer {
	GS_SCHED_WAIT,
	GS_SCHED_GRANT,
};

/* A container's place in one GPU's schedule (its gs_share has one). */
struct gs_sched_ent {
	u32 weight;		/* percent, 0..100 */
	u32 highprio;		/* 0 or 1 */
	u32 clients;		/* attached clients: online when > 0 */
	u32 waiting;		/* clients waiting for a grant */
	u32 in_slice;		/* clients in the current slice */
	u32 rate;		/* ppm, from the policy; 0: best effort */
	s64 tokens;		/* ns it may still use; < 0: its debt */
	u64 used_ns;		/* everything it was charged, ns: never decreases */
	u64 last_grant;		/* when it last got a slice (round robin) */
	bool added;		/* in its gs_sched */
	u32 frac;		/* tokens' fraction, ns * ppm */
	u32 late;		/* clients still in slices taken away */
	bool stale;		/* offered the free GPU, did not come: skipped */
};

/* One process's (one open /dev/gpushare file's) use of one GPU. */
struct gs_sched_client {
	struct gs_sched_ent *ent;	/* NULL: not attached */
	u64 slice;		/* the slice it is in (its number), 0: none */
	u64 granted;		/* when it joined that slice */
	bool waiting;
	u64 since;		/* its first grant since its last report */
	u64 covered;		/* held time of earlier slices since then */
};

/* Slices taken away (late reports are charged past their end). */
#define GS_SCHED_FORCED		8
struct gs_sched_forced {
	u64 slice;
	u64 end;
	u64 cursor;		/* late work reported up to here */
	u64 busy;		/* ... and, by the clock, ran up to here */
	const struct gs_sched_ent *ent;
};

/* Recent holds, refunded where late work of others filled them. */
#define GS_SCHED_HIST		8
struct gs_sched_hold {
	struct gs_sched_ent *ent;
	u64 start;
	u64 stop;
	bool free;
};

/* One GPU. */
struct gs_sched {
	u32 policy;		/* 0..5, GPUSHARE_POLICY_DEFAULT */
	u32 prio_ratio;		/* percent, 20..99 */
	u32 max_inst;		/* 1..25, for policy 0 */
	u64 slice_ns;
	u64 drain_ns;		/* a holder's longest drain past its slice */
	u64 now;		/* when the tokens were last brought up to date */
	struct gs_sched_ent *holder;	/* NULL: the GPU is free */
	u64 hold_start;		/* when holder got it */
	u64 hold_until;		/* its slice ends */
	u64 hold_grace;		/* it loses the GPU then at the latest */
	u64 forced_ends;	/* slices ended by force, ever (a counter) */
	u64 slice;		/* number of the current (or last) slice */
	bool hold_free;		/* a free slice: charged without tokens */
	struct gs_sched_ent *offer;	/* due for the free GPU, since: */
	u64 offer_at;
	struct gs_sched_forced forced[GS_SCHED_FORCED];
	u32 forced_next;
	struct gs_sched_hold hist[GS_SCHED_HIST];
	u32 hist_next;
	u32 nents;
	struct gs_sched_ent *ents[GS_SCHED_MAX];
};

void gs_sched_init(struct gs_sched *s, u64 now);

/* Entities: -ENOSPC when GS_SCHED_MAX are there already. */
int gs_sched_add(struct gs_sched *s, struct gs_sched_ent *e, u32 weight,
		 u32 highprio, u64 now);
/* Removes @e; its clients must be detached first. */
void gs_sched_del(struct gs_sched *s, struct gs_sched_ent *e, u64 now);

/* Live settings: they take effect at the next decision (within a slice). */
void gs_sched_set_policy(struct gs_sched *s, u32 policy, u64 now);
void gs_sched_set_prio_ratio(struct gs_sched *s, u32 prio_ratio, u64 now);
void gs_sched_set_max_inst(struct gs_sched *s, u32 max_inst, u64 now);
void gs_sched_set_slice(struct gs_sched *s, u64 slice_ns, u64 now);
/* 0: the default; bounded to GPUSHARE_DRAIN_US_MIN..MAX microseconds. */
void gs_sched_set_drain(struct gs_sched *s, u64 drain_ns, u64 now);
void gs_sched_set_weight(struct gs_sched *s, struct gs_sched_ent *e,
			 u32 weight, u64 now);
void gs_sched_set_highprio(struct gs_sched *s, struct gs_sched_ent *e,
			   u32 highprio, u64 now);

/*
 * A client starts or stops using @e's GPU.  Detach also leaves its slice
 * and stops its waiting, as a release of nothing; it returns true when
 * that may let a waiter in sooner (wake the waiters): the release's
 * answer, or, outside a slice in progress, the rates changed (its entity
 * went offline).  Detaching a client that neither waits nor is the last
 * of its entity's in a slice, with other clients of its entity left,
 * changes nothing a waiter depends on and returns false, so that a
 * process looping open, ask, close does not wake everybody each time.
 */
void gs_sched_attach(struct gs_sched *s, struct gs_sched_client *c,
		     struct gs_sched_ent *e, u64 now);
bool gs_sched_detach(struct gs_sched *s, struct gs_sched_client *c, u64 now);

/*
 * May @c submit work now?  GS_SCHED_GRANT: yes, until *@until (joining
 * its entity's slice if that holds the GPU, or renewing its own slice
 * when it is still the entity's turn).  GS_SCHED_WAIT: no; @c counts as
 * waiting until it is granted, releases or detaches, and *@until is when
 * to ask again if nothing wakes it before.  Under policy 5 (and for a
 * client attached to nothing) every call is granted, for one slice.
 */
enum gs_sched_answer gs_sched_acquire(struct gs_sched *s,
				      struct gs_sched_client *c,
				      u64 now, u64 *until);

/*
 * Early renewal: @c, in its entity's slice before the slice's end, sees
 * its queued work would outlast it.  GS_SCHED_GRANT: the hold so far is
 * charged and a new slice starts now, until *@until.  GS_SCHED_WAIT:
 * somebody else is due (or @c is not in the slice in progress): stop
 * submitting, drain, release; *@until is the slice's forced end.  Never
 * makes @c a waiter.
 */
enum gs_sched_answer gs_sched_renew(struct gs_sched *s,
				    struct gs_sched_client *c,
				    u64 now, u64 *until);

/*
 * A heartbeat of @c while it drains its entity's slice: the forced end
 * moves to a grace from now, never beyond drain_ns past the slice's end.
 * True with the forced end in *@until; false when @c is not in the slice
 * in progress (or it was ended already), with *@until unchanged.
 */
bool gs_sched_extend(struct gs_sched *s, struct gs_sched_client *c, u64 now,
		     u64 *until);

/*
 * @c's work has finished: it leaves its slice (the holder's slice ends
 * when its last client leaves) and stops waiting.  @used_ns is the GPU
 * time its work took since its last report, as it measured it (bounded
 * by the time since its grant; 0 if it measured nothing).  Returns true
 * when the GPU changed hands or became free, or when @c's entity stopped
 * waiting outside a slice in progress (an offer to it, or a decision that
 * counted it as waiting, may change): wake the waiters then.
 */
bool gs_sched_release(struct gs_sched *s, struct gs_sched_client *c,
		      u64 used_ns, u64 now);

/*
 * An entity's total charged GPU time, ns, as of @now: its slice so far,
 * up to the slice's forced end (as extended so far) at most.
 */
u64 gs_sched_used(const struct gs_sched *s, const struct gs_sched_ent *e,
		  u64 now);

#endif /* _GS_SCHED_H */
