// SPDX-License-Identifier: GPL-2.0-only
/*
 * gs_widen.ko: a test-only module that widens a kernel race window.
 *
 * A kretprobe on kernfs_create_dir_ns() busy-waits delay_ms milliseconds
 * after it returns, for directories whose name starts with prefix.  In
 * cgroup_create() that is the moment the new cgroup's kernfs node is
 * already linked (so cgroup_get_from_path() finds it) while cgrp->kn and
 * cgrp->self.parent are not set yet: a bind racing mkdir lands in it at
 * once.  Never load it outside a test machine.
 */
#include <linux/delay.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/ptrace.h>
#include <linux/string.h>

static char prefix[32] = "gswiden";
module_param_string(prefix, prefix, sizeof(prefix), 0444);
MODULE_PARM_DESC(prefix, "delay only directories whose name starts with this");

static unsigned int delay_ms = 20;
module_param(delay_ms, uint, 0444);
MODULE_PARM_DESC(delay_ms, "busy-wait this long after the directory is linked");

static atomic_t hits = ATOMIC_INIT(0);

static int hits_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&hits));
}

static const struct kernel_param_ops hits_ops = {
	.get = hits_get,
};
module_param_cb(hits, &hits_ops, NULL, 0444);
MODULE_PARM_DESC(hits, "how many times the window was widened");

struct widen_data {
	bool match;
};

static int widen_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct widen_data *d = (struct widen_data *)ri->data;
	const char *name = (const char *)regs_get_kernel_argument(regs, 1);

	d->match = name && !strncmp(name, prefix, strlen(prefix));
	return 0;
}

/* Runs in atomic context: mdelay, not msleep. */
static int widen_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct widen_data *d = (struct widen_data *)ri->data;

	if (d->match && !IS_ERR_OR_NULL((void *)regs_return_value(regs))) {
		atomic_inc(&hits);
		mdelay(delay_ms);
	}
	return 0;
}

static struct kretprobe widen_probe = {
	.kp.symbol_name = "kernfs_create_dir_ns",
	.entry_handler = widen_entry,
	.handler = widen_ret,
	.data_size = sizeof(struct widen_data),
	.maxactive = 16,
};

static int __init widen_init(void)
{
	if (!prefix[0] || delay_ms > 1000)
		return -EINVAL;
	return register_kretprobe(&widen_probe);
}

static void __exit widen_exit(void)
{
	unregister_kretprobe(&widen_probe);
}

module_init(widen_init);
module_exit(widen_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Test only: widen the cgroup creation window for gpushare's bind tests");
