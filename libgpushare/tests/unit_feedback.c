// SPDX-License-Identifier: Apache-2.0
/*
 * Standalone feedback's arithmetic (src/feedback.c), with a source of
 * samples made up here: steps and their edges (idle, no own time, zero,
 * huge and backward deltas), the charge's history, the samples' spans,
 * and the controller end to end (it converges to limit / rho, alone it
 * leaves the weight, and each way of failing turns it off with the limit
 * back).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "feedback.h"
#include "unit.h"

#define MS 1000000ull

/* ---- the source, scripted ---- */

static int ready_answer = 1;	/* gs_fb_source_ready's */
static int open_answer = 1;	/* gs_fb_source_open's */
static int poll_error;		/* gs_fb_source_poll fails */
static uint64_t src_now;	/* the source's clock: samples up to here exist */
static uint64_t src_last;	/* the newest sample handed out */
static uint32_t own_pct;	/* this process's utilisation, percent */
#define PERIOD (166 * MS)

int gs_fb_source_ready(void)
{
	return ready_answer;
}

int gs_fb_source_open(struct gs_feedback *f)
{
	if (open_answer == 1)
		f->pid = 42;
	return open_answer;
}

/* A sample every PERIOD, of own_pct (none when 0), as NVML gives them. */
int gs_fb_source_poll(struct gs_feedback *f, struct gs_fb_sample *out, int max,
		      uint64_t *newest)
{
	int n = 0;

	(void)f;
	if (poll_error)
		return -1;
	*newest = 0;
	for (uint64_t t = (src_last / PERIOD + 1) * PERIOD; t <= src_now; t += PERIOD) {
		if (own_pct && n < max)
			out[n++] = (struct gs_fb_sample){ .util = own_pct, .at = t };
		*newest = src_last = t;
	}
	return n;
}

/*
 * Run the controller for @ms: an acquire every 10 ms charging @charged_pct
 * of the time; the weight it ends at (the last nonzero answer, or @w).
 */
static uint32_t run(struct gs_feedback *f, uint64_t *now, uint64_t *charged, uint32_t ms,
		    uint32_t charged_pct, uint32_t w)
{
	for (uint32_t i = 0; i < ms / 10; i++) {
		*now += 10 * MS;
		*charged += 10 * MS * charged_pct / 100;
		src_now = *now;
		uint32_t r = gs_feedback_weight(f, *charged, *now);
		if (r)
			w = r;
	}
	return w;
}

static void test_step(void)
{
	struct gs_feedback f;

	gs_feedback_init(&f, 0, 30, 0);
	CHECK(f.on && f.weight == 30 && f.applied == 30);
	/* Nothing measured: no time, or charged under 5 % of it. */
	CHECK(gs_fb_step(&f, 10, 10, 0) == 0);
	CHECK(gs_fb_step(&f, 0, 0, 200 * MS) == 0);
	CHECK(gs_fb_step(&f, 5 * MS, 9 * MS, 200 * MS) == 0 && f.weight == 30);
	/* Half the charge is ours: the weight goes halfway to 60 each step. */
	CHECK(gs_fb_step(&f, 30 * MS, 60 * MS, 200 * MS) == 45 && f.weight == 45);
	CHECK(gs_fb_step(&f, 30 * MS, 60 * MS, 200 * MS) == 53);
	for (int i = 0; i < 20; i++)
		gs_fb_step(&f, 30 * MS, 60 * MS, 200 * MS);
	CHECK(f.applied == 60);
	CHECK(gs_fb_step(&f, 30 * MS, 60 * MS, 200 * MS) == 0);	/* unchanged: 0 */
	/* rho tiny: bounded to 100; huge: bounded to 1 (never 0). */
	for (int i = 0; i < 30; i++)
		gs_fb_step(&f, 1, UINT64_MAX / 2, 200 * MS);
	CHECK(f.applied == 100 && f.weight <= 100);
	for (int i = 0; i < 30; i++)
		gs_fb_step(&f, UINT64_MAX, 200 * MS, 200 * MS);
	CHECK(f.applied == 1 && f.weight >= 1);
	/* Charged, no own time: FB_BLIND (5) steps in a row, then off, the limit back. */
	for (int i = 0; i < 4; i++)
		CHECK(gs_fb_step(&f, 0, 100 * MS, 200 * MS) == 0 && f.on);
	CHECK(gs_fb_step(&f, 0, 100 * MS, 200 * MS) == 30 && !f.on && f.weight == 30);
	/* ... and the count starts again after a step with own time. */
	gs_feedback_init(&f, 0, 30, 0);
	for (int i = 0; i < 4; i++)
		gs_fb_step(&f, 0, 100 * MS, 200 * MS);
	gs_fb_step(&f, 50 * MS, 100 * MS, 200 * MS);
	for (int i = 0; i < 4; i++)
		gs_fb_step(&f, 0, 100 * MS, 200 * MS);
	CHECK(f.on);
	/* Alone (rho 1): the weight stays, nothing to apply. */
	gs_feedback_init(&f, 0, 30, 0);
	for (int i = 0; i < 10; i++)
		CHECK(gs_fb_step(&f, 60 * MS, 60 * MS, 200 * MS) == 0);
	CHECK(f.weight == 30);
}

