// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare.ko: the registry of containers that share GPUs, their quotas,
 * the /proc/gpushare control tree and /dev/gpushare.
 *
 * Every registered container holds one reference on the module, so the
 * module cannot be unloaded while any container is registered, except
 * after an upgrade's export has frozen the registry and handed its state
 * to the next version (gs_upgrade_write()).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cgroup.h>
#include <linux/cred.h>
#include <linux/err.h>
#include <linux/kernfs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/nsproxy.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/timekeeping.h>
#include <linux/workqueue.h>

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
 * The cgroup @ctr is bound to, or NULL when it is unbound or that cgroup
 * has been removed (rmdir marks it dying before it returns).  Under
 * gs_lock, or under RCU: a cgroup is freed a grace period after its last
 * reference goes.
 */
struct cgroup *gs_bound(const struct gs_ctr *ctr)
{
	struct cgroup *cgrp = READ_ONCE(ctr->cgrp);

	return cgrp && !css_is_dying(&cgrp->self) ? cgrp : NULL;
}

/*
 * The registration bound to the current task's cgroup v2 or to its
 * nearest bound ancestor, or NULL; *@cgrpp is the cgroup it is bound to.
 * Under rcu_read_lock() (and gs_seq for a consistent answer).  The task's
 * cgroups are live (a populated cgroup cannot be removed), so a binding
 * left on a removed cgroup never matches.
 */
struct gs_ctr *gs_find_task(struct cgroup **cgrpp)
{
	struct cgroup *cgrp;
	struct gs_ctr *ctr;

	for (cgrp = task_dfl_cgroup(current); cgrp; cgrp = cgroup_parent(cgrp)) {
		list_for_each_entry_rcu(ctr, &gs_ctrs, node) {
			if (READ_ONCE(ctr->cgrp) == cgrp) {
				*cgrpp = cgrp;
				return ctr;
			}
		}
	}
	return NULL;
}

/* Set @ctr's binding to @cgrp (referenced, or NULL); returns the old one. */
static struct cgroup *gs_set_binding(struct gs_ctr *ctr, struct cgroup *cgrp)
{
	struct cgroup *old = ctr->cgrp;

	lockdep_assert_held(&gs_lock);
	write_seqcount_begin(&gs_seq);
	WRITE_ONCE(ctr->cgrp, cgrp);
	write_seqcount_end(&gs_seq);
	return old;
}

/*
 * Drop the bindings whose cgroup has been removed, and with them the
 * reference that keeps the dead cgroup's memory.  Until then readers
 * already treat them as unbound (gs_bound()).  Runs before every command
 * and, while any binding is kept, every GS_REAP_PERIOD (no kernel
 * interface tells a module that a cgroup was removed), so that a dead
 * cgroup is not pinned for as long as no command comes.  Returns whether
 * any binding is left.
 */
static bool gs_reap(void)
{
	struct gs_ctr *ctr;
	bool left = false;

	mutex_lock(&gs_lock);
	list_for_each_entry(ctr, &gs_ctrs, node) {
		if (ctr->cgrp && !gs_bound(ctr))
			cgroup_put(gs_set_binding(ctr, NULL));
		left |= !!ctr->cgrp;
	}
	mutex_unlock(&gs_lock);
	return left;
}

#define GS_REAP_PERIOD	(5 * HZ)

static void gs_reap_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(gs_reap_work, gs_reap_fn);

/* Re-arms itself while bindings are kept; cancelled (synchronously) at exit. */
static void gs_reap_fn(struct work_struct *work)
{
	if (gs_reap())
		schedule_delayed_work(&gs_reap_work, GS_REAP_PERIOD);
}

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

