// SPDX-License-Identifier: Apache-2.0
/*
 * Standalone feedback (feedback.h).
 *
 * Standalone, the process's private core charges it for the time it held
 * the GPU (and the span its events measured), which next to a busy
 * neighbour takes in the neighbour's kernels: held to 30 %, it got about
 * 18 %.  So the weight follows the process's own GPU time as the driver
 * measures it: over steps of at least FB_STEP_NS,
 *
 *	rho = own GPU time / what the core charged,	weight := limit / rho
 *
 * (an EWMA of 1/2, bounded to 1..100), and then own time = rho x charge =
 * limit.  Alone, rho is about 1 and the weight stays the limit.
 *
 * The own time comes from the source (feedback_nvml.c: NVML's per-process
 * utilisation samples, each a percent of a sampling period that ends at
 * its time stamp).  They arrive late and seldom (about every 1/6 s), so a
 * step compares like with like: own time integrated up to the newest
 * sample, and the charge the core had reached then, interpolated from a
 * short history of the charges seen at the acquires.
 *
 * A sample covers the time since the process's previous sample, but never
 * before the newest sample (of any process) of the previous poll: a
 * process with no sample in a poll had no utilisation then (NVML lists
 * only processes with some), so a sample after a pause is not counted
 * over the pause.
 *
 * Off, for good, and the weight back to the limit: GPUSHARE_STANDALONE_
 * FEEDBACK=0; no source or no pid (FB_TRIES attempts); FB_ERRORS failed
 * polls in a row; or FB_BLIND steps in a row in which the core charged the
 * process at least FB_ACTIVE_PCT of the time and the source saw no own
 * time at all (the pid is not ours, or the driver does not sample it).
 * Steps charged less than that (an idle process) measure nothing and
 * leave the weight as it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "feedback.h"

#define FB_POLL_NS	100000000ull	/* the source is asked at most this often */
#define FB_STEP_NS	200000000ull	/* a step covers at least this much time */
#define FB_RETRY_NS	1000000000ull	/* a pid not found: look again after this */
#define FB_LOAD_NS	30000000000ull	/* NVML not loaded by then: off */
#define FB_HIST_NS	10000000ull	/* a point of the charge's history at most this often */
#define FB_SPAN_MAX_NS	1000000000ull	/* what one sample may cover */
#define FB_TRIES	3
#define FB_ERRORS	10
#define FB_BLIND	5
#define FB_ACTIVE_PCT	5
#define FB_SAMPLES	64

static void say(const struct gs_feedback *f, const char *what)
{
	if (getenv("GPUSHARE_DEBUG"))
		fprintf(stderr, "gpushare: pid %d: standalone feedback on CUDA device %d: %s\n",
			(int)getpid(), f->dev, what);
}

void gs_feedback_init(struct gs_feedback *f, int dev, uint32_t limit, uint64_t now)
{
	const char *e = getenv("GPUSHARE_STANDALONE_FEEDBACK");

	*f = (struct gs_feedback){ .dev = dev, .limit = limit, .last_at = now,
				   .weight = limit, .applied = limit, .started = now };
	f->on = !(e && strcmp(e, "0") == 0);
}

/* Off for good: the weight goes back to the limit (0: it is the limit). */
static uint32_t off(struct gs_feedback *f, const char *why)
{
	say(f, why);
	f->on = false;
	f->weight = f->limit;
	if (f->applied == f->limit)
		return 0;
	f->applied = f->limit;
	return f->limit;
}

/*
 * Note the core's charge @charged at @now: the newest point, kept in the
 * ring once FB_HIST_NS after the ring's last (the ring then covers
 * GS_FB_HIST times that, enough for the samples' delay).  A point out of
 * order (time or charge going back) is not kept.
 */
static void remember(struct gs_feedback *f, uint64_t charged, uint64_t now)
{
	const struct gs_fb_point *last = f->nhist ?
		&f->hist[(f->hhead + f->nhist - 1) % GS_FB_HIST] : NULL;

	if (last && (now < last->at || charged < last->charged))
		return;
	f->tail = (struct gs_fb_point){ now, charged };
	if (last && now < last->at + FB_HIST_NS)
		return;
	if (f->nhist == GS_FB_HIST) {
		f->hhead = (f->hhead + 1) % GS_FB_HIST;
		f->nhist--;
	}
	f->hist[(f->hhead + f->nhist++) % GS_FB_HIST] = f->tail;
}

/*
 * The charge at @t, interpolated between the points around it; before the
 * oldest, the oldest's; after the newest, the newest's.
 */
