// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * gpushare compute scheduler core (gs_sched.h has the model): entities,
 * live settings, the rates the policy gives and the tokens they accrue.
 * gs_sched_turn.c decides whose turn it is; gs_sched_charge.c charges
 * holds and late work.
 *
 * Time never goes backwards here: a call whose @now is older than the
 * newest one seen acts at the newest one (no time passes).  Every sum of
 * times saturates, every debt is bounded, so no input overflows.
 */
#include "gs_sched_int.h"

/* Tokens accrue at e->rate ppm, up to gs_cap(). */
static void gs_accrue(const struct gs_sched *s, struct gs_sched_ent *e,
		      u64 dt)
{
	s64 cap = gs_cap(s, e);
	u64 room, need, acc;
	u32 rem;

	if (e->tokens >= cap) {
		e->tokens = cap;
		e->frac = 0;
		return;
	}
	if (!e->rate || !dt)
		return;
	/* room <= cap - floor, so room * PPM fits in 64 bits. */
	room = (u64)(cap - e->tokens);
	need = gs_div(gs_sub0(room * GS_SCHED_PPM, e->frac) + e->rate - 1,
		      e->rate);
	if (dt >= need) {
		e->tokens = cap;
		e->frac = 0;
		return;
	}
	/* dt < need, so dt * rate < room * PPM + rate: no overflow. */
	acc = dt * e->rate + e->frac;
	e->tokens += (s64)gs_div_rem(acc, GS_SCHED_PPM, &rem);
	e->frac = rem;
}

/* Bring every entity's tokens up to @now; returns the time to act at. */
u64 gs_advance(struct gs_sched *s, u64 now)
{
	u64 dt;
	u32 i;

	if (now <= s->now)
		return s->now;
	dt = now - s->now;
	for (i = 0; i < s->nents; i++)
		gs_accrue(s, s->ents[i], dt);
	s->now = now;
	return now;
}

/* Every entity's rate from the policy; true when one of them changed. */
static bool gs_rates(struct gs_sched *s)
{
	u32 max_inst = s->max_inst ? s->max_inst : 1;
	u32 ratio = s->prio_ratio < 100 ? s->prio_ratio : 100;
	u64 wsum = 0, rate;
	u32 online = 0, i;
	bool changed = false;

	/* High-priority entities do not dilute the others' shares. */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->highprio || !e->clients)
			continue;
		online++;
		wsum += e->weight < 100 ? e->weight : 100;
	}
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];
		u64 w = e->weight < 100 ? e->weight : 100;

		if (e->highprio) {
			rate = (u64)ratio * GS_SCHED_PPM / 100;
		} else {
			switch (s->policy) {
			case 0:
				rate = GS_SCHED_PPM / max_inst;
				rate = rate ? rate : 1;
				break;
			case 1:
			case GS_POLICY_WEAK:
				rate = e->clients ? GS_SCHED_PPM / online : 0;
				break;
			case 2:
				rate = e->clients && wsum ?
					gs_div(w * GS_SCHED_PPM, wsum) : 0;
				break;
			case 3:
				rate = w * GS_SCHED_PPM / 100;
				break;
			default:
				rate = 0;
				break;
			}
		}
		changed |= e->rate != (u32)rate;
		e->rate = (u32)rate;
	}
	return changed;
}

void gs_sched_init(struct gs_sched *s, u64 now)
{
	*s = (struct gs_sched){
		.policy = GPUSHARE_POLICY_DEFAULT,
		.prio_ratio = GPUSHARE_PRIO_RATIO_DEFAULT,
		.max_inst = GPUSHARE_MAX_INST_DEFAULT,
		.slice_ns = GS_SCHED_SLICE_NS,
		.drain_ns = GS_SCHED_DRAIN_NS,
		.now = now,
	};
}

int gs_sched_add(struct gs_sched *s, struct gs_sched_ent *e, u32 weight,
		 u32 highprio, u64 now)
{
	u32 i;

	/* @e may be uninitialised memory: look for it, do not read it. */
	for (i = 0; i < s->nents; i++)
		if (s->ents[i] == e)
			return -EEXIST;
	if (s->nents >= GS_SCHED_MAX)
		return -ENOSPC;
	gs_advance(s, now);
	*e = (struct gs_sched_ent){
		.weight = weight,
		.highprio = highprio,
		.added = true,
	};
	s->ents[s->nents++] = e;
	gs_rates(s);
	return 0;
}

void gs_sched_del(struct gs_sched *s, struct gs_sched_ent *e, u64 now)
{
	u32 i, j;

	for (i = 0; i < s->nents; i++)
		if (s->ents[i] == e)
			break;
	if (i == s->nents)
		return;
	now = gs_advance(s, now);
	if (s->holder == e)
		gs_end_slice(s, now);
	if (s->offer == e)
		s->offer = NULL;
	for (i = 0; i < GS_SCHED_HIST; i++)
		if (s->hist[i].ent == e)
			s->hist[i].ent = NULL;
	for (i = 0; i < GS_SCHED_FORCED; i++)
		if (s->forced[i].ent == e)
			s->forced[i].ent = NULL;
	for (i = 0, j = 0; i < s->nents; i++)
		if (s->ents[i] != e)
			s->ents[j++] = s->ents[i];
	s->nents = j;
	e->added = false;
	gs_rates(s);
}