static int gs_declare_gpu(const struct gs_cmd *cmd)
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
static int gs_add(const struct gs_cmd *cmd)
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
static int gs_del(const char *id)
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
 * The cgroup v2 at @path (modified) relative to the root of the writer's
 * cgroup namespace, referenced; ERR_PTR(-ENOENT) if there is none.
 *
 * Not cgroup_get_from_path(): its kernfs walk also finds the directory of
 * a cgroup that cgroup_create() is still building (kernfs_create_dir()
 * links it before cgrp->kn, self.parent and ancestors[] are set) and
 * returns that half-built cgroup, on which cgroup_id() dereferences NULL.
 * Here the walk only yields the kernfs node's id, and cgroup_get_from_id()
 * takes the cgroup: its kernfs_find_and_get_node_by_id() returns only an
 * active node, and cgroup_mkdir() activates the node last, once the
 * cgroup is complete (css_populate_dir() has by then taken and released
 * kernfs_idr_lock, which the lookup takes before it tests the node, so the
 * stores that built the cgroup are visible to it); cgroup_rmdir()
 * deactivates it first.  So the result is a complete, not yet removed
 * cgroup, or ESRCH for the caller.
 */
static struct cgroup *gs_cgroup_at(char *path)
{
	struct kernfs_node *kn, *next;
	char *name;
	u64 id;

	/* Only the task itself changes its nsproxy; the namespace pins its root. */
	kn = current->nsproxy->cgroup_ns->root_cset->dfl_cgrp->kn;
	kernfs_get(kn);
	while ((name = strsep(&path, "/"))) {
		if (!*name)
			continue;	/* "//" and a trailing '/', as kernfs does */
		/* Only a directory has children (a file's node is a union). */
		next = kernfs_type(kn) == KERNFS_DIR ?
			kernfs_find_and_get(kn, name) : NULL;
		kernfs_put(kn);
		if (!next)
			return ERR_PTR(-ENOENT);
		kn = next;
	}
	id = kn->id;
	kernfs_put(kn);
	return cgroup_get_from_id(id);	/* also checks that it is a directory */
}

/*
 * Bind a registration to a cgroup v2, given by id (0 unbinds) or by path
 * relative to the writer's cgroup namespace root; either must exist now
 * and must not be the cgroup2 root.  The binding holds a reference on the
 * cgroup, so that no other cgroup can ever have its address.
 */
static int gs_bind(struct gs_cmd *cmd)
{
	struct cgroup *cgrp = NULL;
	struct gs_ctr *ctr, *other;
	int ret = 0;

	mutex_lock(&gs_lock);
	ctr = gs_find(cmd->id);
	mutex_unlock(&gs_lock);
	if (!ctr)
		return -ENOENT;	/* stays found: gs_cfg_lock is held */

	if (cmd->cgroup_path)
		cgrp = gs_cgroup_at(cmd->cgroup_path);
	else if (cmd->cgroup_id)
		cgrp = cgroup_get_from_id(cmd->cgroup_id);
	if (IS_ERR(cgrp))
		return -ESRCH;
	/* Every process is under the root: it is no container's. */
	if (cgrp && !cgroup_parent(cgrp)) {
		cgroup_put(cgrp);
		return -EINVAL;
	}

	mutex_lock(&gs_lock);
	list_for_each_entry(other, &gs_ctrs, node)
		if (cgrp && other != ctr && gs_bound(other) == cgrp)
			ret = -EBUSY;
	if (!ret) {
		if (cgrp)	/* a no-op while the reaper is pending */
			schedule_delayed_work(&gs_reap_work, GS_REAP_PERIOD);
		cgrp = gs_set_binding(ctr, cgrp);	/* put the old one */
	}
	mutex_unlock(&gs_lock);
	if (cgrp)
		cgroup_put(cgrp);
	return ret;
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
		return gs_add(cmd);
	case GS_OP_DEL:
		return gs_del(cmd->id);
	case GS_OP_BIND:
		return gs_bind(cmd);
	}
	return -EINVAL;
}

/* A GPU's settings as upgrade state lines.  Under gs_lock. */
static void gs_dump_settings(struct seq_file *m, const struct gs_gpu *gpu)
{
	const u64 val[GS_SET_N] = {
		[GS_SET_MAX_INST] = gpu->acct.max_inst,
		[GS_SET_POLICY] = gpu->policy,
		[GS_SET_PRIO_RATIO] = gpu->prio_ratio,
		[GS_SET_SLICE_US] = gpu->slice_us,
		[GS_SET_DRAIN_US] = gpu->drain_us,
	};
	u32 i;

	for (i = GS_SET_MAX_INST; i < GS_SET_N; i++)
		seq_printf(m, "set %u %s %llu\n", gpu->index,
			   gs_setting_names[i], val[i]);
}