uint64_t gs_fb_charged_at(const struct gs_feedback *f, uint64_t t)
{
	struct gs_fb_point a = { 0, 0 };

	for (int i = 0; i <= f->nhist; i++) {
		const struct gs_fb_point *p = i < f->nhist ?
			&f->hist[(f->hhead + i) % GS_FB_HIST] : &f->tail;
		if (p->at >= t) {
			if (i == 0 || p->at == a.at || p->charged < a.charged)
				return i == 0 ? p->charged : a.charged;
			return a.charged + (uint64_t)((double)(p->charged - a.charged) *
						      (double)(t - a.at) / (double)(p->at - a.at));
		}
		a = *p;
	}
	return a.charged;
}

/*
 * Add the own time of @n samples (oldest first) of a poll whose previous
 * newest sample was at @since: each covers the time since the one before
 * it, never before @since, and at most FB_SPAN_MAX_NS.  An integer percent
 * u is read as u + 1/2 (below 100): the middle of what a truncating driver
 * reports as u, and if it rounds, half a percent more than the truth, so
 * the process errs slow (30 % read as 30 would be up to 3 % fast).
 */
void gs_fb_integrate(struct gs_feedback *f, const struct gs_fb_sample *s, int n,
		     uint64_t since)
{
	uint64_t from = since;

	for (int i = 0; i < n; i++) {
		if (s[i].at <= from)
			continue;
		uint64_t span = s[i].at - from;
		if (span > FB_SPAN_MAX_NS)
			span = FB_SPAN_MAX_NS;
		f->own += s[i].util >= 100 ? span : span / 200 * (2 * s[i].util + 1);
		from = s[i].at;
	}
}

/*
 * A step over @span ns in which the process ran @own ns and was charged
 * @charged: the new weight, or 0 to keep it.
 */
uint32_t gs_fb_step(struct gs_feedback *f, uint64_t own, uint64_t charged, uint64_t span)
{
	double target;
	uint32_t w;

	if (!span || (double)charged * 100 < (double)span * FB_ACTIVE_PCT)
		return 0;	/* (nearly) idle: nothing measured */
	if (!own)
		return ++f->blind >= FB_BLIND ? off(f, "off: charged, but no own GPU time seen") : 0;
	f->blind = 0;
	target = (double)f->limit * (double)charged / (double)own;	/* limit / rho */
	if (!(target >= 1))
		target = 1;
	if (target > 100)
		target = 100;
	f->weight = (f->weight + target) / 2;
	w = (uint32_t)(f->weight + 0.5);	/* 1..100 as the weight and target are */
	if (w == f->applied)
		return 0;
	f->applied = w;
	return w;
}

/*
 * Find our pid in the source (or give up).  NVML loads in the background
 * (its init can take long: never in a launch's path); meanwhile the
 * weight stays the limit.
 */
static uint32_t open_source(struct gs_feedback *f, uint64_t charged, uint64_t now)
{
	char msg[64];
	int r = gs_fb_source_ready();

	if (r == 0)
		return now - f->started < FB_LOAD_NS ? 0 : off(f, "off: NVML did not load");
	if (r > 0)
		r = gs_fb_source_open(f);
	if (r < 0 || (r == 0 && ++f->tries >= FB_TRIES))
		return off(f, "off: own GPU time cannot be measured (no NVML, or no pid of ours)");
	if (r == 0) {
		f->poll_at = now + FB_RETRY_NS;
		return 0;
	}
	snprintf(msg, sizeof(msg), "on, NVML pid %u", f->pid);
	say(f, msg);
	f->seen = now;
	f->last_at = now;
	f->last_charged = charged;
	f->last_own = f->own = 0;
	return 0;
}

uint32_t gs_feedback_weight(struct gs_feedback *f, uint64_t charged_ns, uint64_t now)
{
	struct gs_fb_sample s[FB_SAMPLES];
	uint64_t newest = 0, since = f->seen;
	int n;

	if (!f->on)
		return 0;
	remember(f, charged_ns, now);
	if (now < f->poll_at)
		return 0;
	f->poll_at = now + FB_POLL_NS;
	if (!f->pid)
		return open_source(f, charged_ns, now);
	n = gs_fb_source_poll(f, s, FB_SAMPLES, &newest);
	if (n < 0)
		return ++f->errors >= FB_ERRORS ? off(f, "off: NVML fails") : 0;
	f->errors = 0;
	if (newest > now)
		newest = now;
	if (newest <= since)
		return 0;
	gs_fb_integrate(f, s, n, since);
	f->seen = newest;
	if (newest < f->last_at + FB_STEP_NS)
		return 0;
	/* A step: own time up to the newest sample, against the charge then. */
	uint64_t charged = gs_fb_charged_at(f, newest), own = f->own - f->last_own;
	uint64_t dc = charged > f->last_charged ? charged - f->last_charged : 0;
	uint32_t w = gs_fb_step(f, own, dc, newest - f->last_at);

	f->last_at = newest;
	f->last_own = f->own;
	if (charged > f->last_charged)
		f->last_charged = charged;
	return w;
}
