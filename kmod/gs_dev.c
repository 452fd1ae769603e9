// SPDX-License-Identifier: GPL-2.0-only
/*
 * /dev/gpushare: any process may ask for the quota of the container it
 * runs in (GPUSHARE_IOC_QUERY).  The container is the registration bound
 * to the caller's cgroup v2 or to its nearest ancestor that has one.
 */
#include <linux/cgroup.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/rcupdate.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "gs_kmod.h"

static int gs_query(struct gpushare_query *q)
{
	struct gs_ctr *ctr = NULL;
	struct cgroup *cgrp;
	u32 i;

	mutex_lock(&gs_lock);
	rcu_read_lock();
	for (cgrp = task_dfl_cgroup(current); cgrp && !ctr;
	     cgrp = cgroup_parent(cgrp))
		ctr = gs_find_cgroup(cgroup_id(cgrp));
	rcu_read_unlock();
	if (ctr) {
		q->abi_version = GPUSHARE_ABI_VERSION;
		q->count = ctr->nquota;
		q->cgroup_id = ctr->cgroup_id;
		strscpy(q->id, ctr->id, sizeof(q->id));
		for (i = 0; i < ctr->nquota; i++) {
			q->quotas[i].memsize = ctr->quota[i].memsize;
			q->quotas[i].gpu = ctr->quota[i].gpu;
			q->quotas[i].weight = ctr->quota[i].weight;
			q->quotas[i].highprio = ctr->quota[i].highprio;
		}
	}
	mutex_unlock(&gs_lock);
	return ctr ? 0 : -ENOENT;
}

static long gs_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct gpushare_query *q;
	int ret;

	if (cmd != GPUSHARE_IOC_QUERY)
		return -ENOTTY;
	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!q)
		return -ENOMEM;
	ret = gs_query(q);
	if (!ret && copy_to_user((void __user *)arg, q, sizeof(*q)))
		ret = -EFAULT;
	kfree(q);
	return ret;
}

static const struct file_operations gs_fops = {
	.owner = THIS_MODULE,
	.open = nonseekable_open,
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