/* The GPU time charged to each of a container's shares.  Under gs_lock. */
static void gs_dump_gputime(struct seq_file *m, struct gs_ctr *ctr)
{
	struct gs_gpu *gpu;
	u64 used;
	u32 i;

	for (i = 0; i < ctr->nquota; i++) {
		gpu = gs_gpus[ctr->quota[i].gpu];
		spin_lock(&gpu->sched_lock);
		used = gs_sched_used(&gpu->sched, &ctr->share[i].ent,
				     ktime_get_ns());
		spin_unlock(&gpu->sched_lock);
		seq_printf(m, "gputime %s %u %llu\n", ctr->id, gpu->index, used);
	}
}

/*
 * The registry (GPUs, containers, bindings) as inst_ctl commands; with
 * @state, the settings (default_memsize, max_inst, policy, prio_ratio,
 * slice_us, drain_us) and the containers' GPU time too, as the upgrade
 * file's lines.
 */
static void gs_dump_lines(struct seq_file *m, bool state)
{
	struct gs_ctr *ctr;
	u32 i;

	mutex_lock(&gs_lock);
	if (state)
		seq_printf(m, "set %s %llu\n",
			   gs_setting_names[GS_SET_DEFAULT_MEMSIZE],
			   gs_default_mem);
	for (i = 0; i < GPUSHARE_MAX_GPUS; i++) {
		if (!gs_gpus[i])
			continue;
		seq_printf(m, "gpu %u %llu\n", i, gs_gpus[i]->acct.total_mem);
		if (state)
			gs_dump_settings(m, gs_gpus[i]);
	}
	list_for_each_entry(ctr, &gs_ctrs, node) {
		seq_printf(m, "add %s ", ctr->id);
		for (i = 0; i < ctr->nquota; i++) {
			const struct gs_quota *q = &ctr->quota[i];

			seq_printf(m, "%s%u:%llu:%u:%u", i ? "," : "", q->gpu,
				   q->memsize, q->weight, q->highprio);
		}
		seq_putc(m, '\n');
	}
	list_for_each_entry(ctr, &gs_ctrs, node) {
		/*
		 * Once: rmdir marks the cgroup dying without gs_lock, so a
		 * second gs_bound() could answer NULL to cgroup_id().
		 */
		struct cgroup *cgrp = gs_bound(ctr);

		if (cgrp)
			seq_printf(m, "bind %s %llu\n", ctr->id, cgroup_id(cgrp));
	}
	if (state) {
		list_for_each_entry(ctr, &gs_ctrs, node)
			gs_dump_gputime(m, ctr);
		seq_puts(m, "end\n");	/* whole: see gs_check_state() */
	}
	mutex_unlock(&gs_lock);
}

/*
 * The registry (GPUs, containers, bindings) as inst_ctl commands; the
 * settings (default_memsize, max_inst, policy, prio_ratio, slice_us,
 * drain_us) are not in it.
 */
void gs_dump(struct seq_file *m)
{
	gs_dump_lines(m, false);
}

/*
 * The whole state as /proc/gpushare/upgrade shows it: a header with the
 * format, the version and the module's upgrade state, then lines that
 * the upgrade file of the next version takes (gs_parse_state_line()).
 * Under gs_cfg_lock, so that no command runs between the header and the
 * lines.
 */
void gs_dump_state(struct seq_file *m)
{
	mutex_lock(&gs_cfg_lock);
	seq_printf(m, "gpushare-upgrade %d %s %s\n", GS_STATE_FORMAT,
		   GPUSHARE_VERSION, gs_upgrade_states[gs_upgrade]);
	gs_dump_lines(m, true);
	mutex_unlock(&gs_cfg_lock);
}

/* ---- upgrades: export, abort, import (see kmod/README.md) ---- */

/* Set the upgrade state: under all three locks, see gs_kmod.h. */
static void gs_set_upgrade(enum gs_upgrade_state state)
{
	lockdep_assert_held(&gs_cfg_lock);
	mutex_lock(&gs_lock);
	spin_lock(&gs_mem_lock);
	gs_upgrade = state;
	spin_unlock(&gs_mem_lock);
	mutex_unlock(&gs_lock);
}

