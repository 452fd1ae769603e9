// SPDX-License-Identifier: GPL-2.0-only
/*
 * /dev/gpushare: a process in a registered container may ask for its
 * quota (GPUSHARE_IOC_QUERY), reserve and release memory against it
 * (GPUSHARE_IOC_MEM) and ask its GPUs' compute schedulers for time
 * (GPUSHARE_IOC_SCHED).  The container is the registration bound to the
 * caller's cgroup v2 or to its nearest ancestor that has one: for QUERY
 * the caller's now, for MEM and SCHED the opener's when it opened the
 * file, whose reservations and places in the schedules the file holds
 * until it is released.
 *
 * An open file pins the module (a character device's operations live in
 * it), so only a caller that could get an answer may open the device:
 * CAP_SYS_ADMIN, or a process in a registered container.  Anyone else
 * gets ENOENT from open(), and so cannot keep the module from unloading.
 *
 * This file opens and releases the device and answers QUERY and MEM;
 * SCHED is in gs_dev_sched.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cgroup.h>
#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "gs_kmod.h"

/* Deleted: del orphans every ledger of a container at once. */
static bool gs_ctr_orphaned(const struct gs_ctr *ctr)
{
	lockdep_assert_held(&gs_mem_lock);
	return ctr->share[0].ledger.orphaned;
}

/* ctr->files' order: by opener (any total order groups each one's files). */
static bool gs_fh_less(struct rb_node *a, const struct rb_node *b)
{
	return (unsigned long)rb_entry(a, struct gs_fh, node)->pid <
	       (unsigned long)rb_entry(b, struct gs_fh, node)->pid;
}

/*
 * Count an open file unless an upgrade froze the module: an open file's
 * ledger and places in the schedules could not move to the next
 * version, so an export needs none open and none opens after it.  The
 * count and the check share gs_mem_lock with the export's, so an open
 * racing an export either counts (the export is refused) or is refused.
 */
static int gs_count_file(void)
{
	lockdep_assert_held(&gs_mem_lock);
	if (gs_upgrade != GS_UPGRADE_LIVE)
		return -EBUSY;
	gs_nfiles++;
	return 0;
}

/*
 * Open @fh: tie it to the caller's registration, if it has one, and add
 * it to the container's files, next to those of the same opener.  A
 * container deleted meanwhile is none: either del finds the file listed
 * (and its bytes, none yet, orphaned) or the file finds the container
 * orphaned.  Without a container only root opens (ENOENT).
 *
 * A refused open is never counted, not even for the moment the refusal
 * takes, so that no user can hold upgrades off by opening the device
 * (0666) in a loop; and, as before, a container's open asks for no
 * capability (a denied one may be audited).
 */
static int gs_fh_open(struct gs_fh *fh, struct file *file)
{
	struct gs_ctr *ctr;
	struct cgroup *cgrp;
	int ret = -ENOENT;

	rcu_read_lock();
	ctr = gs_find_task(&cgrp);
	if (ctr && !kref_get_unless_zero(&ctr->ref))
		ctr = NULL;
	rcu_read_unlock();

	spin_lock(&gs_mem_lock);
	if (ctr && !gs_ctr_orphaned(ctr)) {
		ret = gs_count_file();
		if (!ret) {
			rb_add(&fh->node, &ctr->files, gs_fh_less);
			fh->ctr = ctr;
		}
	}
	spin_unlock(&gs_mem_lock);
	if (ctr && !fh->ctr)
		gs_ctr_put(ctr);
	if (ret != -ENOENT ||
	    !file_ns_capable(file, &init_user_ns, CAP_SYS_ADMIN))
		return ret;

	spin_lock(&gs_mem_lock);
	ret = gs_count_file();
	spin_unlock(&gs_mem_lock);
	return ret;
}

/* A file closed: one fewer for an upgrade's export to wait for. */
static void gs_uncount_file(void)
{
	spin_lock(&gs_mem_lock);
	gs_nfiles--;
	spin_unlock(&gs_mem_lock);
}

static int gs_dev_open(struct inode *inode, struct file *file)
{
	struct gs_fh *fh;
	int ret;

	/* Charged to the opener's memory cgroup, like its other files. */
	fh = kzalloc(sizeof(*fh), GFP_KERNEL_ACCOUNT);
	if (!fh)
		return -ENOMEM;
	fh->pid = get_task_pid(current, PIDTYPE_TGID);
	ret = gs_fh_open(fh, file);
	if (ret) {
		put_pid(fh->pid);
		kfree(fh);
		return ret;
	}
	file->private_data = fh;	/* was the miscdevice */
	return nonseekable_open(inode, file);
}