static void test_history(void)
{
	struct gs_feedback f;
	uint64_t now = 1000 * MS;

	gs_feedback_init(&f, 0, 30, 0);
	f.on = false;		/* only the history: nothing is asked */
	CHECK(gs_fb_charged_at(&f, 5) == 0);
	f.on = true;
	f.poll_at = UINT64_MAX;
	/* 1 ms of charge per ms, a point every 10 ms, 3 ms apart here. */
	for (int i = 0; i <= 100; i++, now += 3 * MS)
		gs_feedback_weight(&f, now - 1000 * MS, now);
	CHECK(gs_fb_charged_at(&f, 1000 * MS) == 0);
	CHECK(gs_fb_charged_at(&f, 1150 * MS) == 150 * MS);
	CHECK(gs_fb_charged_at(&f, 1151 * MS) == 151 * MS);	/* between points */
	CHECK(gs_fb_charged_at(&f, 999 * MS) == 0);		/* before: the oldest */
	CHECK(gs_fb_charged_at(&f, 1300 * MS) == 300 * MS);	/* the newest */
	CHECK(gs_fb_charged_at(&f, UINT64_MAX) == 300 * MS);
	/* Time or charge going back (a wrap): not kept. */
	gs_feedback_weight(&f, 1, now);
	gs_feedback_weight(&f, 400 * MS, 10 * MS);
	CHECK(gs_fb_charged_at(&f, UINT64_MAX) == 300 * MS);
	/* The ring keeps the newest GS_FB_HIST points: 20 s later, the old are gone. */
	for (int i = 0; i < 2000; i++, now += 10 * MS)
		gs_feedback_weight(&f, 300 * MS + (uint64_t)i * MS, now);
	CHECK(gs_fb_charged_at(&f, 1000 * MS) == 300 * MS + (2000 - GS_FB_HIST) * MS);
}

static void test_integrate(void)
{
	struct gs_feedback f;
	struct gs_fb_sample s[] = {
		{ 50, 200 * MS }, { 100, 300 * MS }, { 100, 300 * MS },	/* a repeat */
		{ 40, 250 * MS },					/* out of order */
		{ 200, 400 * MS },					/* over 100 % */
		{ 10, 3400 * MS },					/* after 3 s */
	};

	gs_feedback_init(&f, 0, 30, 0);
	/*
	 * Since 100 ms: 50.5 % of 100, 100 % of 100, 100 % of 100, 10.5 % of
	 * 1 s (capped): an integer percent is the middle of its range.
	 */
	gs_fb_integrate(&f, s, 6, 100 * MS);
	CHECK(f.own == 50500000 + 100 * MS + 100 * MS + 105 * MS);
	/* Nothing before @since counts. */
	f.own = 0;
	gs_fb_integrate(&f, s, 2, 250 * MS);
	CHECK(f.own == 50 * MS);
	gs_fb_integrate(&f, s, 0, 0);
	CHECK(f.own == 50 * MS);
}

