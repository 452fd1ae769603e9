// SPDX-License-Identifier: GPL-2.0-only
/*
 * The registry's commands (inst_ctl): declare a GPU, add and delete a
 * container, with their places in the GPUs' compute schedules.
 *
 * Locking (see gs_kmod.h): every command runs under gs_cfg_lock, which
 * also covers the creation and removal of their procfs entries; values
 * change under gs_lock, the ledgers under gs_mem_lock inside it, and each
 * GPU's schedule under its sched_lock, innermost.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/timekeeping.h>

#include "gs_kmod.h"

/*
 * Something changed on @gpu's schedule that may let a waiting ACQUIRE in
 * (the GPU changed hands or became free, a client or a container came or
 * went, a setting changed): every waiter asks again.  Under sched_lock.
 */
void gs_sched_kick(struct gs_gpu *gpu)
{
	lockdep_assert_held(&gpu->sched_lock);
	WRITE_ONCE(gpu->sched_gen, gpu->sched_gen + 1);
	wake_up_all(&gpu->sched_wq);
}

/* A new GPU's scheduler, with the module's defaults, before its files exist. */
static void gs_sched_init_gpu(struct gs_gpu *gpu)
{
	u64 now = ktime_get_ns();

	spin_lock_init(&gpu->sched_lock);
	init_waitqueue_head(&gpu->sched_wq);
	gpu->policy = GPUSHARE_POLICY_DEFAULT;
	gpu->prio_ratio = GPUSHARE_PRIO_RATIO_DEFAULT;
	gpu->slice_us = GPUSHARE_SLICE_US_DEFAULT;
	gpu->drain_us = GPUSHARE_DRAIN_US_DEFAULT;
	gs_sched_init(&gpu->sched, now);
	gs_sched_set_policy(&gpu->sched, gpu->policy, now);
	gs_sched_set_prio_ratio(&gpu->sched, gpu->prio_ratio, now);
	gs_sched_set_max_inst(&gpu->sched, gpu->acct.max_inst, now);
	gs_sched_set_slice(&gpu->sched, gpu->slice_us * NSEC_PER_USEC, now);
	gs_sched_set_drain(&gpu->sched, (u64)gpu->drain_us * NSEC_PER_USEC, now);
}

/*
 * Put a container being registered into each of its GPUs' schedules.
 * There is room: a GPU has at most max_inst <= GS_SCHED_MAX containers,
 * and del takes each one's entity out.  Under gs_lock.
 */
static void gs_sched_add_ctr(struct gs_ctr *ctr)
{
	struct gs_gpu *gpu;
	u32 i;

	lockdep_assert_held(&gs_lock);
	for (i = 0; i < ctr->nquota; i++) {
		gpu = gs_gpus[ctr->quota[i].gpu];
		spin_lock(&gpu->sched_lock);
		WARN_ON_ONCE(gs_sched_add(&gpu->sched, &ctr->share[i].ent,
					  ctr->quota[i].weight,
					  ctr->quota[i].highprio,
					  ktime_get_ns()));
		gs_sched_kick(gpu);
		spin_unlock(&gpu->sched_lock);
	}
}

/*
 * Take a container being deleted out of each of its GPUs' schedules:
 * every open file's client first (whatever slice it is in ends, its
 * waiters wake and get ENOENT), then the entity.  Under gs_mem_lock, so
 * that no file is released (and freed) meanwhile.
 */
static void gs_sched_del_ctr(struct gs_ctr *ctr)
{
	struct gs_sched_client *c;
	struct rb_node *node;
	struct gs_gpu *gpu;
	u64 now;
	u32 i;

	lockdep_assert_held(&gs_mem_lock);
	for (i = 0; i < ctr->nquota; i++) {
		gpu = gs_gpus[ctr->quota[i].gpu];
		spin_lock(&gpu->sched_lock);
		now = ktime_get_ns();
		for (node = rb_first(&ctr->files); node; node = rb_next(node)) {
			c = &rb_entry(node, struct gs_fh, node)->sched[i];
			if (c->ent)
				gs_sched_detach(&gpu->sched, c, now);
		}
		gs_sched_del(&gpu->sched, &ctr->share[i].ent, now);
		/* Always: its own waiters must wake to get ENOENT. */
		gs_sched_kick(gpu);
		spin_unlock(&gpu->sched_lock);
	}
}