/*
 * The last close of the file (exit, SIGKILL and crashes too): everything
 * it holds goes back to its container's ledger, or to the GPU if the
 * container was deleted, and it leaves the GPUs' schedules.  Runs in
 * process context, never concurrently with an ioctl on the same file.
 */
static int gs_dev_release(struct inode *inode, struct file *file)
{
	struct gs_fh *fh = file->private_data;
	struct gs_ctr *ctr = fh->ctr;
	u32 i;

	if (ctr) {
		spin_lock(&gs_mem_lock);
		gs_fh_sched_detach(fh);
		for (i = 0; i < ctr->nquota; i++)
			WARN_ON_ONCE(gs_mem_release(gs_accts[ctr->quota[i].gpu],
						    &ctr->share[i].ledger,
						    &fh->mine[i], fh->mine[i]));
		rb_erase(&fh->node, &ctr->files);
		spin_unlock(&gs_mem_lock);
		gs_ctr_put(ctr);
	}
	put_pid(fh->pid);
	kfree(fh);
	gs_uncount_file();
	return 0;
}

/*
 * The caller's registration into @q (count, cgroup_id, id) and @quotas,
 * as one consistent state: no lock, so a query neither waits for nor
 * delays a command.  -ENOENT when the caller's cgroups have none.
 */
static int gs_snapshot(struct gpushare_query *q, struct gpushare_quota *quotas)
{
	const struct gs_ctr *ctr;
	struct cgroup *cgrp;
	unsigned int seq;
	u32 i;

	do {
		seq = read_seqcount_begin(&gs_seq);
		rcu_read_lock();
		ctr = gs_find_task(&cgrp);
		if (ctr) {
			q->count = ctr->nquota;
			q->cgroup_id = cgroup_id(cgrp);
			memcpy(q->id, ctr->id, sizeof(ctr->id));
			for (i = 0; i < ctr->nquota; i++) {
				quotas[i].memsize = ctr->quota[i].memsize;
				quotas[i].gpu = ctr->quota[i].gpu;
				quotas[i].weight = ctr->quota[i].weight;
				quotas[i].highprio = ctr->quota[i].highprio;
			}
		}
		rcu_read_unlock();
	} while (read_seqcount_retry(&gs_seq, seq));
	return ctr ? 0 : -ENOENT;
}

/* Entry @i of the user's quota array: ours, then zeros up to its size. */
static int gs_put_quota(const struct gpushare_query *q, u32 i,
			const struct gpushare_quota *quota)
{
	void __user *dst = u64_to_user_ptr(q->quotas + (u64)i * q->quota_size);
	size_t ours = min_t(size_t, q->quota_size, sizeof(*quota));

	if (copy_to_user(dst, quota, ours))
		return -EFAULT;
	if (q->quota_size > ours && clear_user(dst + ours, q->quota_size - ours))
		return -EFAULT;
	return 0;
}

/*
 * Copy in an extensible structure (QUERY's, MEM's, SCHED's) whose first member is
 * its size, *@usize: from @ver0 bytes to a page, a bigger one's tail zero.
 */
int gs_copy_in(void *dst, size_t ksize, const void __user *src, u32 ver0,
	       u32 *usize)
{
	if (get_user(*usize, (const u32 __user *)src))
		return -EFAULT;
	if (*usize < ver0)
		return -EINVAL;
	if (*usize > PAGE_SIZE)
		return -E2BIG;
	return copy_struct_from_user(dst, ksize, src, *usize);
}

/*
 * GPUSHARE_IOC_QUERY with extensible structures (see the uapi header):
 * @uq->size says how much of struct gpushare_query user space has, and
 * quota_size the same of each quota.
 */
static long gs_query(struct gpushare_query __user *uq)
{
	struct gpushare_quota quotas[GPUSHARE_MAX_GPUS] = {};
	struct gpushare_query q;
	u32 usize, i;
	int ret;

	ret = gs_copy_in(&q, sizeof(q), uq, GPUSHARE_QUERY_SIZE_VER0, &usize);
	if (ret)
		return ret;
	if (!q.abi_version || q.flags ||
	    q.quota_size < GPUSHARE_QUOTA_SIZE_VER0 || q.quota_size > PAGE_SIZE)
		return -EINVAL;

	memset(q.id, 0, sizeof(q.id));
	ret = gs_snapshot(&q, quotas);
	if (ret)
		return ret;
	q.abi_version = GPUSHARE_ABI_VERSION;
	for (i = 0; i < q.count && i < q.quota_cap; i++) {
		ret = gs_put_quota(&q, i, &quotas[i]);
		if (ret)
			return ret;
	}
	/* A bigger struct's tail is zero already (copy_struct_from_user). */
	if (copy_to_user(uq, &q, min_t(size_t, usize, sizeof(q))))
		return -EFAULT;
	return q.count > q.quota_cap ? -EOVERFLOW : 0;
}

