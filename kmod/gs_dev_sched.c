// SPDX-License-Identifier: GPL-2.0-only
/*
 * /dev/gpushare's compute scheduling: GPUSHARE_IOC_SCHED (ACQUIRE, with
 * its sleep while the GPU is another's, EXTEND, RELEASE, INFO) for an open
 * file's clients of its GPUs' schedulers (gs_sched.c), and their
 * detachment when the file is released.
 *
 * Locking (see gs_kmod.h): each GPU's scheduler, its entities and its
 * clients are under that GPU's sched_lock, a spinlock and the innermost
 * lock, taken here alone (an ioctl) or inside gs_mem_lock (a release, as
 * del does, so that both walk ctr->files safely); never two GPUs' at
 * once.  A waiting ACQUIRE drops it and sleeps on the GPU's sched_wq until
 * sched_gen moves (gs_sched_kick()) or its retry time comes.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/sched.h>
#include <linux/time_namespace.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "gs_kmod.h"

/*
 * @fh leaves every GPU's schedule: a slice it is in ends for it (for its
 * container when it was the last client there), it stops waiting, and
 * the waiters ask again when that may let one of them in (the core says
 * so: a file that only asked, of a container with others, wakes nobody,
 * so that a loop of open, ACQUIRE NOWAIT, close cannot make every waiter
 * on the GPU run).  Under gs_mem_lock, which del holds while it detaches
 * the clients of every file of a container.
 */
void gs_fh_sched_detach(struct gs_fh *fh)
{
	struct gs_ctr *ctr = fh->ctr;
	struct gs_gpu *gpu;
	u32 i;

	lockdep_assert_held(&gs_mem_lock);
	for (i = 0; i < ctr->nquota; i++) {
		if (!fh->sched[i].ent)
			continue;	/* never asked, or del detached it */
		gpu = gs_gpus[ctr->quota[i].gpu];
		spin_lock(&gpu->sched_lock);
		if (gs_sched_detach(&gpu->sched, &fh->sched[i], ktime_get_ns()))
			gs_sched_kick(gpu);
		spin_unlock(&gpu->sched_lock);
	}
}

/*
 * The answer's fields every op fills in.  Under the GPU's sched_lock.
 * drain_ns and forced_ends (ABI 4) reach only a caller whose structure
 * has them: the copy out is as long as the caller's size.
 */
static void gs_sched_fill(struct gs_gpu *gpu, struct gs_share *share,
			  struct gpushare_sched *m, u64 now)
{
	const struct gs_sched *s = &gpu->sched;

	m->slice_ns = s->slice_ns;
	m->gputime_ns = gs_sched_used(s, &share->ent, now);
	m->policy = s->policy;
	m->weight = share->ent.weight;
	m->highprio = share->ent.highprio;
	m->out_flags = s->policy == GS_POLICY_NATIVE ? GPUSHARE_SCHED_NATIVE : 0;
	m->drain_ns = s->drain_ns;
	m->forced_ends = s->forced_ends;
}

/* May this op sleep when the core says "not yet"?  A plain ACQUIRE only. */
static bool gs_sched_blocks(const struct gpushare_sched *m)
{
	return m->op == GPUSHARE_SCHED_ACQUIRE &&
	       !(m->flags & (GPUSHARE_SCHED_NOWAIT | GPUSHARE_SCHED_EARLY));
}

/*
 * One step of @m->op for client @c of @share on @gpu, under its
 * sched_lock: 0, -EAGAIN (not yet: a plain ACQUIRE asks again at
 * @m->until or when woken; EARLY and EXTEND never wait) or -ENOENT
 * (deleted: del detached every client already).  The client is attached
 * on its first plain ACQUIRE, so that a file that only asks INFO, EARLY
 * or EXTEND (or never schedules there) is not an online container.
 *
 * Waiters were told to ask again at the slice's end or its forced end:
 * an EXTEND that moves the forced end wakes nobody (each waiter asks at
 * the old one, is told the new one and sleeps again), and a renewal keeps
 * the holder and the slice's number.  Any op may end a slice by force
 * (gs_expire()), or hand the GPU on: then the waiters are woken.
 */
static int gs_sched_step(struct gs_gpu *gpu, struct gs_share *share,
			 struct gs_sched_client *c, struct gpushare_sched *m,
			 u64 now)
{
	struct gs_sched *s = &gpu->sched;
	const struct gs_sched_ent *holder = s->holder, *offer = s->offer;
	u64 slice = s->slice;
	bool granted;

	m->until = 0;
	if (!share->ent.added)
		return -ENOENT;
	switch (m->op) {
	case GPUSHARE_SCHED_ACQUIRE:
		if (m->flags & GPUSHARE_SCHED_EARLY) {
			granted = gs_sched_renew(s, c, now, &m->until) ==
				  GS_SCHED_GRANT;
			break;
		}
		if (!c->ent)
			gs_sched_attach(s, c, &share->ent, now);
		granted = gs_sched_acquire(s, c, now, &m->until) ==
			  GS_SCHED_GRANT;
		break;
	case GPUSHARE_SCHED_EXTEND:
		granted = gs_sched_extend(s, c, now, &m->until);
		break;
	case GPUSHARE_SCHED_RELEASE:
		if (gs_sched_release(s, c, m->used_ns, now))
			gs_sched_kick(gpu);
		return 0;
	default:
		if (s->holder == &share->ent)
			m->until = s->hold_until;
		return 0;
	}
	/*
	 * The GPU changed hands, or is offered to a waiter: the waiters ask
	 * again (the new holder's other clients join).
	 */
	if (s->holder != holder || s->slice != slice || s->offer != offer)
		gs_sched_kick(gpu);
	return granted ? 0 : -EAGAIN;
}

