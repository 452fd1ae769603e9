// SPDX-License-Identifier: GPL-2.0-only
/*
 * The /proc/gpushare tree (cGPU layout, see kmod/README.md):
 *
 *   version, default_memsize, inst_ctl
 *   <gpu>/free_weight, major, max_inst, policy, prio_ratio,
 *         total_memsize, free_memsize, nr_inst, orphaned_memsize, slice_us,
 *         drain_us, forced_ends
 *   <gpu>/<container-id>/id, memsize, weight, highprio, meminfo, cgroup,
 *         memused, gputime
 *
 * Every attribute file holds one decimal number or string.  inst_ctl is
 * 0600 and container directories 0500, so only root sees the containers.
 * Opening a file for writing needs CAP_SYS_ADMIN (checked on the opener's
 * credentials, so that a descriptor passed to a less privileged program
 * cannot be used as a confused deputy); a value out of range is refused
 * with EINVAL and one that would over-commit the GPU with ENOSPC, changing
 * nothing.  A write with a NUL byte in it is EINVAL.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>

#include "gs_kmod.h"

/*
 * One kind of attribute file; show and store run under gs_lock, store in
 * a gs_seq write section (it may change what a query reads) and under
 * gs_mem_lock (it may change a memsize, which a reservation reads), so a
 * store never sleeps.  A show that reads the ledger takes gs_mem_lock.
 * A store of a scheduling setting also hands it to the GPU's scheduler
 * (gs_sched_set()), which applies it at its next decision.
 */
struct gs_attr {
	int (*show)(struct seq_file *m, void *obj);
	int (*store)(void *obj, u64 val);	/* NULL: read-only */
};

static struct proc_dir_entry *gs_proc_root;

/* ---- top level ---- */

static int version_show(struct seq_file *m, void *obj)
{
	seq_puts(m, GPUSHARE_VERSION "\n");
	return 0;
}

static int default_memsize_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%llu\n", gs_default_mem);
	return 0;
}

static int default_memsize_store(void *obj, u64 val)
{
	gs_default_mem = val;
	return 0;
}

enum { GS_TOP_VERSION, GS_TOP_DEFAULT_MEMSIZE, GS_TOP_NFILES };

static const char *const gs_top_names[GS_TOP_NFILES] = {
	[GS_TOP_VERSION] = "version",
	[GS_TOP_DEFAULT_MEMSIZE] = "default_memsize",
};

static const struct gs_attr gs_top_attrs[GS_TOP_NFILES] = {
	[GS_TOP_VERSION] = { version_show, NULL },
	[GS_TOP_DEFAULT_MEMSIZE] = { default_memsize_show, default_memsize_store },
};

static struct gs_file gs_top_files[ARRAY_SIZE(gs_top_names)];

/*
 * A live setting for @gpu's scheduler: lock it (returns the time to act
 * at); gs_sched_set_done() wakes the waiters to ask again under the new
 * setting.
 */
static u64 gs_sched_set(struct gs_gpu *gpu)
{
	spin_lock(&gpu->sched_lock);
	return ktime_get_ns();
}

static void gs_sched_set_done(struct gs_gpu *gpu)
{
	gs_sched_kick(gpu);
	spin_unlock(&gpu->sched_lock);
}

/* ---- per GPU ---- */

static int free_weight_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", gs_acct_free_weight(&((struct gs_gpu *)obj)->acct));
	return 0;
}

static int major_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%d\n", MISC_MAJOR);
	return 0;
}

static int max_inst_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->acct.max_inst);
	return 0;
}