/*
 * Freeze the module (from @from) if no /dev/gpushare file is open: a
 * file's ledger and places in the schedules belong to this module's
 * memory and cannot move to another.  From then on no file opens.
 */
static int gs_freeze(enum gs_upgrade_state from, enum gs_upgrade_state to)
{
	int ret = 0;

	lockdep_assert_held(&gs_cfg_lock);
	mutex_lock(&gs_lock);
	spin_lock(&gs_mem_lock);
	if (gs_upgrade != from || gs_nfiles)
		ret = -EBUSY;
	else
		gs_upgrade = to;
	spin_unlock(&gs_mem_lock);
	mutex_unlock(&gs_lock);
	return ret;
}

static u32 gs_nr_ctrs(void)
{
	struct gs_ctr *ctr;
	u32 n = 0;

	mutex_lock(&gs_lock);
	list_for_each_entry(ctr, &gs_ctrs, node)
		n++;
	mutex_unlock(&gs_lock);
	return n;
}

/*
 * Hand the registry over: freeze it (commands and setting writes get
 * EBUSY, /dev/gpushare does not open) and drop the registrations' module
 * references, so that rmmod succeeds with containers registered; the
 * state read from the upgrade file after this is final.  Again: nothing.
 */
static int gs_export(void)
{
	u32 n;

	if (gs_upgrade == GS_UPGRADE_EXPORTED)
		return 0;
	if (gs_freeze(GS_UPGRADE_LIVE, GS_UPGRADE_EXPORTED))
		return -EBUSY;
	for (n = gs_nr_ctrs(); n; n--)
		module_put(THIS_MODULE);
	pr_info("exported for an upgrade: registry frozen, rmmod allowed\n");
	return 0;
}

/*
 * Undo an export (the registrations pin the module again) or give up
 * waiting for an import; the module runs on as it is.  The caller holds
 * a module reference, so the module is not going.
 */
static int gs_abort(void)
{
	u32 n;

	if (gs_upgrade == GS_UPGRADE_EXPORTED)
		for (n = gs_nr_ctrs(); n; n--)
			__module_get(THIS_MODULE);
	if (gs_upgrade != GS_UPGRADE_LIVE)
		pr_info("upgrade aborted: registry live again\n");
	gs_set_upgrade(GS_UPGRADE_LIVE);
	return 0;
}

/* Set the GPU time charged to container @id on GPU @gpu (an import's). */
static void gs_set_gputime(const char *id, u32 gpu, u64 ns)
{
	struct gs_ctr *ctr;
	u32 i;

	mutex_lock(&gs_lock);
	ctr = gs_find(id);
	for (i = 0; ctr && i < ctr->nquota; i++) {
		if (ctr->quota[i].gpu != gpu)
			continue;
		spin_lock(&gs_gpus[gpu]->sched_lock);
		ctr->share[i].ent.used_ns = ns;
		spin_unlock(&gs_gpus[gpu]->sched_lock);
	}
	mutex_unlock(&gs_lock);
}

/*
 * Apply checked lines (gs_check_state()) to a frozen module with no
 * container.  Only a lack of memory can fail then; the containers added
 * so far are deleted again (GPUs and settings stay), so the registry is
 * empty and the state can be written again.  A binding whose cgroup is
 * gone is left out and reported: the container stays registered, unbound.
 */
