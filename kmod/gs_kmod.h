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
 * - gs_mem_lock, a spinlock, covers the memory ledger: every container's
 *   gs_ledger, its tree of open files (ctr->files) and what each file
 *   holds (gs_fh->mine), and each GPU's acct.orphaned_mem; and, with
 *   gs_lock, every store to a container's memsize, so a reservation never
 *   sees a memsize below what is used.  It is taken alone by
 *   GPUSHARE_IOC_MEM and by the release of a /dev/gpushare file (so a
 *   reservation never waits for a command or a procfs reader), and inside
 *   gs_lock by whoever reads or writes those values there (admission,
 *   memsize writes, del, meminfo, free_memsize).  Order: gs_cfg_lock,
 *   gs_lock, gs_mem_lock.  Nothing sleeps under it.
 * - GPUSHARE_IOC_QUERY takes no lock: it walks gs_ctrs under RCU (entries
 *   are freed after a grace period) and reads a container's quotas and
 *   binding inside a gs_seq read section; every store to those is made
 *   under gs_lock inside a gs_seq write section.  So a query never waits
 *   for (or delays) a command, and always sees one consistent state.
 * - A container's memory (struct gs_ctr) is counted (ctr->ref): one
 *   reference for the registration, dropped by del, and one for each open
 *   /dev/gpushare file that acts for it, dropped when the file is
 *   released; the last one frees it after a grace period.  So the ledger
 *   of a deleted container outlives it for as long as a file may still
 *   release bytes to it.  open() takes its reference under RCU with
 *   kref_get_unless_zero() and attaches the file under gs_mem_lock only if
 *   the ledger is not orphaned yet; del orphans the ledgers under
 *   gs_mem_lock, so every file either is attached before (and its bytes
 *   move to orphaned_mem) or sees the container as gone.
 * - Each GPU's sched_lock, a spinlock, covers its compute scheduler: the
 *   struct gs_sched, the gs_sched_ent of every share on that GPU, the
 *   gs_sched_client of every open file for that GPU, and sched_gen.  It
 *   is the innermost lock: GPUSHARE_IOC_SCHED takes it alone; the
 *   procfs stores take it inside gs_mem_lock (policy, prio_ratio,
 *   max_inst, slice_us, drain_us, weight, highprio: live settings) and
 *   the readers of its state (gputime, forced_ends) alone, add inside
 *   gs_lock, and del and the release of a file inside gs_mem_lock, so
 *   that both walk ctr->files (under gs_mem_lock) and detach each file's
 *   client (under sched_lock) without racing each other.  Order:
 *   gs_cfg_lock, gs_lock, gs_mem_lock, sched_lock; never two GPUs'
 *   sched_locks at once.  Nothing sleeps under it: a waiting ACQUIRE
 *   drops it and sleeps on the GPU's sched_wq until sched_gen changes
 *   (every change that may let a waiter in bumps it and wakes the queue)
 *   or its retry time comes.
 * - gs_upgrade (see gs_upgrade.c) is written under gs_cfg_lock, gs_lock and
 *   gs_mem_lock together, so any of them is enough to read it: commands
 *   read it under gs_cfg_lock, setting writes under gs_lock, and open()
 *   of /dev/gpushare under gs_mem_lock, which also covers gs_nfiles, the
 *   count of open /dev/gpushare files.
 */
#ifndef _GS_KMOD_H
#define _GS_KMOD_H

#include <linux/cgroup.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/proc_fs.h>
#include <linux/rbtree.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/seqlock.h>
#include <linux/spinlock.h>
#include <linux/wait.h>

#include "gs_core.h"
#include "gs_sched.h"

/* /proc/gpushare/version; a build may set another (make GPUSHARE_VERSION=...) */
#ifndef GPUSHARE_VERSION
#define GPUSHARE_VERSION	"0.1.0"
#endif
#define GS_PROC_NAME		"gpushare"	/* /proc/gpushare */

struct gs_attr;

/* What one procfs attribute file shows: which attribute of which object. */
struct gs_file {
	const struct gs_attr *attr;
	void *obj;
};

#define GS_CTR_NATTR	8
#define GS_POLICY_NATIVE	5	/* no compute scheduling */