/* The fair share's denominator (policy 0) too. */
static int max_inst_store(void *obj, u64 val)
{
	struct gs_gpu *gpu = obj;
	int ret = gs_acct_set_max_inst(&gpu->acct, val);
	u64 now;

	if (!ret) {
		now = gs_sched_set(gpu);
		gs_sched_set_max_inst(&gpu->sched, gpu->acct.max_inst, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

static int policy_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->policy);
	return 0;
}

static int policy_store(void *obj, u64 val)
{
	struct gs_gpu *gpu = obj;
	int ret = gs_check_policy(val);
	u64 now;

	if (!ret) {
		gpu->policy = val;
		now = gs_sched_set(gpu);
		gs_sched_set_policy(&gpu->sched, val, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

static int prio_ratio_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->prio_ratio);
	return 0;
}

static int prio_ratio_store(void *obj, u64 val)
{
	struct gs_gpu *gpu = obj;
	int ret = gs_check_prio_ratio(val);
	u64 now;

	if (!ret) {
		gpu->prio_ratio = val;
		now = gs_sched_set(gpu);
		gs_sched_set_prio_ratio(&gpu->sched, val, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

static int slice_us_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->slice_us);
	return 0;
}

/* The current slice keeps its end; the next ones have the new length. */
static int slice_us_store(void *obj, u64 val)
{
	struct gs_gpu *gpu = obj;
	int ret = gs_check_slice_us(val);
	u64 now;

	if (!ret) {
		gpu->slice_us = val;
		now = gs_sched_set(gpu);
		gs_sched_set_slice(&gpu->sched, val * NSEC_PER_USEC, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

static int drain_us_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->drain_us);
	return 0;
}

/*
 * The slice in progress too: its next EXTEND is bounded by the new value
 * (a forced end already pushed past it stays).
 */
static int drain_us_store(void *obj, u64 val)
{
	struct gs_gpu *gpu = obj;
	int ret = gs_check_drain_us(val);
	u64 now;

	if (!ret) {
		gpu->drain_us = val;
		now = gs_sched_set(gpu);
		gs_sched_set_drain(&gpu->sched, val * NSEC_PER_USEC, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

/* Slices ended by force: their holder neither released nor extended. */
static int forced_ends_show(struct seq_file *m, void *obj)
{
	struct gs_gpu *gpu = obj;
	u64 n;

	spin_lock(&gpu->sched_lock);
	n = gpu->sched.forced_ends;
	spin_unlock(&gpu->sched_lock);
	seq_printf(m, "%llu\n", n);
	return 0;
}

static int total_memsize_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%llu\n", ((struct gs_gpu *)obj)->acct.total_mem);
	return 0;
}

static int free_memsize_show(struct seq_file *m, void *obj)
{
	u64 free;

	spin_lock(&gs_mem_lock);
	free = gs_acct_free_mem(&((struct gs_gpu *)obj)->acct);
	spin_unlock(&gs_mem_lock);
	seq_printf(m, "%llu\n", free);
	return 0;
}

/* Bytes still reserved by the files of deleted containers. */
static int orphaned_memsize_show(struct seq_file *m, void *obj)
{
	u64 orphaned;

	spin_lock(&gs_mem_lock);
	orphaned = ((struct gs_gpu *)obj)->acct.orphaned_mem;
	spin_unlock(&gs_mem_lock);
	seq_printf(m, "%llu\n", orphaned);
	return 0;
}

static int nr_inst_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_gpu *)obj)->acct.ninst);
	return 0;
}

/* Named by gs_gpu_files[], which no container ID may take. */
static const struct gs_attr gs_gpu_attrs[GS_GPU_NFILES] = {
	[GS_GPU_FREE_WEIGHT] = { free_weight_show, NULL },
	[GS_GPU_MAJOR] = { major_show, NULL },
	[GS_GPU_MAX_INST] = { max_inst_show, max_inst_store },
	[GS_GPU_POLICY] = { policy_show, policy_store },
	[GS_GPU_PRIO_RATIO] = { prio_ratio_show, prio_ratio_store },
	[GS_GPU_TOTAL_MEMSIZE] = { total_memsize_show, NULL },
	[GS_GPU_FREE_MEMSIZE] = { free_memsize_show, NULL },
	[GS_GPU_NR_INST] = { nr_inst_show, NULL },
	[GS_GPU_ORPHANED_MEMSIZE] = { orphaned_memsize_show, NULL },
	[GS_GPU_SLICE_US] = { slice_us_show, slice_us_store },
	[GS_GPU_DRAIN_US] = { drain_us_show, drain_us_store },
	[GS_GPU_FORCED_ENDS] = { forced_ends_show, NULL },
};

/* ---- per container and GPU ---- */

static struct gs_acct *gs_share_acct(struct gs_share *share)
{
	return gs_accts[share->quota->gpu];
}

static struct gs_gpu *gs_share_gpu(struct gs_share *share)
{
	return gs_gpus[share->quota->gpu];
}

static int id_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%s\n", ((struct gs_share *)obj)->ctr->id);
	return 0;
}

static int memsize_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%llu\n", ((struct gs_share *)obj)->quota->memsize);
	return 0;
}

/* Not below what the container's processes hold here: EBUSY. */
static int memsize_store(void *obj, u64 val)
{
	struct gs_share *share = obj;

	return gs_acct_set_memsize(gs_share_acct(share), share->quota,
				   &share->ledger, val);
}

