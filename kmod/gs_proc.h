/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The /proc/gpushare attribute files: their descriptors (gs_proc.c has the
 * tables) and the one show and store that serve them all (gs_proc_attr.c).
 */
#ifndef _GS_PROC_H
#define _GS_PROC_H

#include "gs_kmod.h"

/* What a number's show reads under, besides gs_lock. */
enum gs_attr_lock {
	GS_LK_NONE,
	GS_LK_MEM,		/* gs_mem_lock: the ledger */
	GS_LK_SCHED,		/* the GPU's sched_lock: its scheduler */
};

/* The live setting of the GPU's scheduler a store hands on, if any. */
enum gs_knob {
	GS_KNOB_NONE,
	GS_KNOB_MAX_INST,	/* the fair share's denominator (policy 0) */
	GS_KNOB_POLICY,
	GS_KNOB_PRIO_RATIO,
	GS_KNOB_SLICE,
	GS_KNOB_DRAIN,
	GS_KNOB_WEIGHT,
	GS_KNOB_HIGHPRIO,
};

/*
 * One kind of attribute file.  Most show a number: a field of their
 * object (a struct gs_gpu, a struct gs_share or its quota) at @off, or
 * what @get computes, read under @lock; a few show text (@show).  A
 * writable one stores a number: @check bounds it and it goes into the
 * field, or @set stores it through the accounting; then @knob hands it to
 * the GPU's scheduler (under its sched_lock), which applies it at its next
 * decision, and waiters ask again.
 *
 * Show and store run under gs_lock, store in a gs_seq write section (it
 * may change what a query reads) and under gs_mem_lock (it may change a
 * memsize, which a reservation reads), so a store never sleeps.
 */
struct gs_attr {
	int (*show)(struct seq_file *m, void *obj);	/* text */
	u64 (*get)(void *obj);		/* a computed number */
	u16 off;			/* else the field's offset, */
	u8 size;			/* its size (4 or 8), */
	bool in_quota;			/* in the share's quota, not obj */
	u8 lock;			/* enum gs_attr_lock */
	u8 knob;			/* enum gs_knob */
	int (*check)(u64 val);		/* store into the field */
	int (*set)(void *obj, u64 val);	/* store otherwise */
};

enum { GS_TOP_VERSION, GS_TOP_DEFAULT_MEMSIZE, GS_TOP_NFILES };

extern const char *const gs_top_names[GS_TOP_NFILES];
extern const struct gs_attr gs_top_attrs[GS_TOP_NFILES];
extern const struct gs_attr gs_gpu_attrs[GS_GPU_NFILES];
extern const char *const gs_ctr_names[GS_CTR_NATTR];
extern const struct gs_attr gs_ctr_attrs[GS_CTR_NATTR];

static inline struct gs_gpu *gs_share_gpu(struct gs_share *share)
{
	return gs_gpus[share->quota->gpu];
}

#endif /* _GS_PROC_H */
