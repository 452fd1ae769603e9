/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gpushare.ko internals shared by its source files.
 *
 * Locking:
 * - gs_cfg_lock serialises every change of structure (inst_ctl commands:
 *   GPUs declared, containers added, bound and deleted) and is held while
 *   procfs entries are created and removed.  It also guards gs_dying, so
 *   that module exit can wait for the command in flight and refuse the
 *   rest, even on a forced unload that ignores module references.
 * - gs_lock protects every value (accounting, per-file settings, the
 *   bindings) and the writers of the gs_ctrs list; procfs handlers take it.
 *   Order: gs_cfg_lock, then gs_lock.  procfs entries are never removed
 *   under gs_lock, because removal waits for handlers that may be waiting
 *   for it.
 * - /dev/gpushare takes no lock: it walks gs_ctrs under RCU (entries are
 *   freed after a grace period) and reads a container's quotas and binding
 *   inside a gs_seq read section; every store to those is made under
 *   gs_lock inside a gs_seq write section.  So a query never waits for
 *   (or delays) a command, and always sees one consistent state.
 */
#ifndef _GS_KMOD_H
#define _GS_KMOD_H

#include <linux/cgroup.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/proc_fs.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/seqlock.h>

#include "gs_core.h"

#define GPUSHARE_VERSION	"0.1.0"		/* /proc/gpushare/version */
#define GS_PROC_NAME		"gpushare"	/* /proc/gpushare */

struct gs_attr;

/* What one procfs attribute file shows: which attribute of which object. */
struct gs_file {
	const struct gs_attr *attr;
	void *obj;
};

#define GS_CTR_NATTR	6

struct gs_gpu {
	u32 index;
	struct gs_acct acct;
	u32 policy;
	u32 prio_ratio;
	struct proc_dir_entry *dir;
	struct gs_file files[GS_GPU_NFILES];
};

struct gs_ctr;

/* A container's share of one GPU: its directory /proc/gpushare/<gpu>/<id>. */
struct gs_share {
	struct gs_ctr *ctr;
	struct gs_quota *quota;
	struct proc_dir_entry *dir;
	struct gs_file files[GS_CTR_NATTR];
};

struct gs_ctr {
	struct list_head node;		/* in gs_ctrs, under RCU */
	struct rcu_head rcu;
	char id[GPUSHARE_ID_MAX + 1];
	bool live;			/* registered, counted, pinning the module */
	/*
	 * The bound cgroup v2, referenced, or NULL.  The reference keeps the
	 * pointer unique; a binding whose cgroup has been removed counts as
	 * none (gs_bound()) until gs_reap() drops it.
	 */
	struct cgroup *cgrp;
	u32 nquota;
	struct gs_quota quota[GPUSHARE_MAX_GPUS];
	struct gs_share share[GPUSHARE_MAX_GPUS];
};

extern struct mutex gs_lock;
extern struct mutex gs_cfg_lock;
extern seqcount_mutex_t gs_seq;
extern bool gs_dying;
extern struct gs_gpu *gs_gpus[GPUSHARE_MAX_GPUS];
extern struct gs_acct *gs_accts[GPUSHARE_MAX_GPUS];
extern struct list_head gs_ctrs;
extern u64 gs_default_mem;

struct gs_ctr *gs_find(const char *id);
struct gs_ctr *gs_find_task(struct cgroup **cgrpp);
struct cgroup *gs_bound(const struct gs_ctr *ctr);
int gs_exec(struct gs_cmd *cmd);
void gs_dump(struct seq_file *m);

int gs_proc_init(void);
void gs_proc_exit(void);
int gs_proc_add_gpu(struct gs_gpu *gpu);
int gs_proc_add_share(struct gs_share *share);

int gs_dev_init(void);
void gs_dev_exit(void);

#endif /* _GS_KMOD_H */