static int weight_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_share *)obj)->quota->weight);
	return 0;
}

static int weight_store(void *obj, u64 val)
{
	struct gs_share *share = obj;
	struct gs_gpu *gpu = gs_share_gpu(share);
	int ret = gs_check_weight(val);
	u64 now;

	if (!ret)
		ret = gs_acct_change(gs_share_acct(share), share->quota,
				     share->quota->memsize, val);
	if (!ret) {
		now = gs_sched_set(gpu);
		gs_sched_set_weight(&gpu->sched, &share->ent, val, now);
		gs_sched_set_done(gpu);
	}
	return ret;
}

static int highprio_show(struct seq_file *m, void *obj)
{
	seq_printf(m, "%u\n", ((struct gs_share *)obj)->quota->highprio);
	return 0;
}

static int highprio_store(void *obj, u64 val)
{
	struct gs_share *share = obj;
	struct gs_gpu *gpu = gs_share_gpu(share);
	int ret = gs_check_highprio(val);
	u64 now;

	if (!ret) {
		share->quota->highprio = val;
		now = gs_sched_set(gpu);
		gs_sched_set_highprio(&gpu->sched, &share->ent, val, now);
		gs_sched_set_done(gpu);
	}
	return ret;
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

/* Bytes the container's processes hold on this GPU. */
static int memused_show(struct seq_file *m, void *obj)
{
	u64 used;

	spin_lock(&gs_mem_lock);
	used = ((struct gs_share *)obj)->ledger.used;
	spin_unlock(&gs_mem_lock);
	seq_printf(m, "%llu\n", used);
	return 0;
}

/* GPU time charged to the container here, ns (its slice so far too). */
static int gputime_show(struct seq_file *m, void *obj)
{
	struct gs_share *share = obj;
	struct gs_gpu *gpu = gs_share_gpu(share);
	u64 used;

	spin_lock(&gpu->sched_lock);
	used = gs_sched_used(&gpu->sched, &share->ent, ktime_get_ns());
	spin_unlock(&gpu->sched_lock);
	seq_printf(m, "%llu\n", used);
	return 0;
}

/* 0 when unbound, or when the bound cgroup has been removed. */
static int cgroup_show(struct seq_file *m, void *obj)
{
	struct cgroup *cgrp = gs_bound(((struct gs_share *)obj)->ctr);

	seq_printf(m, "%llu\n", cgrp ? cgroup_id(cgrp) : 0);
	return 0;
}

static const char *const gs_ctr_names[GS_CTR_NATTR] = {
	"id", "memsize", "weight", "highprio", "meminfo", "cgroup", "memused",
	"gputime"
};

static const struct gs_attr gs_ctr_attrs[GS_CTR_NATTR] = {
	{ id_show, NULL },
	{ memsize_show, memsize_store },
	{ weight_show, weight_store },
	{ highprio_show, highprio_store },
	{ meminfo_show, NULL },
	{ cgroup_show, NULL },
	{ memused_show, NULL },
	{ gputime_show, NULL },
};

/* ---- one set of file operations for every attribute file ---- */

static bool gs_is_ctr_attr(const struct gs_attr *attr)
{
	return attr >= gs_ctr_attrs && attr < gs_ctr_attrs + GS_CTR_NATTR;
}

/* A container's files answer ENOENT unless it is registered. */
static bool gs_file_gone(const struct gs_file *f)
{
	return gs_is_ctr_attr(f->attr) && !((struct gs_share *)f->obj)->ctr->live;
}

static int gs_attr_show(struct seq_file *m, void *v)
{
	const struct gs_file *f = m->private;
	int ret = -ENOENT;

	mutex_lock(&gs_lock);
	if (!gs_file_gone(f))
		ret = f->attr->show(m, f->obj);
	mutex_unlock(&gs_lock);
	return ret;
}

/*
 * May @file, being opened, write?  Only for CAP_SYS_ADMIN in the initial
 * user namespace, judged by the opener's credentials: whoever the
 * descriptor is later passed to writes with the opener's authority, never
 * their own, so no program can be tricked into writing for another.
 */
static int gs_may_write(struct file *file)
{
	if (!(file->f_mode & FMODE_WRITE))
		return 0;
	return file_ns_capable(file, &init_user_ns, CAP_SYS_ADMIN) ? 0 : -EPERM;
}

static int gs_attr_open(struct inode *inode, struct file *file)
{
	const struct gs_file *f = pde_data(inode);
	int ret;

	/* Root's CAP_DAC_OVERRIDE gets past the 0444 mode. */
	if ((file->f_mode & FMODE_WRITE) && !f->attr->store)
		return -EACCES;
	ret = gs_may_write(file);
	return ret ? ret : single_open(file, gs_attr_show, pde_data(inode));
}

/* Store @val through @f, under gs_lock (see struct gs_attr). */
static int gs_store(const struct gs_file *f, u64 val)
{
	int ret;

	lockdep_assert_held(&gs_lock);
	write_seqcount_begin(&gs_seq);
	spin_lock(&gs_mem_lock);
	ret = gs_file_gone(f) ? -ENOENT : f->attr->store(f->obj, val);
	spin_unlock(&gs_mem_lock);
	write_seqcount_end(&gs_seq);
	return ret;
}

/*
 * A setting, as its file's write would store it, for an import (which
 * the upgrade's freeze lets through): default_memsize (@gpu NULL) or one
 * of @gpu's.
 */
int gs_proc_set(struct gs_gpu *gpu, enum gs_setting setting, u64 val)
{
	static const enum gs_gpu_file file[GS_SET_N] = {
		[GS_SET_MAX_INST] = GS_GPU_MAX_INST,
		[GS_SET_POLICY] = GS_GPU_POLICY,
		[GS_SET_PRIO_RATIO] = GS_GPU_PRIO_RATIO,
		[GS_SET_SLICE_US] = GS_GPU_SLICE_US,
		[GS_SET_DRAIN_US] = GS_GPU_DRAIN_US,
	};
	int ret;

	mutex_lock(&gs_lock);
	if (setting == GS_SET_DEFAULT_MEMSIZE)
		ret = gs_store(&gs_top_files[GS_TOP_DEFAULT_MEMSIZE], val);
	else
		ret = gs_store(&gpu->files[file[setting]], val);
	mutex_unlock(&gs_lock);
	return ret;
}

static ssize_t gs_attr_write(struct file *file, const char __user *ubuf,
			     size_t count, loff_t *ppos)
{
	const struct gs_file *f = ((struct seq_file *)file->private_data)->private;
	char buf[32];
	u64 val;
	int ret;

	if (!count || count >= sizeof(buf))
		return -EINVAL;
	if (copy_from_user(buf, ubuf, count))
		return -EFAULT;
	buf[count] = '\0';
	if (memchr(buf, 0, count) || gs_parse_value(buf, &val))
		return -EINVAL;

	mutex_lock(&gs_lock);
	if (gs_upgrade != GS_UPGRADE_LIVE)
		ret = -EBUSY;	/* upgrade in progress */
	else
		ret = gs_store(f, val);
	mutex_unlock(&gs_lock);
	return ret ? ret : count;
}

static const struct proc_ops gs_attr_ops = {
	.proc_open = gs_attr_open,
	.proc_read = seq_read,
	.proc_write = gs_attr_write,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
};

static int gs_create_files(struct proc_dir_entry *dir,
			   const char *const *names, const struct gs_attr *attrs,
			   struct gs_file *files, unsigned int n, void *obj)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		files[i].attr = &attrs[i];
		files[i].obj = obj;
		if (!proc_create_data(names[i], attrs[i].store ? 0644 : 0444,
				      dir, &gs_attr_ops, &files[i]))
			return -ENOMEM;
	}
	return 0;
}

