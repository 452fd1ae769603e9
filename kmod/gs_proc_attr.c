// SPDX-License-Identifier: GPL-2.0-only
/*
 * The /proc/gpushare tree's directories and attribute files: one set of
 * file operations, one show and one store for every attribute, driven by
 * its descriptor (struct gs_attr, tables in gs_proc.c).
 *
 * Locking (see gs_kmod.h): show and store run under gs_lock; a store also
 * in a gs_seq write section and under gs_mem_lock (gs_store()), and a
 * scheduling setting is handed to the GPU's scheduler under its
 * sched_lock, innermost (gs_knob_set()).  procfs entries are created and
 * removed under gs_cfg_lock, never under gs_lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>

#include "gs_proc.h"

static struct proc_dir_entry *gs_proc_root;
static struct gs_file gs_top_files[GS_TOP_NFILES];

/* ---- one show and one store for every attribute file ---- */

static bool gs_is_ctr_attr(const struct gs_attr *attr)
{
	return attr >= gs_ctr_attrs && attr < gs_ctr_attrs + GS_CTR_NATTR;
}

static bool gs_attr_writable(const struct gs_attr *attr)
{
	return attr->check || attr->set;
}

/* The GPU of a GPU's or a container's file. */
static struct gs_gpu *gs_file_gpu(const struct gs_file *f)
{
	return gs_is_ctr_attr(f->attr) ? gs_share_gpu(f->obj) : f->obj;
}

/* A container's files answer ENOENT unless it is registered. */
static bool gs_file_gone(const struct gs_file *f)
{
	return gs_is_ctr_attr(f->attr) && !((struct gs_share *)f->obj)->ctr->live;
}

/* The field @f's attribute shows and stores. */
static void *gs_field(const struct gs_file *f)
{
	void *base = f->obj;

	if (f->attr->in_quota)
		base = ((struct gs_share *)base)->quota;
	return (char *)base + f->attr->off;
}

static u64 gs_get(const struct gs_file *f)
{
	if (f->attr->get)
		return f->attr->get(f->obj);
	if (f->attr->size == sizeof(u32))
		return *(u32 *)gs_field(f);
	return *(u64 *)gs_field(f);
}

static void gs_put(const struct gs_file *f, u64 val)
{
	if (f->attr->size == sizeof(u32))
		*(u32 *)gs_field(f) = val;
	else
		*(u64 *)gs_field(f) = val;
}

static int gs_show_number(struct seq_file *m, const struct gs_file *f)
{
	spinlock_t *lock = NULL;
	u64 val;

	if (f->attr->lock == GS_LK_MEM)
		lock = &gs_mem_lock;
	else if (f->attr->lock == GS_LK_SCHED)
		lock = &gs_file_gpu(f)->sched_lock;
	if (lock)
		spin_lock(lock);
	val = gs_get(f);
	if (lock)
		spin_unlock(lock);
	seq_printf(m, "%llu\n", val);
	return 0;
}

static int gs_attr_show(struct seq_file *m, void *v)
{
	const struct gs_file *f = m->private;
	int ret = -ENOENT;

	mutex_lock(&gs_lock);
	if (!gs_file_gone(f))
		ret = f->attr->show ? f->attr->show(m, f->obj) :
				      gs_show_number(m, f);
	mutex_unlock(&gs_lock);
	return ret;
}

/*
 * Hand a stored setting to the scheduler of @f's GPU: it applies it at
 * its next decision, and its waiters ask again under the new setting.
 */
static void gs_knob_set(const struct gs_file *f, u64 val)
{
	struct gs_gpu *gpu = gs_file_gpu(f);
	struct gs_sched *s = &gpu->sched;
	struct gs_share *share = f->obj;
	u64 now;

	spin_lock(&gpu->sched_lock);
	now = ktime_get_ns();
	switch (f->attr->knob) {
	case GS_KNOB_MAX_INST:
		gs_sched_set_max_inst(s, gpu->acct.max_inst, now);
		break;
	case GS_KNOB_POLICY:
		gs_sched_set_policy(s, val, now);
		break;
	case GS_KNOB_PRIO_RATIO:
		gs_sched_set_prio_ratio(s, val, now);
		break;
	case GS_KNOB_SLICE:
		gs_sched_set_slice(s, val * NSEC_PER_USEC, now);
		break;
	case GS_KNOB_DRAIN:
		gs_sched_set_drain(s, val * NSEC_PER_USEC, now);
		break;
	case GS_KNOB_WEIGHT:
		gs_sched_set_weight(s, &share->ent, val, now);
		break;
	case GS_KNOB_HIGHPRIO:
		gs_sched_set_highprio(s, &share->ent, val, now);
		break;
	}
	gs_sched_kick(gpu);
	spin_unlock(&gpu->sched_lock);
}

