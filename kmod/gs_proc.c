// SPDX-License-Identifier: GPL-2.0-only
/*
 * The /proc/gpushare tree (cGPU layout, see kmod/README.md):
 *
 *   version, default_memsize, inst_ctl, upgrade
 *   <gpu>/free_weight, major, max_inst, policy, prio_ratio,
 *         total_memsize, free_memsize, nr_inst, orphaned_memsize, slice_us,
 *         drain_us, forced_ends
 *   <gpu>/<container-id>/id, memsize, weight, highprio, meminfo, cgroup,
 *         memused, gputime
 *
 * Every attribute file holds one decimal number or string.  inst_ctl is
 * 0600, GPU directories 0711 and container directories 0500, so only root
 * lists or reads the containers; opening a file for writing, and the
 * registry's (inst_ctl, upgrade, a container's files) even for reading,
 * needs CAP_SYS_ADMIN too, which root in a container lacks (checked on
 * the opener's credentials, so that a descriptor passed to a less
 * privileged program cannot be used as a confused deputy).  The GPUs'
 * files name no container and stay world-readable.  A value out of range
 * is refused with EINVAL and one that would over-commit the GPU with
 * ENOSPC, changing nothing.  A write with a NUL byte in it is EINVAL.
 *
 * This file describes the attribute files, in tables (struct gs_attr in
 * gs_proc.h) that one show and one store serve (gs_proc_attr.c); inst_ctl
 * and upgrade are in gs_proc_ctl.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/miscdevice.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>
#include <linux/sched.h>
#include <linux/stddef.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>

#include "gs_proc.h"

/* A number field of an attribute's object: where it is, its size. */
#define GS_U32(type, member)	.off = offsetof(type, member), .size = 4
#define GS_U64(type, member)	.off = offsetof(type, member), .size = 8
#define GS_QUOTA_U32(member)	GS_U32(struct gs_quota, member), .in_quota = true
#define GS_QUOTA_U64(member)	GS_U64(struct gs_quota, member), .in_quota = true

/* ---- top level ---- */

static int version_show(struct seq_file *m, void *obj)
{
	seq_puts(m, GPUSHARE_VERSION "\n");
	return 0;
}

static u64 default_memsize_get(void *obj)
{
	return gs_default_mem;
}

static int default_memsize_set(void *obj, u64 val)
{
	gs_default_mem = val;
	return 0;
}

const char *const gs_top_names[GS_TOP_NFILES] = {
	[GS_TOP_VERSION] = "version",
	[GS_TOP_DEFAULT_MEMSIZE] = "default_memsize",
};

const struct gs_attr gs_top_attrs[GS_TOP_NFILES] = {
	[GS_TOP_VERSION] = { .show = version_show },
	[GS_TOP_DEFAULT_MEMSIZE] = { .get = default_memsize_get,
				     .set = default_memsize_set },
};

/* ---- per GPU ---- */

static u64 free_weight_get(void *obj)
{
	return gs_acct_free_weight(&((struct gs_gpu *)obj)->acct);
}

static u64 major_get(void *obj)
{
	return MISC_MAJOR;
}

static int max_inst_set(void *obj, u64 val)
{
	return gs_acct_set_max_inst(&((struct gs_gpu *)obj)->acct, val);
}

static u64 free_memsize_get(void *obj)
{
	return gs_acct_free_mem(&((struct gs_gpu *)obj)->acct);
}

/*
 * Named by gs_gpu_files[], which no container ID may take.  slice_us: the
 * current slice keeps its end, the next ones have the new length.
 * drain_us: the slice in progress too, its next EXTEND is bounded by the
 * new value (a forced end already pushed past it stays).  forced_ends:
 * slices ended by force, their holder neither released nor extended.
 * orphaned_memsize: bytes still reserved by the files of deleted
 * containers.
 */
const struct gs_attr gs_gpu_attrs[GS_GPU_NFILES] = {
	[GS_GPU_FREE_WEIGHT] = { .get = free_weight_get },
	[GS_GPU_MAJOR] = { .get = major_get },
	[GS_GPU_MAX_INST] = { GS_U32(struct gs_gpu, acct.max_inst),
			      .set = max_inst_set, .knob = GS_KNOB_MAX_INST },
	[GS_GPU_POLICY] = { GS_U32(struct gs_gpu, policy),
			    .check = gs_check_policy, .knob = GS_KNOB_POLICY },
	[GS_GPU_PRIO_RATIO] = { GS_U32(struct gs_gpu, prio_ratio),
				.check = gs_check_prio_ratio,
				.knob = GS_KNOB_PRIO_RATIO },
	[GS_GPU_TOTAL_MEMSIZE] = { GS_U64(struct gs_gpu, acct.total_mem) },
	[GS_GPU_FREE_MEMSIZE] = { .get = free_memsize_get, .lock = GS_LK_MEM },
	[GS_GPU_NR_INST] = { GS_U32(struct gs_gpu, acct.ninst) },
	[GS_GPU_ORPHANED_MEMSIZE] = { GS_U64(struct gs_gpu, acct.orphaned_mem),
				      .lock = GS_LK_MEM },
	[GS_GPU_SLICE_US] = { GS_U32(struct gs_gpu, slice_us),
			      .check = gs_check_slice_us,
			      .knob = GS_KNOB_SLICE },
	[GS_GPU_DRAIN_US] = { GS_U32(struct gs_gpu, drain_us),
			      .check = gs_check_drain_us,
			      .knob = GS_KNOB_DRAIN },
	[GS_GPU_FORCED_ENDS] = { GS_U64(struct gs_gpu, sched.forced_ends),
				 .lock = GS_LK_SCHED },
};

