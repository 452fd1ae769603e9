// SPDX-License-Identifier: GPL-2.0-only
/*
 * gs_hang.ko: a test-only module that makes gpushare.ko's writes hang.
 *
 * Writing N (milliseconds) to the hold_ms parameter starts a kernel thread
 * that takes gpushare.ko's gs_cfg_lock, the mutex every inst_ctl command runs
 * under, and keeps it N ms (or until 0 is written): a write to
 * /proc/gpushare/inst_ctl meanwhile sleeps inside gpushare.ko, as on a stuck
 * kernel.  The parameter held reads 1 while the lock is held, hangs counts the
 * holds.  gpushare.ko exports nothing, so the lock is found through kallsyms,
 * whose lookup function is itself found through a kprobe.  The holding
 * thread ends in kthread_complete_and_exit() (kernel text), so unloading,
 * which waits for that completion, never frees code a thread still runs.
 * gpushare.ko is pinned (one more reference) while this module is loaded.
 * Never load it outside a test machine.
 */
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/err.h>
#include <linux/jiffies.h>
#include <linux/kprobes.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/preempt.h>
#include <linux/wait.h>

#define MAX_HOLD_MS 60000

static struct mutex *cfg_lock;
static struct module *owner;	/* gpushare.ko, pinned while cfg_lock is used */
static DECLARE_WAIT_QUEUE_HEAD(hang_wq);
static DEFINE_MUTEX(start_lock);	/* one hold_ms write at a time */
static DECLARE_COMPLETION(idle);	/* done: no holding thread runs */
static atomic_t held = ATOMIC_INIT(0);	/* it has the lock */
static atomic_t release = ATOMIC_INIT(0);
static atomic_t hangs = ATOMIC_INIT(0);

static int hold_thread(void *arg)
{
	unsigned long ms = (unsigned long)arg;

	mutex_lock(cfg_lock);
	atomic_set(&held, 1);
	atomic_inc(&hangs);
	wait_event_timeout(hang_wq, atomic_read(&release), msecs_to_jiffies(ms));
	atomic_set(&held, 0);
	mutex_unlock(cfg_lock);
	kthread_complete_and_exit(&idle, 0);
}

static int hold_set(const char *val, const struct kernel_param *kp)
{
	struct task_struct *t;
	unsigned int ms;
	int ret = kstrtouint(val, 0, &ms);

	if (ret)
		return ret;
	if (!ms) {
		mutex_lock(&start_lock);
		atomic_set(&release, 1);
		wake_up_all(&hang_wq);
		mutex_unlock(&start_lock);
		return 0;
	}
	if (ms > MAX_HOLD_MS)
		return -EINVAL;
	mutex_lock(&start_lock);
	if (!try_wait_for_completion(&idle)) {
		mutex_unlock(&start_lock);
		return -EBUSY;
	}
	atomic_set(&release, 0);
	t = kthread_run(hold_thread, (void *)(unsigned long)ms, "gs_hang");
	ret = IS_ERR(t) ? PTR_ERR(t) : 0;
	if (ret)
		complete(&idle);
	mutex_unlock(&start_lock);
	return ret;
}

static int held_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&held));
}

static int hangs_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&hangs));
}

static const struct kernel_param_ops hold_ops = {
	.set = hold_set,
};
module_param_cb(hold_ms, &hold_ops, NULL, 0200);
MODULE_PARM_DESC(hold_ms, "hold gpushare's gs_cfg_lock this long (0: let go now)");

static const struct kernel_param_ops held_ops = {
	.get = held_get,
};
module_param_cb(held, &held_ops, NULL, 0444);
MODULE_PARM_DESC(held, "1 while the lock is held");

static const struct kernel_param_ops hangs_ops = {
	.get = hangs_get,
};
module_param_cb(hangs, &hangs_ops, NULL, 0444);
MODULE_PARM_DESC(hangs, "how many times the lock was taken");

/*
 * Pin gpushare.ko so that it cannot go (rmmod fails with EBUSY) while
 * cfg_lock points into it; __module_address is not exported, so it too is
 * found through kallsyms.
 */
static int __init hang_init(void)
{
	struct kprobe kp = { .symbol_name = "kallsyms_lookup_name" };
	unsigned long (*lookup)(const char *name);
	struct module *(*module_of)(unsigned long addr);
	int ret = register_kprobe(&kp);

	if (ret)
		return ret;
	lookup = (void *)kp.addr;
	unregister_kprobe(&kp);
	cfg_lock = (struct mutex *)lookup("gpushare:gs_cfg_lock");
	module_of = (void *)lookup("__module_address");
	if (!cfg_lock || !module_of)
		return -ENOENT;
	preempt_disable();
	owner = module_of((unsigned long)cfg_lock);
	if (owner && !try_module_get(owner))
		owner = NULL;
	preempt_enable();
	if (!owner)
		return -ENOENT;
	complete(&idle);
	return 0;
}

static void __exit hang_exit(void)
{
	atomic_set(&release, 1);
	wake_up_all(&hang_wq);
	wait_for_completion(&idle);
	module_put(owner);
}

module_init(hang_init);
module_exit(hang_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Test only: hold gpushare's command lock so that its writes hang");
