/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * gpushare compute scheduler core, internal: what its files share.
 *   gs_sched.c         entities, settings, rates and token accrual
 *   gs_sched_turn.c    whose turn it is: acquire, renew, extend, release
 *   gs_sched_charge.c  charging holds, late releases and their refunds
 * Only these files include this header (gs_sched.h is the interface).
 */
#ifndef _GS_SCHED_INT_H
#define _GS_SCHED_INT_H

#include "gs_sched.h"

#ifdef __KERNEL__
#include <linux/math64.h>
#include <linux/stddef.h>

static inline u64 gs_div(u64 a, u64 b)
{
	return div64_u64(a, b);
}

static inline u64 gs_div_rem(u64 a, u32 b, u32 *rem)
{
	return div_u64_rem(a, b, rem);
}
#else
#include <stddef.h>

static inline u64 gs_div(u64 a, u64 b)
{
	return a / b;
}

static inline u64 gs_div_rem(u64 a, u32 b, u32 *rem)
{
	*rem = a % b;
	return a / b;
}
#endif

#define GS_U64_MAX		(~0ull)
#define GS_SLICE_MIN_NS		1000ull
#define GS_SLICE_MAX_NS		(10ull * 1000 * 1000 * 1000)
#define GS_DRAIN_MIN_NS		((u64)GPUSHARE_DRAIN_US_MIN * 1000)
#define GS_DRAIN_MAX_NS		((u64)GPUSHARE_DRAIN_US_MAX * 1000)
#define GS_POLICY_NATIVE	5
#define GS_POLICY_WEAK		4

static inline u64 gs_add(u64 a, u64 b)
{
	return a + b < a ? GS_U64_MAX : a + b;
}

static inline u64 gs_sub0(u64 a, u64 b)
{
	return a > b ? a - b : 0;
}

static inline u64 gs_grace(const struct gs_sched *s)
{
	return GS_SCHED_GRACE(s);
}

/*
 * The deepest debt: a second, a few slices and the longest drain, whatever
 * was reported (a hold can last a slice and drain_ns: below the floor its
 * excess would go uncharged).
 */
static inline s64 gs_floor(const struct gs_sched *s)
{
	return -(s64)(GS_SCHED_SAVE_NS + 4 * s->slice_ns + s->drain_ns);
}

static inline bool gs_native(const struct gs_sched *s)
{
	return s->policy == GS_POLICY_NATIVE;
}

/*
 * An entity that wants the GPU keeps what it accrues while others hold
 * it (their long graphs, their late work), up to a bound; one that wants
 * nothing may save one slice ahead at most.
 */
static inline s64 gs_cap(const struct gs_sched *s,
			 const struct gs_sched_ent *e)
{
	if (e->waiting || e->in_slice || s->holder == e)
		return (s64)(GS_SCHED_SAVE_NS + s->slice_ns);
	return (s64)s->slice_ns;
}

/*
 * A slice is in progress: until it ends, every other entity's waiter has
 * been told to ask again at its end at the latest (or is woken when the
 * GPU changes hands before), and nothing but the holder's release can
 * let one in earlier; so a change of the waiting or online set, or of the
 * rates, needs no wake-up then: the waiters see it at their next ask.
 */
static inline bool gs_live(const struct gs_sched *s, u64 now)
{
	return s->holder && now < s->hold_until;
}

/* Is @c in the slice in progress (its entity holds the GPU)? */
static inline bool gs_holding(const struct gs_sched *s,
			      const struct gs_sched_client *c)
{
	return c->ent && s->holder == c->ent && c->slice == s->slice;
}

/* gs_sched.c */
u64 gs_advance(struct gs_sched *s, u64 now);

/* gs_sched_turn.c */
void gs_end_slice(struct gs_sched *s, u64 end);

/* gs_sched_charge.c */
u64 gs_forfeit(const struct gs_sched *s, struct gs_sched_ent *e, u64 ns,
	       bool free);
void gs_charge_hold(struct gs_sched *s, u64 start, u64 stop);
void gs_leave_late(struct gs_sched *s, struct gs_sched_client *c);
bool gs_leave(struct gs_sched *s, struct gs_sched_client *c, u64 used_ns,
	      u64 now);

#endif /* _GS_SCHED_INT_H */
