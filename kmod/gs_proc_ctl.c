// SPDX-License-Identifier: GPL-2.0-only
/*
 * /proc/gpushare/inst_ctl and /proc/gpushare/upgrade: the registry's
 * commands and an upgrade's state, both root only (0600, and readers and
 * writers need CAP_SYS_ADMIN by their opener's credentials, see
 * gs_may_read_registry()).
 *
 * Locking (see gs_kmod.h): a write runs under gs_cfg_lock, holding a
 * module reference so that a plain rmmod fails rather than racing it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "gs_kmod.h"

static int inst_ctl_show(struct seq_file *m, void *v)
{
	gs_dump(m);
	return 0;
}

/* Root only, even to read: every container's ID and quotas are in it. */
static int inst_ctl_open(struct inode *inode, struct file *file)
{
	int ret = gs_may_read_registry(file);

	return ret ? ret : single_open(file, inst_ctl_show, NULL);
}

static ssize_t inst_ctl_write(struct file *file, const char __user *ubuf,
			      size_t count, loff_t *ppos)
{
	struct gs_cmd *cmd;
	char *buf;
	int ret;

	if (!count || count > GPUSHARE_CMD_MAX)
		return -EINVAL;
	buf = memdup_user_nul(ubuf, count);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		ret = -ENOMEM;
	else if (memchr(buf, 0, count))
		ret = -EINVAL;	/* parsing would stop at the NUL */
	else
		ret = gs_parse_cmd(buf, cmd);
	/*
	 * Hold the module while the command runs, so that a plain rmmod
	 * fails (EAGAIN) rather than racing a registration.  Safety against
	 * a forced unload, which ignores this, comes from gs_dying.
	 */
	if (!ret && !try_module_get(THIS_MODULE))
		ret = -ENODEV;
	if (!ret) {
		mutex_lock(&gs_cfg_lock);
		ret = gs_exec(cmd);
		mutex_unlock(&gs_cfg_lock);
		module_put(THIS_MODULE);
	}
	kfree(cmd);
	kfree(buf);
	return ret ? ret : count;
}

static const struct proc_ops gs_inst_ctl_ops = {
	.proc_open = inst_ctl_open,
	.proc_read = seq_read,
	.proc_write = inst_ctl_write,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
};

/* ---- upgrade ---- */

static int upgrade_show(struct seq_file *m, void *v)
{
	gs_dump_state(m);
	return 0;
}

/* Root only, even to read: the whole registry is in it. */
static int upgrade_open(struct inode *inode, struct file *file)
{
	int ret = gs_may_read_registry(file);

	return ret ? ret : single_open_size(file, upgrade_show, NULL,
					    PAGE_SIZE * 4);
}

/* "export", "abort", or a state to import, in one write: see gs_upgrade.c. */
static ssize_t upgrade_write(struct file *file, const char __user *ubuf,
			     size_t count, loff_t *ppos)
{
	char *buf;
	int ret;

	if (!count || count > GS_STATE_MAX)
		return -EINVAL;
	buf = kvmalloc(count + 1, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	ret = copy_from_user(buf, ubuf, count) ? -EFAULT : 0;
	buf[count] = '\0';
	if (!ret && memchr(buf, 0, count))
		ret = -EINVAL;
	/* As for inst_ctl: a plain rmmod waits for no write in flight. */
	if (!ret && !try_module_get(THIS_MODULE))
		ret = -ENODEV;
	if (!ret) {
		mutex_lock(&gs_cfg_lock);
		ret = gs_upgrade_write(buf, count);
		mutex_unlock(&gs_cfg_lock);
		module_put(THIS_MODULE);
	}
	kvfree(buf);
	return ret ? ret : count;
}

static const struct proc_ops gs_upgrade_ops = {
	.proc_open = upgrade_open,
	.proc_read = seq_read,
	.proc_write = upgrade_write,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
};

/* inst_ctl and upgrade in @root. */
int gs_proc_add_ctl(struct proc_dir_entry *root)
{
	if (!proc_create("inst_ctl", 0600, root, &gs_inst_ctl_ops) ||
	    !proc_create("upgrade", 0600, root, &gs_upgrade_ops))
		return -ENOMEM;
	return 0;
}