/* ---- per container and GPU ---- */

static struct gs_acct *gs_share_acct(struct gs_share *share)
{
	return gs_accts[share->quota->gpu];
}

static int id_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%s\n", ((struct gs_share *)obj)->ctr->id);
	return 0;
}

/* Not below what the container's processes hold here: EBUSY. */
static int memsize_set(void *obj, u64 val)
{
	struct gs_share *share = obj;

	return gs_acct_set_memsize(gs_share_acct(share), share->quota,
				   &share->ledger, val);
}

static int weight_set(void *obj, u64 val)
{
	struct gs_share *share = obj;

	return gs_acct_change(gs_share_acct(share), share->quota,
			      share->quota->memsize, val);
}

/*
 * One meminfo line: a process that holds @bytes, if it still runs (its
 * number could otherwise name another) and the reader's pid namespace
 * sees it.
 */
static void gs_show_pid(struct seq_file *m, struct pid *pid, u64 bytes,
			struct pid_namespace *ns)
{
	pid_t nr;

	if (!bytes || !pid_has_task(pid, PIDTYPE_TGID))
		return;
	nr = pid_nr_ns(pid, ns);
	if (nr)
		seq_printf(m, "PID: %d Mem: %llu\n", nr, bytes);
}

/*
 * cGPU format: free bytes (memsize minus what is reserved), then one
 * "PID: <pid> Mem: <bytes>" per process that holds bytes on this GPU: the
 * files it opened, added up (ctr->files is ordered by opener).
 */
static int meminfo_show(struct seq_file *m, void *obj)
{
	struct pid_namespace *ns = task_active_pid_ns(current);
	struct gs_share *share = obj;
	struct gs_ctr *ctr = share->ctr;
	u32 i = share - ctr->share;
	struct rb_node *node, *next;
	struct gs_fh *fh;
	u64 sum = 0;

	spin_lock(&gs_mem_lock);
	seq_printf(m, "Free: %llu\n", share->quota->memsize - share->ledger.used);
	for (node = rb_first(&ctr->files); node; node = next) {
		fh = rb_entry(node, struct gs_fh, node);
		sum += fh->mine[i];
		next = rb_next(node);
		if (!next || rb_entry(next, struct gs_fh, node)->pid != fh->pid) {
			gs_show_pid(m, fh->pid, sum, ns);
			sum = 0;
		}
	}
	spin_unlock(&gs_mem_lock);
	return 0;
}

/* GPU time charged to the container here, ns (its slice so far too). */
static u64 gputime_get(void *obj)
{
	struct gs_share *share = obj;

	return gs_sched_used(&gs_share_gpu(share)->sched, &share->ent,
			     ktime_get_ns());
}

/* 0 when unbound, or when the bound cgroup has been removed. */
static u64 cgroup_id_get(void *obj)
{
	struct cgroup *cgrp = gs_bound(((struct gs_share *)obj)->ctr);

	return cgrp ? cgroup_id(cgrp) : 0;
}

const char *const gs_ctr_names[GS_CTR_NATTR] = {
	"id", "memsize", "weight", "highprio", "meminfo", "cgroup", "memused",
	"gputime"
};

/* memused: bytes the container's processes hold on this GPU. */
const struct gs_attr gs_ctr_attrs[GS_CTR_NATTR] = {
	{ .show = id_show },
	{ GS_QUOTA_U64(memsize), .set = memsize_set },
	{ GS_QUOTA_U32(weight), .check = gs_check_weight, .set = weight_set,
	  .knob = GS_KNOB_WEIGHT },
	{ GS_QUOTA_U32(highprio), .check = gs_check_highprio,
	  .knob = GS_KNOB_HIGHPRIO },
	{ .show = meminfo_show },
	{ .get = cgroup_id_get },
	{ GS_U64(struct gs_share, ledger.used), .lock = GS_LK_MEM },
	{ .get = gputime_get, .lock = GS_LK_SCHED },
};