/* Store @val through @f, under gs_lock (see struct gs_attr). */
static int gs_store(const struct gs_file *f, u64 val)
{
	const struct gs_attr *a = f->attr;
	int ret;

	lockdep_assert_held(&gs_lock);
	write_seqcount_begin(&gs_seq);
	spin_lock(&gs_mem_lock);
	ret = gs_file_gone(f) ? -ENOENT : 0;
	if (!ret && a->check)
		ret = a->check(val);
	if (!ret && a->set)
		ret = a->set(f->obj, val);
	else if (!ret)
		gs_put(f, val);
	if (!ret && a->knob)
		gs_knob_set(f, val);
	spin_unlock(&gs_mem_lock);
	write_seqcount_end(&gs_seq);
	return ret;
}

/*
 * May @file, being opened, write?  Only for CAP_SYS_ADMIN in the initial
 * user namespace, judged by the opener's credentials: whoever the
 * descriptor is later passed to writes with the opener's authority, never
 * their own, so no program can be tricked into writing for another.
 */
int gs_may_write(struct file *file)
{
	if (!(file->f_mode & FMODE_WRITE))
		return 0;
	return gs_may_read_registry(file);
}

/*
 * May @file, being opened, read the registry (inst_ctl, upgrade, a
 * container's files)?  What writing needs: CAP_SYS_ADMIN in the initial
 * user namespace, by the opener's credentials.  The modes (0600, 0500)
 * keep other users out; this keeps out root without the capability too,
 * as in a container (uid 0 with CAP_DAC_OVERRIDE), which would otherwise
 * read every container's ID and quotas.
 */
int gs_may_read_registry(struct file *file)
{
	return file_ns_capable(file, &init_user_ns, CAP_SYS_ADMIN) ? 0 : -EPERM;
}

static int gs_attr_open(struct inode *inode, struct file *file)
{
	const struct gs_file *f = pde_data(inode);
	int ret;

	/* Root's CAP_DAC_OVERRIDE gets past the 0444 mode. */
	if ((file->f_mode & FMODE_WRITE) && !gs_attr_writable(f->attr))
		return -EACCES;
	/* A container's files are the registry: read as it is written. */
	if (gs_is_ctr_attr(f->attr))
		ret = gs_may_read_registry(file);
	else
		ret = gs_may_write(file);
	return ret ? ret : single_open(file, gs_attr_show, pde_data(inode));
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
	umode_t mode;

	for (i = 0; i < n; i++) {
		files[i].attr = &attrs[i];
		files[i].obj = obj;
		mode = gs_attr_writable(&attrs[i]) ? 0644 : 0444;
		if (!proc_create_data(names[i], mode, dir, &gs_attr_ops,
				      &files[i]))
			return -ENOMEM;
	}
	return 0;
}

/* ---- directories ---- */

int gs_proc_add_gpu(struct gs_gpu *gpu)
{
	char name[12];
	int ret;

	/*
	 * 0711: anyone opens the GPU's files by name, only root lists the
	 * directory, whose entries include the containers' IDs.
	 */
	snprintf(name, sizeof(name), "%u", gpu->index);
	gpu->dir = proc_mkdir_mode(name, 0711, gs_proc_root);
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

	/*
	 * Root only, and its files need CAP_SYS_ADMIN even to read (see
	 * gs_may_read_registry()): no container reads the others' quotas.
	 */
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
			      gs_top_files, GS_TOP_NFILES, NULL);
	if (!ret)
		ret = gs_proc_add_ctl(gs_proc_root);
	if (ret)
		proc_remove(gs_proc_root);
	return ret;
}

void gs_proc_exit(void)
{
	proc_remove(gs_proc_root);
}