struct gs_gpu {
	u32 index;
	struct gs_acct acct;
	u32 policy;
	u32 prio_ratio;
	u32 slice_us;
	u32 drain_us;
	spinlock_t sched_lock;		/* the compute scheduler, see above */
	struct gs_sched sched;		/* under sched_lock */
	unsigned int sched_gen;		/* bumped on every wake, sched_lock */
	wait_queue_head_t sched_wq;	/* ACQUIREs waiting for their turn */
	struct proc_dir_entry *dir;
	struct gs_file files[GS_GPU_NFILES];
};

struct gs_ctr;

/* A container's share of one GPU: its directory /proc/gpushare/<gpu>/<id>. */
struct gs_share {
	struct gs_ctr *ctr;
	struct gs_quota *quota;
	struct gs_ledger ledger;	/* under gs_mem_lock */
	struct gs_sched_ent ent;	/* under its GPU's sched_lock */
	struct proc_dir_entry *dir;
	struct gs_file files[GS_CTR_NATTR];
};

struct gs_ctr {
	struct list_head node;		/* in gs_ctrs, under RCU */
	struct rcu_head rcu;
	struct kref ref;		/* the registration and each file */
	struct rb_root files;		/* struct gs_fh by opener, gs_mem_lock */
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

/*
 * An open /dev/gpushare file (its private_data): the container it acts for
 * and what it holds there.  ctr->files is a tree ordered by opener, so
 * that a file is added and removed in O(log n) under gs_mem_lock however
 * many a tenant opens, and meminfo finds each opener's files adjacent.
 */
struct gs_fh {
	struct rb_node node;		/* in ctr->files, under gs_mem_lock */
	struct gs_ctr *ctr;		/* referenced, or NULL: acts for none */
	struct pid *pid;		/* the opener's thread group, referenced */
	u64 mine[GPUSHARE_MAX_GPUS];	/* by quota index, under gs_mem_lock */
	/* Its place in each GPU's schedule, by quota index (sched_lock). */
	struct gs_sched_client sched[GPUSHARE_MAX_GPUS];
};

extern struct mutex gs_lock;
extern spinlock_t gs_mem_lock;
extern struct mutex gs_cfg_lock;
extern seqcount_mutex_t gs_seq;
extern bool gs_dying;
extern struct gs_gpu *gs_gpus[GPUSHARE_MAX_GPUS];
extern struct gs_acct *gs_accts[GPUSHARE_MAX_GPUS];
extern struct list_head gs_ctrs;
extern u64 gs_default_mem;
extern enum gs_upgrade_state gs_upgrade;
extern unsigned int gs_nfiles;

/* gs_main.c */
struct gs_ctr *gs_find(const char *id);
void gs_ctr_put(struct gs_ctr *ctr);

/* gs_registry.c: the commands, under gs_cfg_lock */
int gs_exec(struct gs_cmd *cmd);
int gs_declare_gpu(const struct gs_cmd *cmd);
int gs_add_ctr(const struct gs_cmd *cmd);
int gs_del_ctr(const char *id);
void gs_sched_kick(struct gs_gpu *gpu);

/* gs_bind.c */
struct gs_ctr *gs_find_task(struct cgroup **cgrpp);
struct cgroup *gs_bound(const struct gs_ctr *ctr);
int gs_bind(struct gs_cmd *cmd);
struct cgroup *gs_set_binding(struct gs_ctr *ctr, struct cgroup *cgrp);
bool gs_reap(void);
void gs_reap_stop(void);

/* gs_upgrade.c */
void gs_dump(struct seq_file *m);
void gs_dump_state(struct seq_file *m);
int gs_upgrade_write(char *buf, size_t len);

int gs_proc_init(void);
void gs_proc_exit(void);
int gs_proc_add_gpu(struct gs_gpu *gpu);
int gs_proc_add_share(struct gs_share *share);
int gs_proc_set(struct gs_gpu *gpu, enum gs_setting setting, u64 val);
int gs_may_write(struct file *file);
int gs_may_read_registry(struct file *file);
int gs_proc_add_ctl(struct proc_dir_entry *root);

int gs_dev_init(void);
void gs_dev_exit(void);
int gs_copy_in(void *dst, size_t ksize, const void __user *src, u32 ver0,
	       u32 *usize);
int gs_quota_index(const struct gs_ctr *ctr, u32 gpu);

/* gs_dev_sched.c */
void gs_fh_sched_detach(struct gs_fh *fh);
long gs_sched_ioctl(struct gs_fh *fh, struct gpushare_sched __user *um);

#endif /* _GS_KMOD_H */
