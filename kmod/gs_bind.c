// SPDX-License-Identifier: GPL-2.0-only
/*
 * Bindings of registrations to cgroups v2: the bind command, the lookup
 * of the caller's registration by its cgroup, and the reaper of bindings
 * whose cgroup was removed.
 *
 * Locking (see gs_kmod.h): a binding (ctr->cgrp) is written under gs_lock
 * inside a gs_seq write section, so GPUSHARE_IOC_QUERY reads it without a
 * lock; the bind command runs under gs_cfg_lock, so the registration it
 * binds is not deleted meanwhile.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cgroup.h>
#include <linux/err.h>
#include <linux/kernfs.h>
#include <linux/nsproxy.h>
#include <linux/percpu-refcount.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/workqueue.h>

#include "gs_kmod.h"

/*
 * The cgroup @ctr is bound to, or NULL when it is unbound or that cgroup
 * has been removed (rmdir kills cgrp->self's reference count before it
 * returns).  Under gs_lock, or under RCU: a cgroup is freed a grace period
 * after its last reference goes.  The count itself is tested: css_is_dying()
 * did so until a 2025 change (mainline, and 6.12.y's backport) made it test
 * a CSS_DYING flag, which is set on subsystem states only, never on
 * cgrp->self.
 */
struct cgroup *gs_bound(const struct gs_ctr *ctr)
{
	struct cgroup *cgrp = READ_ONCE(ctr->cgrp);

	return cgrp && !percpu_ref_is_dying(&cgrp->self.refcnt) ? cgrp : NULL;
}

/*
 * The registration bound to the current task's cgroup v2 or to its
 * nearest bound ancestor, or NULL; *@cgrpp is the cgroup it is bound to.
 * Under rcu_read_lock() (and gs_seq for a consistent answer).  The task's
 * cgroups are live (rmdir refuses a cgroup with a live task: 7.2's
 * ignores exiting ones, and the caller is not exiting), so a binding left
 * on a removed cgroup never matches.
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
struct cgroup *gs_set_binding(struct gs_ctr *ctr, struct cgroup *cgrp)
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
bool gs_reap(void)
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

/* Stop the reaper: at exit, once no command can arm it again. */
void gs_reap_stop(void)
{
	cancel_delayed_work_sync(&gs_reap_work);
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
 * cgroup is complete; cgroup_rmdir() deactivates it first.  A lookup
 * that finds the node active also sees the stores that built the cgroup:
 * 6.1's lookup takes kernfs_idr_lock, which css_populate_dir() took and
 * released after them; from 6.9 it takes no lock, but kernfs_activate()
 * sets the node active under kernfs_rwsem, which css_populate_dir() also
 * took and released after them, and the lookup takes the node's count
 * with a fully ordered atomic before it reads the cgroup.  So the result
 * is a complete, not yet removed cgroup, or ESRCH for the caller.
 *
 * The last node must be a directory: cgroup_get_from_id() checks that only
 * since 6.0 (before, a file's id was taken for a cgroup's).
 */
static struct cgroup *gs_cgroup_at(char *path)
{
	struct kernfs_node *kn, *next;
	char *name;
	bool dir;
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
	dir = kernfs_type(kn) == KERNFS_DIR;
	id = kn->id;
	kernfs_put(kn);
	return dir ? cgroup_get_from_id(id) : ERR_PTR(-ENOENT);
}

/*
 * Bind a registration to a cgroup v2, given by id (0 unbinds) or by path
 * relative to the writer's cgroup namespace root; either must exist now
 * and must not be the cgroup2 root.  The binding holds a reference on the
 * cgroup, so that no other cgroup can ever have its address.
 */
int gs_bind(struct gs_cmd *cmd)
{
	struct cgroup *cgrp = NULL;
	struct gs_ctr *ctr, *other;
	int ret = 0;

	mutex_lock(&gs_lock);
	ctr = gs_find(cmd->id);
	mutex_unlock(&gs_lock);
	if (!ctr)
		return -ENOENT;	/* stays found: gs_cfg_lock is held */

	if (cmd->cgroup_path || cmd->cgroup_id) {
		cgrp = cmd->cgroup_path ? gs_cgroup_at(cmd->cgroup_path) :
					  cgroup_get_from_id(cmd->cgroup_id);
		/* Before 6.1, cgroup_get_from_id() failed with NULL. */
		if (IS_ERR_OR_NULL(cgrp))
			return -ESRCH;
	}
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