static int gs_apply_state(struct gs_state_line *lines, u32 n)
{
	struct gs_state_line *l;
	u32 i, skipped = 0;
	int ret = 0;

	for (i = 0; i < n && !ret; i++) {
		l = &lines[i];
		if (l->kind == GS_LINE_SET) {
			ret = gs_proc_set(l->setting == GS_SET_DEFAULT_MEMSIZE ?
					  NULL : gs_gpus[l->cmd.gpu],
					  l->setting, l->value);
		} else if (l->kind == GS_LINE_GPUTIME) {
			gs_set_gputime(l->cmd.id, l->cmd.gpu, l->value);
		} else if (l->kind == GS_LINE_END) {
			continue;
		} else if (l->cmd.op == GS_OP_BIND) {
			ret = gs_bind(&l->cmd);
			if (ret) {
				pr_warn("import: %s not bound to cgroup %llu (%d): it is gone\n",
					l->cmd.id, l->cmd.cgroup_id, ret);
				skipped++;
				ret = 0;
			}
		} else if (l->cmd.op == GS_OP_GPU) {
			ret = gs_declare_gpu(&l->cmd);
		} else {
			ret = gs_add(&l->cmd);
		}
	}
	if (!ret) {
		pr_info("imported %u lines, %u bindings left out\n", n, skipped);
		return 0;
	}
	pr_err("import failed at line %u (%d): registry emptied again\n",
	       i + 1, ret);
	while (i--)
		if (lines[i].kind == GS_LINE_CMD && lines[i].cmd.op == GS_OP_ADD)
			gs_del(lines[i].cmd.id);
	return ret;
}

/*
 * Split @buf (modified) into lines and parse them: the header, then the
 * rest into *@linesp (allocated, for the caller to free).  No empty line;
 * the last newline is optional.
 */
static int gs_parse_state(char *buf, struct gs_state_line **linesp, u32 *np)
{
	struct gs_state_line *lines;
	char *s = buf, *line;
	u32 n = 0, max = 0;
	size_t len = strlen(buf);
	int ret;

	if (len && buf[len - 1] == '\n')
		buf[len - 1] = '\0';
	for (line = buf; *line; line++)
		max += *line == '\n';
	if (max > GS_STATE_LINES_MAX)
		return -E2BIG;
	line = strsep(&s, "\n");
	ret = gs_parse_state_header(line);
	if (ret)
		return ret;
	lines = kvcalloc(max ? max : 1, sizeof(*lines), GFP_KERNEL);
	if (!lines)
		return -ENOMEM;
	while ((line = strsep(&s, "\n"))) {
		ret = gs_parse_state_line(line, &lines[n]);
		if (ret) {
			pr_warn("import: line %u refused (%d)\n", n + 2, ret);
			kvfree(lines);
			return ret;
		}
		n++;
	}
	ret = gs_check_state(lines, n, &max);
	if (ret && max == n)
		pr_warn("import: refused, no \"end\" line: the state must be written whole, in one write()\n");
	else if (ret)
		pr_warn("import: line %u refused (%d)\n", max + 2, ret);
	if (ret) {
		kvfree(lines);
		return ret;
	}
	*linesp = lines;
	*np = n;
	return 0;
}

/*
 * Take over an exported module's state, all or nothing: into a module
 * waiting for it (await_import=1), or a live one with no container and no
 * open /dev/gpushare file.  Frozen meanwhile.
 */
static int gs_import(char *buf)
{
	enum gs_upgrade_state was = gs_upgrade;
	struct gs_state_line *lines;
	u32 n;
	int ret;

	if (gs_nr_ctrs())
		return -EBUSY;
	if (was == GS_UPGRADE_LIVE && gs_freeze(was, GS_UPGRADE_IMPORTING))
		return -EBUSY;
	if (gs_upgrade != GS_UPGRADE_IMPORTING)
		return -EBUSY;
	ret = gs_parse_state(buf, &lines, &n);
	if (!ret) {
		ret = gs_apply_state(lines, n);
		kvfree(lines);
	}
	gs_set_upgrade(ret ? was : GS_UPGRADE_LIVE);
	return ret;
}

/*
 * A write to /proc/gpushare/upgrade (NUL-terminated, @len bytes):
 * "export", "abort", or a state to import.  Under gs_cfg_lock, with a
 * module reference held by the caller.
 */
int gs_upgrade_write(char *buf, size_t len)
{
	lockdep_assert_held(&gs_cfg_lock);
	if (gs_dying)
		return -ENODEV;
	if (!strcmp(buf, "export") || !strcmp(buf, "export\n"))
		return gs_export();
	if (!strcmp(buf, "abort") || !strcmp(buf, "abort\n"))
		return gs_abort();
	return gs_import(buf);
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
	cancel_delayed_work_sync(&gs_reap_work);
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