/*
 * The index of @ctr's quota on GPU @gpu (its share there): -ENOENT when
 * the file acts for no container, -ENXIO when it has no quota there.  A
 * container's quotas' GPUs are fixed.
 */
int gs_quota_index(const struct gs_ctr *ctr, u32 gpu)
{
	u32 i;

	if (!ctr)
		return -ENOENT;
	for (i = 0; i < ctr->nquota && ctr->quota[i].gpu != gpu; i++)
		;
	return i == ctr->nquota ? -ENXIO : i;
}

/*
 * One ledger operation of @fh on m->gpu, answered in @m (quota, used,
 * mine) when the file acts for a container with a quota there: *@filled.
 */
static int gs_mem_op(struct gs_fh *fh, struct gpushare_mem *m, bool *filled)
{
	struct gs_ctr *ctr = fh->ctr;	/* and its quotas' GPUs: fixed */
	struct gs_share *share;
	int ret;
	u32 i;

	ret = gs_quota_index(ctr, m->gpu);
	if (ret < 0)
		return ret;
	i = ret;
	share = &ctr->share[i];

	spin_lock(&gs_mem_lock);
	switch (m->op) {
	case GPUSHARE_MEM_RESERVE:
		ret = gs_mem_reserve(share->quota, &share->ledger, &fh->mine[i],
				     m->bytes);
		break;
	case GPUSHARE_MEM_RELEASE:
		ret = gs_mem_release(gs_accts[m->gpu], &share->ledger,
				     &fh->mine[i], m->bytes);
		break;
	default:
		ret = gs_ctr_orphaned(ctr) ? -ENOENT : 0;
		break;
	}
	m->quota = gs_mem_quota(share->quota, &share->ledger);
	m->used = share->ledger.used;
	m->mine = fh->mine[i];
	spin_unlock(&gs_mem_lock);
	*filled = true;
	return ret;
}

/*
 * GPUSHARE_IOC_MEM with an extensible structure, as QUERY's (see the uapi
 * header).  The structure is known writable before anything changes, so
 * EFAULT changes nothing (short of user space unmapping it meanwhile).
 */
static long gs_mem(struct gs_fh *fh, struct gpushare_mem __user *um)
{
	struct gpushare_mem m;
	bool filled = false;
	size_t out;
	u32 usize;
	int ret;

	ret = gs_copy_in(&m, sizeof(m), um, GPUSHARE_MEM_SIZE_VER0, &usize);
	if (ret)
		return ret;
	if (m.flags || m.op > GPUSHARE_MEM_RELEASE)
		return -EINVAL;
	/* A bigger struct's tail is zero already (copy_struct_from_user). */
	out = min_t(size_t, usize, sizeof(m));
	if (copy_to_user(um, &m, out))
		return -EFAULT;

	ret = gs_mem_op(fh, &m, &filled);
	if (filled && copy_to_user(um, &m, out))
		return -EFAULT;
	return ret;
}

static long gs_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	switch (cmd) {
	case GPUSHARE_IOC_QUERY:
		return gs_query((struct gpushare_query __user *)arg);
	case GPUSHARE_IOC_MEM:
		return gs_mem(file->private_data,
			      (struct gpushare_mem __user *)arg);
	case GPUSHARE_IOC_SCHED:
		return gs_sched_ioctl(file->private_data,
				      (struct gpushare_sched __user *)arg);
	}
	return -ENOTTY;
}

static const struct file_operations gs_fops = {
	.owner = THIS_MODULE,
	.open = gs_dev_open,
	.release = gs_dev_release,
	.unlocked_ioctl = gs_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice gs_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = GPUSHARE_DEV_NAME,
	.fops = &gs_fops,
	.mode = 0666,
};

int gs_dev_init(void)
{
	return misc_register(&gs_misc);
}

void gs_dev_exit(void)
{
	misc_deregister(&gs_misc);
}
