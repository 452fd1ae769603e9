/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Standalone mode's feedback (see feedback.c): the process's own GPU time,
 * as the driver measures it, steers the weight its private scheduler core
 * charges by, so that a hold shared with a neighbour's work is not charged
 * as if the process had had the GPU alone.
 */
#ifndef GPUSHARE_FEEDBACK_H
#define GPUSHARE_FEEDBACK_H

#include <stdbool.h>
#include <stdint.h>

#define GS_FB_HIST 128		/* the charge's recent history, points */

struct gs_feedback {
	int dev;		/* CUDA ordinal */
	uint32_t limit;		/* the share, percent 1..99 */
	bool on;
	uint64_t last_at;	/* CLOCK_MONOTONIC ns of the last step */
	uint64_t last_charged;	/* the core's charge then, ns */
	uint64_t last_own;	/* own GPU time then, ns */
	double weight;		/* the weight in force (percent, may exceed the limit) */
	void *priv;		/* the source's state (NVML's device handle) */
	/* feedback.c's */
	uint32_t pid;		/* ours, as the source numbers processes; 0: not found yet */
	uint32_t applied;	/* the weight last returned (the limit at first) */
	uint64_t started;	/* set up then */
	int tries;		/* failed attempts to find the pid */
	int errors;		/* failed polls in a row */
	int blind;		/* steps charged with no own time seen, in a row */
	uint64_t poll_at;	/* next poll of the source */
	uint64_t seen;		/* the newest sample seen (any process's), monotonic ns */
	uint64_t own;		/* own GPU time, integrated from the samples, ns */
	uint64_t cursor;	/* the source's: NVML's lastSeenTimeStamp */
	/* The charge's history: a ring of points (oldest first), then the newest. */
	int hhead, nhist;
	struct gs_fb_point { uint64_t at, charged; } hist[GS_FB_HIST], tail;
};

/* Set up for CUDA device @dev held to @limit percent. */
void gs_feedback_init(struct gs_feedback *f, int dev, uint32_t limit, uint64_t now);

/*
 * At each standalone acquire: @charged_ns is the core's total charge for
 * the process's entity (gs_sched_used()).  Returns the weight (1..100) the
 * entity should have from now on, or 0 to leave it as it is.
 */
uint32_t gs_feedback_weight(struct gs_feedback *f, uint64_t charged_ns, uint64_t now);

/* ---- the source of own GPU time (feedback_nvml.c; the unit test has its own) ---- */

/* A utilisation sample of this process: @util percent of the period ending @at. */
struct gs_fb_sample {
	uint32_t util;
	uint64_t at;		/* CLOCK_MONOTONIC ns */
};

/*
 * Is the source there?  1 yes, 0 not yet (it loads in the background: the
 * first call starts it), -1 never.
 */
int gs_fb_source_ready(void);

/*
 * Find the device and this process's pid in the source (f->priv, f->pid,
 * f->cursor): 1 found, 0 not now (ask again later), -1 never (off).
 */
int gs_fb_source_open(struct gs_feedback *f);

/*
 * The samples of f->pid newer than the last poll's, oldest first, up to
 * @max, and in *@newest the time of the newest sample of any process (the
 * source is complete up to there).  The count (0: nothing new), or -1 on
 * an error.
 */
int gs_fb_source_poll(struct gs_feedback *f, struct gs_fb_sample *out, int max,
		      uint64_t *newest);

/* ---- feedback.c's arithmetic, for the unit test ---- */

/* The core's charge at @t, from the history. */
uint64_t gs_fb_charged_at(const struct gs_feedback *f, uint64_t t);
/* Own time of @n samples of a poll whose previous newest was at @since. */
void gs_fb_integrate(struct gs_feedback *f, const struct gs_fb_sample *s, int n,
		     uint64_t since);
/* A step of @span ns: @own ns run, @charged ns charged; the new weight or 0. */
uint32_t gs_fb_step(struct gs_feedback *f, uint64_t own, uint64_t charged, uint64_t span);

#endif /* GPUSHARE_FEEDBACK_H */