void gs_sched_set_policy(struct gs_sched *s, u32 policy, u64 now)
{
	s64 slice = (s64)s->slice_ns;
	u32 i;

	now = gs_advance(s, now);
	/* The hold so far is part of the old debts too. */
	if (s->holder) {
		gs_charge_hold(s, s->hold_start, now);
		s->hold_start = now;
	}
	s->policy = policy;
	/*
	 * Old debts are forgiven and savings cut to a slice, so the new
	 * shares hold from the next decision (a debt would be paid in idle
	 * time when the new rates add up to the whole GPU).
	 */
	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->tokens < 0)
			e->tokens = 0;
		if (e->tokens > slice)
			e->tokens = slice;
	}
	gs_rates(s);
}

void gs_sched_set_prio_ratio(struct gs_sched *s, u32 prio_ratio, u64 now)
{
	gs_advance(s, now);
	s->prio_ratio = prio_ratio;
	gs_rates(s);
}

void gs_sched_set_max_inst(struct gs_sched *s, u32 max_inst, u64 now)
{
	gs_advance(s, now);
	s->max_inst = max_inst;
	gs_rates(s);
}

/* After the floor moved (and, @cap, the savings were cut to a slice). */
static void gs_clamp_tokens(struct gs_sched *s, bool cap)
{
	s64 floor = gs_floor(s);
	u32 i;

	for (i = 0; i < s->nents; i++) {
		struct gs_sched_ent *e = s->ents[i];

		if (e->tokens < floor)
			e->tokens = floor;
		if (cap && e->tokens > (s64)s->slice_ns)
			e->tokens = (s64)s->slice_ns;
	}
}

void gs_sched_set_slice(struct gs_sched *s, u64 slice_ns, u64 now)
{
	gs_advance(s, now);
	if (!slice_ns)
		slice_ns = GS_SCHED_SLICE_NS;
	if (slice_ns < GS_SLICE_MIN_NS)
		slice_ns = GS_SLICE_MIN_NS;
	if (slice_ns > GS_SLICE_MAX_NS)
		slice_ns = GS_SLICE_MAX_NS;
	s->slice_ns = slice_ns;
	gs_clamp_tokens(s, true);
}

void gs_sched_set_drain(struct gs_sched *s, u64 drain_ns, u64 now)
{
	gs_advance(s, now);
	if (!drain_ns)
		drain_ns = GS_SCHED_DRAIN_NS;
	if (drain_ns < GS_DRAIN_MIN_NS)
		drain_ns = GS_DRAIN_MIN_NS;
	if (drain_ns > GS_DRAIN_MAX_NS)
		drain_ns = GS_DRAIN_MAX_NS;
	s->drain_ns = drain_ns;
	gs_clamp_tokens(s, false);
}

void gs_sched_set_weight(struct gs_sched *s, struct gs_sched_ent *e,
			 u32 weight, u64 now)
{
	gs_advance(s, now);
	e->weight = weight;
	gs_rates(s);
}

void gs_sched_set_highprio(struct gs_sched *s, struct gs_sched_ent *e,
			   u32 highprio, u64 now)
{
	gs_advance(s, now);
	e->highprio = highprio;
	gs_rates(s);
}

void gs_sched_attach(struct gs_sched *s, struct gs_sched_client *c,
		     struct gs_sched_ent *e, u64 now)
{
	gs_advance(s, now);
	*c = (struct gs_sched_client){ .ent = e };
	e->clients++;
	gs_rates(s);
}

bool gs_sched_detach(struct gs_sched *s, struct gs_sched_client *c, u64 now)
{
	struct gs_sched_ent *e = c->ent;
	bool changed;

	if (!e)
		return false;
	changed = gs_sched_release(s, c, 0, now);
	if (e->clients)
		e->clients--;
	c->ent = NULL;
	/* Its entity went offline: the others' rates may be higher now. */
	if (gs_rates(s) && !gs_live(s, s->now))
		changed = true;
	return changed;
}

u64 gs_sched_used(const struct gs_sched *s, const struct gs_sched_ent *e,
		  u64 now)
{
	u64 end;

	if (s->holder != e)
		return e->used_ns;
	/*
	 * A slice not given back is ended by force at its grace's end (by the
	 * next call, gs_expire()) and charged no further: a reader before
	 * that call never sees more than will be charged.
	 */
	end = s->hold_grace;
	if (now > end)
		now = end;
	return gs_add(e->used_ns, gs_sub0(now, s->hold_start));
}