/* ---- inst_ctl ---- */

static int inst_ctl_show(struct seq_file *m, void *v)
{
	gs_dump(m);
	return 0;
}

static int inst_ctl_open(struct inode *inode, struct file *file)
{
	int ret = gs_may_write(file);

	return ret ? ret : single_open(file, inst_ctl_show, NULL);
}

static ssize_t inst_ctl_write(struct file *file, const char __user *ubuf,
			      size_t count, loff_t *ppos)
{
	struct gs_cmd *cmd;
	char *buf;
	int ret;

	if (!count || count > GPUSHARE_CMD_MAX)
		return -EINVAL;
	buf = memdup_user_nul(ubuf, count);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		ret = -ENOMEM;
	else if (memchr(buf, 0, count))
		ret = -EINVAL;	/* parsing would stop at the NUL */
	else
		ret = gs_parse_cmd(buf, cmd);
	/*
	 * Hold the module while the command runs, so that a plain rmmod
	 * fails (EAGAIN) rather than racing a registration.  Safety against
	 * a forced unload, which ignores this, comes from gs_dying.
	 */
	if (!ret && !try_module_get(THIS_MODULE))
		ret = -ENODEV;
	if (!ret) {
		mutex_lock(&gs_cfg_lock);
		ret = gs_exec(cmd);
		mutex_unlock(&gs_cfg_lock);
		module_put(THIS_MODULE);
	}
	kfree(cmd);
	kfree(buf);
	return ret ? ret : count;
}