static void test_controller(void)
{
	struct gs_feedback f;
	uint64_t now = 5000 * MS, charged = 0;

	/*
	 * Held at 30 %, charged 60 % of the time, 30 % of it its own (read as
	 * 30.5): weight 30 * 60 / 30.5 = 59.
	 */
	src_last = src_now = now;
	gs_feedback_init(&f, 0, 30, now);
	own_pct = 30;
	CHECK(run(&f, &now, &charged, 5000, 60, 30) == 59 && f.on);
	/* Alone: charged what it ran; 29.5 is 30 still. */
	gs_feedback_init(&f, 0, 30, now);
	CHECK(run(&f, &now, &charged, 3000, 30, 0) == 0 && f.applied == 30);
	/* Idle: nothing charged, nothing seen; the weight stays, on. */
	gs_feedback_init(&f, 0, 30, now);
	own_pct = 0;
	CHECK(run(&f, &now, &charged, 3000, 0, 0) == 0 && f.on && !f.blind);
	/* Charged but never seen (not our pid): off after 5 steps (2 periods each). */
	gs_feedback_init(&f, 0, 30, now);
	own_pct = 30;
	CHECK(run(&f, &now, &charged, 3000, 60, 0) == 59);
	own_pct = 0;
	run(&f, &now, &charged, 1000, 60, 0);
	CHECK(f.on);
	CHECK(run(&f, &now, &charged, 1000, 60, 0) == 30 && !f.on);
	/* GPUSHARE_STANDALONE_FEEDBACK=0: never asks, never answers. */
	setenv("GPUSHARE_STANDALONE_FEEDBACK", "0", 1);
	gs_feedback_init(&f, 0, 30, now);
	own_pct = 30;
	CHECK(!f.on && run(&f, &now, &charged, 3000, 60, 0) == 0 && !f.pid);
	setenv("GPUSHARE_STANDALONE_FEEDBACK", "1", 1);
	/* NVML loading: the weight stays, for up to 30 s; then off. */
	ready_answer = 0;
	gs_feedback_init(&f, 0, 30, now);
	run(&f, &now, &charged, 29000, 60, 0);
	CHECK(f.on && !f.pid && f.applied == 30);
	run(&f, &now, &charged, 2000, 60, 0);
	CHECK(!f.on);
	/* No NVML: off at once. */
	ready_answer = -1;
	gs_feedback_init(&f, 0, 30, now);
	CHECK(run(&f, &now, &charged, 100, 60, 0) == 0 && !f.on);
	ready_answer = 1;
	/* No device: off at once; no pid: after three tries. */
	open_answer = -1;
	gs_feedback_init(&f, 0, 30, now);
	CHECK(run(&f, &now, &charged, 100, 60, 0) == 0 && !f.on);
	open_answer = 0;
	gs_feedback_init(&f, 0, 30, now);
	run(&f, &now, &charged, 1500, 60, 0);
	CHECK(f.on && f.tries == 2);
	run(&f, &now, &charged, 1500, 60, 0);
	CHECK(!f.on && f.weight == 30);
	/* The source failing ten polls in a row: off, the limit back. */
	open_answer = 1;
	gs_feedback_init(&f, 0, 30, now);
	src_last = now;
	CHECK(run(&f, &now, &charged, 3000, 60, 0) == 59);
	poll_error = 1;
	CHECK(run(&f, &now, &charged, 1500, 60, 0) == 30 && !f.on);
	poll_error = 0;
}

int main(void)
{
	test_step();
	test_history();
	test_integrate();
	test_controller();
	return DONE("unit_feedback");
}
