// SPDX-License-Identifier: Apache-2.0
/*
 * The compute gate standalone (gate.h): GPUSHARE_CORE_LIMIT, percent per
 * GPU; the process holds itself to it with the scheduler core
 * (kmod/gs_sched.c) compiled in, this process its only client.
 */
#include <stdbool.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "env.h"
#include "feedback.h"
#include "gate.h"
#include "ledger.h"

void gate_standalone_acquire(struct gate *g)
{
	uint64_t t = mono_ns();
	uint32_t w = gs_feedback_weight(&g->fb, gs_sched_used(&g->core, &g->ent, t), t);

	if (w)
		gs_sched_set_weight(&g->core, &g->ent, w, t);
	for (;;) {
		u64 now = mono_ns(), until;
		if (gs_sched_acquire(&g->core, &g->client, now, &until) == GS_SCHED_GRANT) {
			gate_granted(g, until, true);
			return;
		}
		/* Nobody else can wake us: sleep until the core says (bounded). */
		if (until <= now)
			until = now + 100000;
		else if (until - now > 1000000000ull)
			until = now + 1000000000ull;
		sleep_until(until);
	}
}

/* GPUSHARE_CORE_LIMIT for @dev: by its UUID's place, or by ordinal. */
static uint32_t standalone_limit(int dev)
{
	char uuid[GS_UUID_MAX];

	if (!gate_cfg.nuuids)
		return dev < gate_cfg.nlimits ? gate_cfg.limits[dev] : 0;
	gs_cuda_attach(dev);
	if (!gs_ledger_uuid(dev, uuid))
		return 0;
	for (int i = 0; i < gate_cfg.nuuids; i++)
		if (gs_uuid_equal(gate_cfg.uuids[i], uuid))
			return gate_cfg.limits[i];
	return 0;
}

/* Standalone, the first slow path on @dev: the core, or pass (no limit). */
void gate_standalone_setup(struct gate *g, int dev)
{
	uint32_t limit = standalone_limit(dev);
	if (limit == 0 || limit >= 100) {
		gate_pass(g);
		return;
	}
	uint64_t now = mono_ns();
	gs_sched_init(&g->core, now);
	gs_sched_set_policy(&g->core, 3, now);
	/*
	 * Its own core: a long drain stalls nobody else, so it may be long
	 * (a second) and every queue shorter than that is charged exactly.
	 */
	gs_sched_set_drain(&g->core, STANDALONE_DRAIN_NS, now);
	if (gs_sched_add(&g->core, &g->ent, limit, 0, now)) {
		gate_pass(g);
		return;
	}
	gs_sched_attach(&g->core, &g->client, &g->ent, now);
	gs_feedback_init(&g->fb, dev, limit, now);
	g->slice_ns = g->core.slice_ns;
	gate_pace_setup(g, g->core.drain_ns, false);
	g->how = HOW_STANDALONE;
}