static const struct proc_ops gs_inst_ctl_ops = {
	.proc_open = inst_ctl_open,
	.proc_read = seq_read,
	.proc_write = inst_ctl_write,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
};

/* ---- upgrade ---- */

static int upgrade_show(struct seq_file *m, void *v)
{
	gs_dump_state(m);
	return 0;
}

/* Root only, even to read: the whole registry is in it. */
static int upgrade_open(struct inode *inode, struct file *file)
{
	int ret = gs_may_write(file);

	if (!ret && !file_ns_capable(file, &init_user_ns, CAP_SYS_ADMIN))
		ret = -EPERM;
	return ret ? ret : single_open_size(file, upgrade_show, NULL,
					    PAGE_SIZE * 4);
}

/* "export", "abort", or a state to import, in one write: see gs_main.c. */
static ssize_t upgrade_write(struct file *file, const char __user *ubuf,
			     size_t count, loff_t *ppos)
{
	char *buf;
	int ret;

	if (!count || count > GS_STATE_MAX)
		return -EINVAL;
	buf = kvmalloc(count + 1, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	ret = copy_from_user(buf, ubuf, count) ? -EFAULT : 0;
	buf[count] = '\0';
	if (!ret && memchr(buf, 0, count))
		ret = -EINVAL;
	/* As for inst_ctl: a plain rmmod waits for no write in flight. */
	if (!ret && !try_module_get(THIS_MODULE))
		ret = -ENODEV;
	if (!ret) {
		mutex_lock(&gs_cfg_lock);
		ret = gs_upgrade_write(buf, count);
		mutex_unlock(&gs_cfg_lock);
		module_put(THIS_MODULE);
	}
	kvfree(buf);
	return ret ? ret : count;
}

static const struct proc_ops gs_upgrade_ops = {
	.proc_open = upgrade_open,
	.proc_read = seq_read,
	.proc_write = upgrade_write,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
};

/* ---- directories ---- */

int gs_proc_add_gpu(struct gs_gpu *gpu)
{
	char name[12];
	int ret;

	snprintf(name, sizeof(name), "%u", gpu->index);
	gpu->dir = proc_mkdir(name, gs_proc_root);
	if (!gpu->dir)
		return -ENOMEM;
	ret = gs_create_files(gpu->dir, gs_gpu_files, gs_gpu_attrs, gpu->files,
			      GS_GPU_NFILES, gpu);
	if (ret)
		proc_remove(gpu->dir);
	return ret;
}

int gs_proc_add_share(struct gs_share *share)
{
	int ret;

	/* Root only: no container may list or read the others' quotas. */
	share->dir = proc_mkdir_mode(share->ctr->id, 0500,
				     gs_gpus[share->quota->gpu]->dir);
	if (!share->dir)
		return -ENOMEM;
	ret = gs_create_files(share->dir, gs_ctr_names, gs_ctr_attrs,
			      share->files, GS_CTR_NATTR, share);
	if (ret) {
		proc_remove(share->dir);
		share->dir = NULL;
	}
	return ret;
}

int gs_proc_init(void)
{
	unsigned int i;
	int ret;

	/* A container directory must never shadow a GPU file. */
	for (i = 0; i < GS_GPU_NFILES; i++)
		if (WARN_ON(gs_valid_id(gs_gpu_files[i])))
			return -EINVAL;

	gs_proc_root = proc_mkdir(GS_PROC_NAME, NULL);
	if (!gs_proc_root)
		return -ENOMEM;
	ret = gs_create_files(gs_proc_root, gs_top_names, gs_top_attrs,
			      gs_top_files, ARRAY_SIZE(gs_top_names), NULL);
	if (!ret && !proc_create("inst_ctl", 0600, gs_proc_root,
				 &gs_inst_ctl_ops))
		ret = -ENOMEM;
	if (!ret && !proc_create("upgrade", 0600, gs_proc_root,
				 &gs_upgrade_ops))
		ret = -ENOMEM;
	if (ret)
		proc_remove(gs_proc_root);
	return ret;
}

void gs_proc_exit(void)
{
	proc_remove(gs_proc_root);
}
