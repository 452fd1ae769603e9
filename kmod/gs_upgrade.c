// SPDX-License-Identifier: GPL-2.0-only
/*
 * Module upgrades (see kmod/README.md): the registry and its settings as
 * lines (inst_ctl's read, /proc/gpushare/upgrade's read), the export that
 * freezes the registry and lets the module go, the abort, and the import
 * that replays an exported state into the next version.
 *
 * Locking (see gs_kmod.h): gs_upgrade is written under gs_cfg_lock,
 * gs_lock and gs_mem_lock together (gs_set_upgrade(), gs_freeze()), so
 * any one of them is enough to read it.  Writes to the upgrade file run
 * under gs_cfg_lock, as commands do.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cgroup.h>
#include <linux/module.h>
#include <linux/mm.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/timekeeping.h>

#include "gs_kmod.h"

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
			ret = gs_add_ctr(&l->cmd);
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
			gs_del_ctr(lines[i].cmd.id);
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
