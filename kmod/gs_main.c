// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare.ko: the registry of containers that share GPUs, their quotas,
 * the /proc/gpushare control tree and /dev/gpushare.
 *
 * Every registered container holds one reference on the module, so the
 * module cannot be unloaded while any container is registered.
 */
#include <linux/cgroup.h>
#include <linux/err.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "gs_kmod.h"

/* Protects every value; see gs_kmod.h for the locking rules. */
DEFINE_MUTEX(gs_lock);
/* Serialises changes of structure: inst_ctl commands. */
DEFINE_MUTEX(gs_cfg_lock);
struct gs_gpu *gs_gpus[GPUSHARE_MAX_GPUS];
struct gs_acct *gs_accts[GPUSHARE_MAX_GPUS];
LIST_HEAD(gs_ctrs);
u64 gs_default_mem;

struct gs_ctr *gs_find(const char *id)
{
	struct gs_ctr *ctr;

	lockdep_assert_held(&gs_lock);
	list_for_each_entry(ctr, &gs_ctrs, node)
		if (!strcmp(ctr->id, id))
			return ctr;
	return NULL;
}

struct gs_ctr *gs_find_cgroup(u64 cgroup_id)
{
	struct gs_ctr *ctr;

	lockdep_assert_held(&gs_lock);
	list_for_each_entry(ctr, &gs_ctrs, node)
		if (ctr->cgroup_id == cgroup_id)
			return ctr;
	return NULL;
}

static int gs_declare_gpu(const struct gs_cmd *cmd)
{
	struct gs_gpu *gpu;
	int ret = 0;

	mutex_lock(&gs_lock);
	gpu = gs_gpus[cmd->gpu];
	if (gpu)
		ret = gs_acct_set_total(&gpu->acct, cmd->total_mem);
	mutex_unlock(&gs_lock);
	if (gpu)
		return ret;

	gpu = kzalloc(sizeof(*gpu), GFP_KERNEL);
	if (!gpu)
		return -ENOMEM;
	gpu->index = cmd->gpu;
	gs_acct_init(&gpu->acct, cmd->total_mem);
	gpu->policy = GPUSHARE_POLICY_DEFAULT;
	gpu->prio_ratio = GPUSHARE_PRIO_RATIO_DEFAULT;
	ret = gs_proc_add_gpu(gpu);
	if (ret) {
		kfree(gpu);
		return ret;
	}
	mutex_lock(&gs_lock);
	gs_gpus[gpu->index] = gpu;
	gs_accts[gpu->index] = &gpu->acct;
	mutex_unlock(&gs_lock);
	return 0;
}

/* May @ctr be registered now?  Called under gs_lock. */
static int gs_check_add(struct gs_ctr *ctr)
{
	int ret;

	if (gs_find(ctr->id))
		return -EEXIST;
	ret = gs_resolve_default(ctr->quota, ctr->nquota, gs_default_mem);
	if (!ret)
		ret = gs_admit(gs_accts, ctr->quota, ctr->nquota);
	return ret;
}

static void gs_remove_shares(struct gs_ctr *ctr)
{
	u32 i;

	for (i = 0; i < ctr->nquota; i++)
		proc_remove(ctr->share[i].dir);
}

/*
 * Register a container on all its GPUs or on none.  Its directories are
 * created first (their files answer ENOENT until it is live), then
 * admission is checked again and the quotas charged in one step under
 * gs_lock, since per-file writes may have changed the accounting.
 */
static int gs_add(const struct gs_cmd *cmd)
{
	struct gs_ctr *ctr;
	u32 i;
	int ret;

	ctr = kzalloc(sizeof(*ctr), GFP_KERNEL);
	if (!ctr)
		return -ENOMEM;
	strscpy(ctr->id, cmd->id, sizeof(ctr->id));
	ctr->nquota = cmd->nquota;
	memcpy(ctr->quota, cmd->quota, sizeof(ctr->quota));

	mutex_lock(&gs_lock);
	ret = gs_check_add(ctr);
	mutex_unlock(&gs_lock);
	if (ret)
		goto out_free;

	for (i = 0; i < ctr->nquota; i++) {
		ctr->share[i].ctr = ctr;
		ctr->share[i].quota = &ctr->quota[i];
		ret = gs_proc_add_share(&ctr->share[i]);
		if (ret)
			goto out_remove;
	}

	mutex_lock(&gs_lock);
	ret = gs_check_add(ctr);
	if (!ret) {
		gs_charge(gs_accts, ctr->quota, ctr->nquota);
		list_add_tail(&ctr->node, &gs_ctrs);
		ctr->live = true;
		__module_get(THIS_MODULE);	/* the caller holds one too */
	}
	mutex_unlock(&gs_lock);
	if (!ret)
		return 0;
out_remove:
	gs_remove_shares(ctr);
out_free:
	kfree(ctr);
	return ret;
}

