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

struct gs_feedback {
	int dev;		/* CUDA ordinal */
	uint32_t limit;		/* the share, percent 1..99 */
	bool on;
	uint64_t last_at;	/* CLOCK_MONOTONIC ns of the last step */
	uint64_t last_charged;	/* the core's charge then, ns */
	uint64_t last_own;	/* own GPU time then, ns */
	double weight;		/* the weight in force (percent, may exceed the limit) */
	void *priv;		/* the source's state */
};

/* Set up for CUDA device @dev held to @limit percent. */
void gs_feedback_init(struct gs_feedback *f, int dev, uint32_t limit, uint64_t now);

/*
 * At each standalone acquire: @charged_ns is the core's total charge for
 * the process's entity (gs_sched_used()).  Returns the weight (1..100) the
 * entity should have from now on, or 0 to leave it as it is.
 */
uint32_t gs_feedback_weight(struct gs_feedback *f, uint64_t charged_ns, uint64_t now);

#endif /* GPUSHARE_FEEDBACK_H */