int gs_declare_gpu(const struct gs_cmd *cmd)
{
	struct gs_gpu *gpu;
	int ret = 0;

	mutex_lock(&gs_lock);
	gpu = gs_gpus[cmd->gpu];
	if (gpu) {
		spin_lock(&gs_mem_lock);	/* orphaned_mem counts */
		ret = gs_acct_set_total(&gpu->acct, cmd->total_mem);
		spin_unlock(&gs_mem_lock);
	}
	mutex_unlock(&gs_lock);
	if (gpu)
		return ret;

	gpu = kzalloc(sizeof(*gpu), GFP_KERNEL);
	if (!gpu)
		return -ENOMEM;
	gpu->index = cmd->gpu;
	gs_acct_init(&gpu->acct, cmd->total_mem);
	gs_sched_init_gpu(gpu);
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

	lockdep_assert_held(&gs_lock);
	if (gs_find(ctr->id))
		return -EEXIST;
	ret = gs_resolve_default(ctr->quota, ctr->nquota, gs_default_mem);
	if (!ret) {
		spin_lock(&gs_mem_lock);	/* orphaned_mem counts */
		ret = gs_admit(gs_accts, ctr->quota, ctr->nquota);
		spin_unlock(&gs_mem_lock);
	}
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
int gs_add_ctr(const struct gs_cmd *cmd)
{
	struct gs_ctr *ctr;
	u32 i;
	int ret;

	ctr = kzalloc(sizeof(*ctr), GFP_KERNEL);
	if (!ctr)
		return -ENOMEM;
	strscpy(ctr->id, cmd->id, sizeof(ctr->id));
	kref_init(&ctr->ref);		/* the registration's */
	ctr->files = RB_ROOT;		/* a fresh ledger, also for a re-added ID */
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
		gs_sched_add_ctr(ctr);	/* before any file can act for it */
		list_add_tail_rcu(&ctr->node, &gs_ctrs);
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

/*
 * Remove a registration.  It succeeds whatever its processes still hold:
 * their files keep the container's memory (their references) and their
 * reservations, which stay charged to each GPU as orphaned memory until
 * released; from now on they reserve nothing (ENOENT).  Their places in
 * the GPUs' schedules go at once: a slice they hold ends, and their
 * waiting ACQUIREs wake with ENOENT.
 */
int gs_del_ctr(const char *id)
{
	struct cgroup *cgrp = NULL;
	struct gs_ctr *ctr;
	u32 i;

	mutex_lock(&gs_lock);
	ctr = gs_find(id);
	if (ctr) {
		gs_uncharge(gs_accts, ctr->quota, ctr->nquota);
		spin_lock(&gs_mem_lock);
		for (i = 0; i < ctr->nquota; i++)
			gs_mem_orphan(gs_accts[ctr->quota[i].gpu],
				      &ctr->share[i].ledger);
		gs_sched_del_ctr(ctr);
		spin_unlock(&gs_mem_lock);
		list_del_rcu(&ctr->node);
		ctr->live = false;
		cgrp = gs_set_binding(ctr, NULL);
	}
	mutex_unlock(&gs_lock);
	if (!ctr)
		return -ENOENT;

	gs_remove_shares(ctr);
	if (cgrp)
		cgroup_put(cgrp);
	gs_ctr_put(ctr);	/* open files may hold it longer */
	module_put(THIS_MODULE);
	return 0;
}

/*
 * Carry out one parsed inst_ctl command (cmd->cgroup_path is modified).
 * Called under gs_cfg_lock.  Refused (EBUSY) while an upgrade has frozen
 * the registry.  Refused once the module is going: its exit
 * sets gs_dying under gs_cfg_lock before it removes the procfs tree, so
 * no command runs on (or after) that removal, even when a forced unload
 * ignored the module reference the caller holds.
 */
int gs_exec(struct gs_cmd *cmd)
{
	lockdep_assert_held(&gs_cfg_lock);
	if (gs_dying)
		return -ENODEV;
	if (gs_upgrade != GS_UPGRADE_LIVE)
		return -EBUSY;		/* upgrade in progress */
	gs_reap();
	switch (cmd->op) {
	case GS_OP_GPU:
		return gs_declare_gpu(cmd);
	case GS_OP_ADD:
		return gs_add_ctr(cmd);
	case GS_OP_DEL:
		return gs_del_ctr(cmd->id);
	case GS_OP_BIND:
		return gs_bind(cmd);
	}
	return -EINVAL;
}
