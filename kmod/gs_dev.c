// SPDX-License-Identifier: GPL-2.0-only
/*
 * /dev/gpushare: a process in a registered container may ask for its
 * quota (GPUSHARE_IOC_QUERY).  The container is the registration bound to
 * the caller's cgroup v2 or to its nearest ancestor that has one.
 *
 * An open file pins the module (a character device's operations live in
 * it), so only a caller that could get an answer may open the device:
 * CAP_SYS_ADMIN, or a process in a registered container.  Anyone else
 * gets ENOENT from open(), and so cannot keep the module from unloading.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cgroup.h>
#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/rcupdate.h>
#include <linux/uaccess.h>

#include "gs_kmod.h"

static bool gs_caller_registered(void)
{
	struct cgroup *cgrp;
	bool found;

	rcu_read_lock();
	found = gs_find_task(&cgrp);
	rcu_read_unlock();
	return found;
}

static int gs_dev_open(struct inode *inode, struct file *file)
{
	if (!file_ns_capable(file, &init_user_ns, CAP_SYS_ADMIN) &&
	    !gs_caller_registered())
		return -ENOENT;
	return nonseekable_open(inode, file);
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

	if (get_user(usize, &uq->size))
		return -EFAULT;
	if (usize < GPUSHARE_QUERY_SIZE_VER0)
		return -EINVAL;
	if (usize > PAGE_SIZE)
		return -E2BIG;
	ret = copy_struct_from_user(&q, sizeof(q), uq, usize);
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

static long gs_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	if (cmd != GPUSHARE_IOC_QUERY)
		return -ENOTTY;
	return gs_query((struct gpushare_query __user *)arg);
}

static const struct file_operations gs_fops = {
	.owner = THIS_MODULE,
	.open = gs_dev_open,
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
