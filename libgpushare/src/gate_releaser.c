// SPDX-License-Identifier: Apache-2.0
/*
 * The compute gate's releaser (gate.h): one thread per process, started at
 * the first slice of a gated device, that gives a slice back when its grant
 * has ended and no launch came to take the slow path (a process that
 * launched, then went idle on the CPU).  Without it the module would end the slice by force a
 * grace later, and the next launch, maybe seconds later, would report a
 * span of events that takes in all the idle time: charged as late work.
 * It waits on rel_cv (CLOCK_MONOTONIC) until the earliest grant end, plus
 * rel_delay(), among the devices in a slice; never with a gate's mutex held.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "gate.h"
#include "thread.h"

/*
 * The releaser's C library calls, bound to their versions before 2.34 as
 * glibc_compat.h binds the others (the library must load under an older
 * glibc than the build host's).
 */
#if defined(GS_GLIBC_BASE)
__asm__(".symver pthread_create,pthread_create@" GS_GLIBC_BASE);
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@" GS_GLIBC_BASE);
__asm__(".symver pthread_attr_setstacksize,pthread_attr_setstacksize@" GS_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" GS_GLIBC_BASE);
#if defined(__x86_64__)
__asm__(".symver pthread_condattr_setclock,pthread_condattr_setclock@GLIBC_2.3.3");
#else
__asm__(".symver pthread_condattr_setclock,pthread_condattr_setclock@" GS_GLIBC_BASE);
#endif
#endif

static pthread_mutex_t rel_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rel_cv;
static bool rel_started;
static _Atomic bool exiting;

/* After a grant's end: the launching thread's chance to renew first. */
static uint64_t rel_delay(const struct gate *g)
{
	return g->slice_ns / 8;		/* half the grace, so before a forced end */
}

void gate_releaser_reset(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&rel_cv, &a);
	pthread_condattr_destroy(&a);
	pthread_mutex_init(&rel_mu, NULL);
	rel_started = false;
}

/* Process exit: the releaser (detached) touches nothing from here on. */
__attribute__((destructor)) static void sched_teardown(void)
{
	atomic_store(&exiting, true);
}

static void *releaser(void *arg);

/* A new slice (or a renewed one) on a device: the releaser's next deadline. */
void gate_releaser_kick(void)
{
	pthread_mutex_lock(&rel_mu);
	if (!rel_started)
		rel_started = gs_thread_start(releaser, NULL, 256 * 1024) == 0;
	pthread_cond_signal(&rel_cv);
	pthread_mutex_unlock(&rel_mu);
}

/*
 * The releaser's work on @g (its mutex held): the grant ended a while ago
 * and no launch came for it: drain and give the slice back.  Not the
 * ACQUIRE: the next launch asks.  The idle time before the grant's end is
 * inside the hold, charged anyway; the end events are recorded now, so
 * nothing after it is reported.
 */
static void release_idle(struct gate *g, int dev)
{
	if (!g->in_slice || (g->how != HOW_MODULE && g->how != HOW_STANDALONE) ||
	    mono_ns() < atomic_load(&g->until) + rel_delay(g))
		return;
	if (!gate_nameable(g) ||
	    (g->nstreams && (!g->ctx || !gate_drv.ctx_set_current ||
			     gate_drv.ctx_set_current(g->ctx) != CUDA_SUCCESS))) {
		g->rel_skip = true;	/* the slow path drains it */
		return;
	}
	uint64_t used = 0;
	if (!gate_drain(g, g->held ? g->drain_ns : g->slice_ns / 4, g->held, &used)) {
		/* Still working, not idle: look again a slice later. */
		g->rel_retry = mono_ns() + g->slice_ns;
		return;
	}
	gate_give_back(g, dev, used);
}

static void *releaser(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&rel_mu);
	while (!atomic_load(&exiting)) {
		uint64_t now = mono_ns(), next = NEVER;
		int due = -1;
		for (int i = 0; i < MAX_DEVICES; i++) {
			struct gate *g = &gates[i];
			if (!atomic_load(&g->in_slice) || atomic_load(&g->rel_skip) ||
			    !atomic_load(&g->until))
				continue;	/* closed: the slow path is draining */
			uint64_t t = atomic_load(&g->until) + rel_delay(g);
			if (t < g->rel_retry)
				t = g->rel_retry;
			if (t <= now) {
				due = i;
				break;
			}
			if (t < next)
				next = t;
		}
		if (due < 0) {
			if (next == NEVER) {
				pthread_cond_wait(&rel_cv, &rel_mu);
			} else {
				struct timespec ts = { .tv_sec = (time_t)(next / 1000000000ull),
						       .tv_nsec = (long)(next % 1000000000ull) };
				pthread_cond_timedwait(&rel_cv, &rel_mu, &ts);
			}
			continue;
		}
		/* Never wait with a gate's mutex held, nor for one. */
		pthread_mutex_unlock(&rel_mu);
		struct gate *g = &gates[due];
		if (pthread_mutex_trylock(&g->lock) == 0) {
			g->rel_retry = 0;
			if (!atomic_load(&exiting))
				release_idle(g, due);
			pthread_mutex_unlock(&g->lock);
		} else {
			/* A launch is on the slow path: it decides; look again soon. */
			g->rel_retry = mono_ns() + 1000000;
		}
		pthread_mutex_lock(&rel_mu);
	}
	pthread_mutex_unlock(&rel_mu);
	return NULL;
}