static int gs_del(const char *id)
{
	struct gs_ctr *ctr;

	mutex_lock(&gs_lock);
	ctr = gs_find(id);
	if (ctr) {
		gs_uncharge(gs_accts, ctr->quota, ctr->nquota);
		list_del(&ctr->node);
		ctr->live = false;
	}
	mutex_unlock(&gs_lock);
	if (!ctr)
		return -ENOENT;

	gs_remove_shares(ctr);
	kfree(ctr);
	module_put(THIS_MODULE);
	return 0;
}

/*
 * Bind a registration to a cgroup v2, given by id (0 unbinds) or by path
 * relative to the writer's cgroup namespace root; either must exist now
 * and must not be the cgroup2 root.
 */
static int gs_bind(const struct gs_cmd *cmd)
{
	u64 cgid = cmd->cgroup_id;
	struct gs_ctr *ctr, *other;
	int ret = 0;

	mutex_lock(&gs_lock);
	ctr = gs_find(cmd->id);
	mutex_unlock(&gs_lock);
	if (!ctr)
		return -ENOENT;	/* stays found: gs_cfg_lock is held */

	if (cmd->cgroup_path || cgid) {
		struct cgroup *cgrp = cmd->cgroup_path ?
			cgroup_get_from_path(cmd->cgroup_path) :
			cgroup_get_from_id(cgid);
		bool root;

		if (IS_ERR(cgrp))
			return -ESRCH;
		/* Every process is under the root: it is no container's. */
		root = !cgroup_parent(cgrp);
		cgid = cgroup_id(cgrp);
		cgroup_put(cgrp);
		if (root)
			return -EINVAL;
	}

	mutex_lock(&gs_lock);
	other = cgid ? gs_find_cgroup(cgid) : NULL;
	if (other && other != ctr)
		ret = -EBUSY;
	else
		ctr->cgroup_id = cgid;
	mutex_unlock(&gs_lock);
	return ret;
}

/*
 * Carry out one parsed inst_ctl command.  Called under gs_cfg_lock by a
 * caller that holds a module reference.
 */
int gs_exec(const struct gs_cmd *cmd)
{
	lockdep_assert_held(&gs_cfg_lock);
	switch (cmd->op) {
	case GS_OP_GPU:
		return gs_declare_gpu(cmd);
	case GS_OP_ADD:
		return gs_add(cmd);
	case GS_OP_DEL:
		return gs_del(cmd->id);
	case GS_OP_BIND:
		return gs_bind(cmd);
	}
	return -EINVAL;
}

/*
 * The registry (GPUs, containers, bindings) as inst_ctl commands; the
 * settings (default_memsize, max_inst, policy, prio_ratio) are not in it.
 */
void gs_dump(struct seq_file *m)
{
	struct gs_ctr *ctr;
	u32 i;

	mutex_lock(&gs_lock);
	for (i = 0; i < GPUSHARE_MAX_GPUS; i++)
		if (gs_gpus[i])
			seq_printf(m, "gpu %u %llu\n", i,
				   gs_gpus[i]->acct.total_mem);
	list_for_each_entry(ctr, &gs_ctrs, node) {
		seq_printf(m, "add %s ", ctr->id);
		for (i = 0; i < ctr->nquota; i++) {
			const struct gs_quota *q = &ctr->quota[i];

			seq_printf(m, "%s%u:%llu:%u:%u", i ? "," : "", q->gpu,
				   q->memsize, q->weight, q->highprio);
		}
		seq_putc(m, '\n');
	}
	list_for_each_entry(ctr, &gs_ctrs, node)
		if (ctr->cgroup_id)
			seq_printf(m, "bind %s %llu\n", ctr->id, ctr->cgroup_id);
	mutex_unlock(&gs_lock);
}

/*
 * Free the registry once the procfs tree is gone.  Only a forced unload,
 * or inst_ctl commands written while a failing init ran, leave anything.
 */
static void gs_free_all(void)
{
	struct gs_ctr *ctr, *tmp;
	u32 i;

	list_for_each_entry_safe(ctr, tmp, &gs_ctrs, node) {
		list_del(&ctr->node);
		kfree(ctr);
	}
	for (i = 0; i < GPUSHARE_MAX_GPUS; i++)
		kfree(gs_gpus[i]);
}

static int __init gs_init(void)
{
	int ret;

	ret = gs_proc_init();
	if (ret)
		return ret;
	ret = gs_dev_init();
	if (ret) {
		gs_proc_exit();
		gs_free_all();
		return ret;
	}
	pr_info("gpushare %s loaded\n", GPUSHARE_VERSION);
	return 0;
}

static void __exit gs_exit(void)
{
	gs_dev_exit();
	gs_proc_exit();
	gs_free_all();
}

module_init(gs_init);
module_exit(gs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("GPU sharing: container registry, quotas and control interface");
MODULE_VERSION(GPUSHARE_VERSION);
