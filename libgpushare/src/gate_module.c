// SPDX-License-Identifier: Apache-2.0
/*
 * The compute gate in module mode (gate.h): /dev/gpushare's
 * GPUSHARE_IOC_SCHED decides, for every process of the container together.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_driver.h"
#include "gate.h"
#include "ledger.h"
#include "pace.h"

/*
 * Module mode, a device that is not one of the container's: its launches
 * are refused (fail closed, as its memory is), or a tenant could leave a
 * GPU unscheduled by rewriting GPUSHARE_GPU_UUIDS.  @until stays 0, so
 * every launch comes to the slow path and is refused there.
 */
static void refuse(struct gate *g, int dev, int err)
{
	fprintf(stderr, "gpushare: launches on CUDA device %d are refused: %s\n", dev,
		err == ENODEV ? "it is not one of this container's GPUs" :
				"this container has no share of it");
	g->how = HOW_REFUSED;
	g->in_slice = false;
	atomic_store(&g->until, 0);
}

/*
 * Module mode, the registration is gone (ENOENT): pass launches, and ask
 * again at the first launch a second from now (see gate_reconnect()).
 */
static void orphan(struct gate *g)
{
	g->how = HOW_ORPHAN;
	g->in_slice = false;
	g->nlate = 0;		/* nobody to report it to */
	atomic_store(&g->until, mono_ns() + 1000000000ull);
}

/* Module mode: errors meaning the device is not the container's. */
static bool not_ours(int err)
{
	return err == ENODEV || err == ENXIO;
}

/*
 * Module mode, an answer other than the device not being the container's:
 * pass.  ENOENT: the container was deleted (its processes are on their way
 * out), or deleted and registered again (the plugin's resync), so look for
 * a new registration now and then.
 */
static void unscheduled(struct gate *g, int dev, int err)
{
	fprintf(stderr, "gpushare: launches on CUDA device %d are not scheduled: %s\n", dev,
		err == ENOENT ? "this container is not registered (any more)" : strerror(err));
	if (err == ENOENT)
		orphan(g);
	else
		gate_pass(g);
}

int gate_sched_op(int dev, uint32_t op, uint32_t flags, uint64_t used,
		  struct gpushare_sched *q)
{
	memset(q, 0, sizeof(*q));
	q->op = op;
	q->flags = flags;
	q->used_ns = used;
	return gs_ledger_sched(dev, q);
}

bool gate_module_renew(struct gate *g, int dev, bool early)
{
	uint32_t flags = GPUSHARE_SCHED_NOWAIT | (early ? GPUSHARE_SCHED_EARLY : 0);
	struct gpushare_sched q;

	if (gate_sched_op(dev, GPUSHARE_SCHED_ACQUIRE, flags, 0, &q))
		return false;
	g->slice_ns = q.slice_ns;
	gs_pace_set_slice(&g->pace, q.slice_ns);
	if (q.out_flags & GPUSHARE_SCHED_NATIVE) {
		/* Switched to native: nothing to wait for, nothing to report. */
		gate_sched_op(dev, GPUSHARE_SCHED_RELEASE, 0, 0, &q);
		gate_granted(g, q.until, false);
	} else {
		atomic_store(&g->until, q.until);	/* the same slice, renewed */
		gate_releaser_kick();
	}
	return true;
}

void gate_module_acquire(struct gate *g, int dev)
{
	struct gpushare_sched q;

	while (gate_sched_op(dev, GPUSHARE_SCHED_ACQUIRE, 0, 0, &q)) {
		int err = errno;

		if (err == EINTR)
			continue;
		if (not_ours(err))
			refuse(g, dev, err);
		else
			unscheduled(g, dev, err);
		return;
	}
	g->slice_ns = q.slice_ns;
	gs_pace_set_slice(&g->pace, q.slice_ns);
	gate_granted(g, q.until, !(q.out_flags & GPUSHARE_SCHED_NATIVE));
}

/*
 * Module mode, the first slow path on @dev: true when the module decided
 * (scheduled, refused, or not scheduled); false for a module without the
 * scheduler, where the environment's limit applies (standalone).
 */
bool gate_module_setup(struct gate *g, int dev)
{
	struct gpushare_sched q;

	gs_cuda_attach(dev);
	if (gate_sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q) == 0) {
		g->how = HOW_MODULE;
		g->slice_ns = q.slice_ns;
		/* ABI 4 answers drain_ns; an older module leaves it 0. */
		gate_pace_setup(g, q.drain_ns, true);
		return true;
	}
	int err = errno;

	if (not_ours(err)) {
		refuse(g, dev, err);
		return true;
	}
	/* A module without the scheduler: the environment's limit, if any. */
	if (err != ENOTTY && err != EINVAL) {
		unscheduled(g, dev, err);
		return true;
	}
	return false;
}

/*
 * HOW_ORPHAN, a second after it was last asked: is there a registration
 * again?  The descriptor of the deleted one answers ENOENT for ever, so
 * the ledger opens /dev/gpushare again (at most once a second for the
 * process: another device may have done it already).
 */
static _Atomic uint64_t last_reopen;

void gate_reconnect(struct gate *g, int dev)
{
	struct gpushare_sched q;
	uint64_t now = mono_ns(), t = atomic_load(&last_reopen);
	int r = gate_sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q);

	if (r && errno == ENOENT && now - t >= 1000000000ull &&
	    atomic_compare_exchange_strong(&last_reopen, &t, now) && gs_ledger_reopen() == 0)
		r = gate_sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q);
	if (r == 0) {
		fprintf(stderr, "gpushare: launches on CUDA device %d are scheduled again: "
			"the container is registered\n", dev);
		g->how = HOW_MODULE;
		g->slice_ns = q.slice_ns;
		gate_pace_setup(g, q.drain_ns, true);
		g->in_slice = false;
		atomic_store(&g->until, 0);
	} else if (not_ours(errno)) {
		refuse(g, dev, errno);
	} else {
		atomic_store(&g->until, now + 1000000000ull);
	}
}
