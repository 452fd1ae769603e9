// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare.ko: the registry of containers that share GPUs, their quotas,
 * the /proc/gpushare control tree and /dev/gpushare.  This file holds the
 * module's state and locks, a container's lifetime, and init/exit; the
 * registry's commands are in gs_registry.c, cgroup bindings in gs_bind.c,
 * an upgrade's state dump and import in gs_upgrade.c.
 *
 * Every registered container holds one reference on the module, so the
 * module cannot be unloaded while any container is registered, except
 * after an upgrade's export has frozen the registry and handed its state
 * to the next version (gs_upgrade_write()).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cgroup.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/rcupdate.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "gs_kmod.h"

/* Protects every value; see gs_kmod.h for the locking rules. */
DEFINE_MUTEX(gs_lock);
/* The memory ledger: see gs_kmod.h. */
DEFINE_SPINLOCK(gs_mem_lock);
/* Serialises changes of structure: inst_ctl commands. */
DEFINE_MUTEX(gs_cfg_lock);
/* Lets /dev/gpushare read a container's quotas and binding without a lock. */
seqcount_mutex_t gs_seq = SEQCNT_MUTEX_ZERO(gs_seq, &gs_lock);
/* Set under gs_cfg_lock once the module is going: commands are refused. */
bool gs_dying;
struct gs_gpu *gs_gpus[GPUSHARE_MAX_GPUS];
struct gs_acct *gs_accts[GPUSHARE_MAX_GPUS];
LIST_HEAD(gs_ctrs);
u64 gs_default_mem;
/* Around an upgrade (see gs_upgrade_write()); locking in gs_kmod.h. */
enum gs_upgrade_state gs_upgrade = GS_UPGRADE_LIVE;
/* Open /dev/gpushare files, under gs_mem_lock. */
unsigned int gs_nfiles;

static bool await_import;
module_param(await_import, bool, 0444);
MODULE_PARM_DESC(await_import,
		 "start frozen, waiting for the state of the module being upgraded (/proc/gpushare/upgrade)");

struct gs_ctr *gs_find(const char *id)
{
	struct gs_ctr *ctr;

	lockdep_assert_held(&gs_lock);
	list_for_each_entry(ctr, &gs_ctrs, node)
		if (!strcmp(ctr->id, id))
			return ctr;
	return NULL;
}

static void gs_ctr_free(struct kref *ref)
{
	struct gs_ctr *ctr = container_of(ref, struct gs_ctr, ref);

	kfree_rcu(ctr, rcu);	/* a query may still be looking at it */
}

/*
 * Drop a reference on a container: the registration's (del) or an open
 * file's (its release).  The last frees it after a grace period.  Any
 * context; the ledger's bytes must be back by then (the files are gone).
 */
void gs_ctr_put(struct gs_ctr *ctr)
{
	kref_put(&ctr->ref, gs_ctr_free);
}

/*
 * Free the registry once the procfs tree and the device are gone and no
 * query can still see it.  Only an export (its state lives on in the next
 * version), a forced unload, or inst_ctl commands written while a failing
 * init ran, leave anything.  No file is open
 * (each pins the module), so each container's only reference is its
 * registration's; after a forced unload with files open nothing is safe.
 */
static void gs_free_all(void)
{
	struct gs_ctr *ctr, *tmp;
	u32 i;

	synchronize_rcu();
	list_for_each_entry_safe(ctr, tmp, &gs_ctrs, node) {
		list_del(&ctr->node);
		if (ctr->cgrp)
			cgroup_put(ctr->cgrp);
		kfree(ctr);
	}
	for (i = 0; i < GPUSHARE_MAX_GPUS; i++)
		kfree(gs_gpus[i]);
}

/*
 * Wait for the command in flight, refuse the rest (so no bind arms the
 * reaper again), stop the reaper and remove the tree.
 */
static void gs_shutdown(void)
{
	mutex_lock(&gs_cfg_lock);
	gs_dying = true;
	mutex_unlock(&gs_cfg_lock);
	gs_reap_stop();
	gs_proc_exit();
}

static int __init gs_init(void)
{
	int ret;

	if (!gs_valid_version(GPUSHARE_VERSION)) {
		pr_err("built with an invalid version \"%s\"\n", GPUSHARE_VERSION);
		return -EINVAL;
	}
	if (await_import)
		gs_upgrade = GS_UPGRADE_IMPORTING;
	ret = gs_proc_init();
	if (ret)
		return ret;
	ret = gs_dev_init();
	if (ret) {
		gs_shutdown();
		gs_free_all();
	}
	return ret;
}

static void __exit gs_exit(void)
{
	gs_dev_exit();
	gs_shutdown();
	gs_free_all();
}

module_init(gs_init);
module_exit(gs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("GPU sharing: container registry, quotas and control interface");
MODULE_VERSION(GPUSHARE_VERSION);