/*
 * A signal came while @c waited: it stops waiting, so that its container
 * is not offered the GPU on its behalf, unless it is in a slice (its
 * renewal was refused): that it leaves only by RELEASE, or loses at the
 * slice's grace, since its work may still be running.
 */
static void gs_sched_interrupted(struct gs_gpu *gpu, struct gs_sched_client *c)
{
	spin_lock(&gpu->sched_lock);
	if (c->ent && !c->slice &&
	    gs_sched_release(&gpu->sched, c, 0, ktime_get_ns()))
		gs_sched_kick(gpu);
	spin_unlock(&gpu->sched_lock);
}

/* A waiter's shortest sleep: a retry time already past is not a busy loop. */
#define GS_SCHED_MIN_WAIT_NS	(20 * NSEC_PER_USEC)

/*
 * GPUSHARE_IOC_SCHED's op on @fh's client for m->gpu, answered in @m when
 * the file acts for a container with a quota there (*@filled).  A
 * blocking ACQUIRE sleeps between tries until the GPU's sched_gen moves
 * (something changed) or the retry time the core gave comes, whichever
 * is first, with a high-resolution timeout: slices are milliseconds, and
 * a jiffy (4 ms at HZ=250) would be a large part of one.  A retry time
 * that a holder's EXTEND has moved since is no lost wake-up: that try is
 * told the new forced end and sleeps again (no kick: a drain wakes each
 * waiter at most once per heartbeat, and never past slice + drain_ns),
 * and the release that ends the drain kicks.  sched_gen is read under
 * sched_lock after the step, so a kick between the unlock and the sleep
 * ends the sleep at once.
 */
static int gs_sched_op(struct gs_fh *fh, struct gpushare_sched *m, bool *filled)
{
	struct gs_ctr *ctr = fh->ctr;	/* and its quotas' GPUs: fixed */
	struct gs_sched_client *c;
	struct gs_share *share;
	struct gs_gpu *gpu;
	unsigned int gen;
	u64 now, wait;
	int ret;
	u32 i;

	ret = gs_quota_index(ctr, m->gpu);
	if (ret < 0)
		return ret;
	i = ret;
	share = &ctr->share[i];
	gpu = gs_gpus[m->gpu];
	c = &fh->sched[i];
	*filled = true;

	for (;;) {
		spin_lock(&gpu->sched_lock);
		now = ktime_get_ns();
		ret = gs_sched_step(gpu, share, c, m, now);
		gs_sched_fill(gpu, share, m, now);
		gen = gpu->sched_gen;	/* after the step's own kick */
		spin_unlock(&gpu->sched_lock);
		if (ret != -EAGAIN || !gs_sched_blocks(m))
			return ret;

		wait = m->until > now ? m->until - now : 0;
		wait = max_t(u64, wait, GS_SCHED_MIN_WAIT_NS);
		ret = wait_event_interruptible_hrtimeout(gpu->sched_wq,
							 READ_ONCE(gpu->sched_gen) != gen,
							 ns_to_ktime(wait));
		if (ret == -ERESTARTSYS) {
			gs_sched_interrupted(gpu, c);
			return -EINTR;
		}
	}
}

/*
 * @ns of the host's CLOCK_MONOTONIC (ktime_get_ns(), the scheduler's
 * clock) as the calling task sees that clock: a container in its own time
 * namespace has an offset, and its interposer compares until with its
 * clock_gettime(CLOCK_MONOTONIC).  Saturating; 0 ("none") and the far
 * future stay as they are.
 */
static u64 gs_mono_to_user(u64 ns)
{
	struct timespec64 ts;
	s64 v;

	if (!ns || ns >= KTIME_MAX)
		return ns;
	ts = ns_to_timespec64(ns);
	timens_add_monotonic(&ts);
	v = timespec64_to_ns(&ts);	/* KTIME_MAX on overflow */
	return v > 0 ? v : 0;
}

/*
 * GPUSHARE_IOC_SCHED with an extensible structure, as MEM's (see the uapi
 * header).  The structure is known writable before anything changes.
 */
long gs_sched_ioctl(struct gs_fh *fh, struct gpushare_sched __user *um)
{
	struct gpushare_sched m;
	bool filled = false;
	size_t out;
	u32 usize;
	int ret;

	ret = gs_copy_in(&m, sizeof(m), um, GPUSHARE_SCHED_SIZE_VER0, &usize);
	if (ret)
		return ret;
	if (m.op > GPUSHARE_SCHED_EXTEND ||
	    (m.flags & ~(GPUSHARE_SCHED_NOWAIT | GPUSHARE_SCHED_EARLY)))
		return -EINVAL;
	/* A bigger struct's tail is zero already (copy_struct_from_user). */
	out = min_t(size_t, usize, sizeof(m));
	if (copy_to_user(um, &m, out))
		return -EFAULT;

	ret = gs_sched_op(fh, &m, &filled);
	/* The only absolute time, also EXTEND's forced end. */
	m.until = gs_mono_to_user(m.until);
	if (filled && copy_to_user(um, &m, out))
		return -EFAULT;
	return ret;
}
