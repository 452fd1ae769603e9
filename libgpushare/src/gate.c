// SPDX-License-Identifier: Apache-2.0
/*
 * The compute gate (see sched_gate.h; its parts: gate.h): the environment,
 * the mode, and the launch path.
 *
 * Per device, a process holds a grant: until its end (CLOCK_MONOTONIC ns,
 * the module's clock too) launches go straight to the driver.  The first
 * launch after it (the slow path), under the device's mutex:
 *   1. a launch into a stream being captured passes: it runs later, as a
 *      graph, and is gated then;
 *   2. module mode, in a slice and on time: try to renew it (ACQUIRE with
 *      NOWAIT); granted, nothing needs to wait (see gate_exchange());
 *   3. otherwise drain: an end event on every stream launched on in the
 *      slice, and wait for them; the slice's GPU time is the longest
 *      start-to-end time among them (a start event goes before the first
 *      launch on each stream in the slice); give the GPU back with it;
 *   4. wait for the next grant (module: blocking ACQUIRE; standalone: the
 *      core's acquire, sleeping until it says).
 * Other threads reaching the slow path meanwhile wait on the mutex and
 * then find the new grant.  Nothing here fails a launch: when an event
 * call fails, the stream is synchronised instead and its time is not
 * reported (the core then charges the time the GPU was held).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "cuda_driver.h"
#include "env.h"
#include "gate.h"
#include "ledger.h"
#include "pace.h"
#include "sched_gate.h"

struct gate gates[MAX_DEVICES];
_Atomic int gate_mode;			/* enum mode */
struct gate_config gate_cfg;
TLS struct gate_last gate_last;
struct gate_driver gate_drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ndevices;			/* 1: every launch is device 0's */

/*
 * The child of fork starts with no grant (its own /dev/gpushare file, its
 * own standalone schedule) and no events: a CUDA context does not survive
 * fork.  The slice numbers go on, so no thread's cache matches a new one.
 */
static void child_after_fork(void)
{
	memset(gates, 0, sizeof(gates));	/* HOW_UNKNOWN, no grant */
	for (int i = 0; i < MAX_DEVICES; i++)
		pthread_mutex_init(&gates[i].lock, NULL);
	memset(&gate_last, 0, sizeof(gate_last));
	gate_releaser_reset();	/* no releaser in the child: started again at its first slice */
}

__attribute__((constructor)) static void sched_setup(void)
{
	for (int i = 0; i < MAX_DEVICES; i++)
		pthread_mutex_init(&gates[i].lock, NULL);
	gate_releaser_reset();
	pthread_atfork(NULL, NULL, child_after_fork);
}

#define LOAD(field, name) (gate_drv.field = (__typeof__(gate_drv.field))gs_driver_sym(name))

/* Chosen once, at the first launch. */
static void choose(void)
{
	const char *u = getenv("GPUSHARE_GPU_UUIDS"), *l = getenv("GPUSHARE_CORE_LIMIT");
	const char *bad = NULL;
	enum mode m = MODE_OFF;

	gate_cfg.debug = getenv("GPUSHARE_DEBUG") != NULL;
	const char *pace = getenv("GPUSHARE_SCHED_PACE");
	gate_cfg.pace_on = !pace || strcmp(pace, "0") != 0;
	LOAD(ctx_get_current, "cuCtxGetCurrent");
	LOAD(ctx_get_device, "cuCtxGetDevice");
	LOAD(device_get_count, "cuDeviceGetCount");
	LOAD(is_capturing, "cuStreamIsCapturing");
	LOAD(event_create, "cuEventCreate");
	LOAD(event_destroy, "cuEventDestroy_v2");
	LOAD(event_record, "cuEventRecord");
	LOAD(event_sync, "cuEventSynchronize");
	LOAD(event_query, "cuEventQuery");
	LOAD(ctx_set_current, "cuCtxSetCurrent");
	LOAD(elapsed, "cuEventElapsedTime");
	LOAD(stream_sync, "cuStreamSynchronize");
	LOAD(ctx_sync, "cuCtxSynchronize");
	if (!gate_drv.event_destroy)
		LOAD(event_destroy, "cuEventDestroy");
	if (!gate_drv.device_get_count || gate_drv.device_get_count(&ndevices) != CUDA_SUCCESS)
		ndevices = 0;

	gate_cfg.nuuids = u && *u ? gs_parse_uuids(u, gate_cfg.uuids, GS_MAX_GPUS) : 0;
	gate_cfg.nlimits = l && *l ? gs_parse_percents(l, gate_cfg.limits, GS_MAX_GPUS) : 0;
	if (gate_cfg.nuuids < 0)
		bad = "GPUSHARE_GPU_UUIDS is not a list of at most 16 UUIDs";
	else if (gate_cfg.nlimits < 0)
		bad = "GPUSHARE_CORE_LIMIT is not a list of at most 16 percents (0-100)";
	else if (gate_cfg.nuuids && gate_cfg.nlimits && gate_cfg.nuuids != gate_cfg.nlimits)
		bad = "GPUSHARE_CORE_LIMIT and GPUSHARE_GPU_UUIDS differ in length";
	if (bad)
		gate_cfg.nlimits = 0;

	/*
	 * With a registration the module decides, as for memory: any process
	 * can set GPUSHARE_ISOLATION for its children, so it cannot turn the
	 * schedule off (a container without a compute share is registered
	 * with weight 0 and scheduled as best effort).
	 */
	if (gs_ledger_mode() == GS_LEDGER_MODULE) {
		m = MODE_MODULE;
	} else if (!gs_isolation_compute(getenv("GPUSHARE_ISOLATION"))) {
		m = MODE_OFF;
	} else if (bad && l && *l) {
		fprintf(stderr, "gpushare: %s: GPU time is not limited\n", bad);
	} else {
		for (int i = 0; i < gate_cfg.nlimits; i++)
			if (gate_cfg.limits[i] > 0 && gate_cfg.limits[i] < 100)
				m = MODE_STANDALONE;
	}
	if (gate_cfg.debug) {
		char buf[GS_MAX_GPUS * 12 + 1] = "";
		uint32_t w[GS_MAX_GPUS];
		int n = m == MODE_MODULE ? gs_ledger_weights(w, GS_MAX_GPUS) : gate_cfg.nlimits;
		for (int i = 0; i < n; i++)
			snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%" PRIu32,
				 i ? "," : "", m == MODE_MODULE ? w[i] : gate_cfg.limits[i]);
		if (m == MODE_MODULE)
			fprintf(stderr, "gpushare: pid %d: compute module, weights [%s]\n",
				(int)getpid(), buf);
		else if (m == MODE_STANDALONE)
			fprintf(stderr, "gpushare: pid %d: compute standalone, limits [%s] percent, %s\n",
				(int)getpid(), buf,
				gate_cfg.nuuids ? "GPUs by UUID" : "GPUs by CUDA ordinal");
		else
			fprintf(stderr, "gpushare: pid %d: compute off\n", (int)getpid());
	}
	atomic_store(&gate_mode, m);
}

/* The device of a launch on the current context; cached per thread. */
static int launch_device(void)
{
	CUcontext c = NULL;
	CUdevice d;

	if (ndevices == 1)
		return 0;
	if (!gate_drv.ctx_get_current || gate_drv.ctx_get_current(&c) != CUDA_SUCCESS || !c)
		return -1;
	if (c == gate_last.ctx)
		return gate_last.dev;
	if (!gate_drv.ctx_get_device || gate_drv.ctx_get_device(&d) != CUDA_SUCCESS)
		return -1;
	gate_last.ctx = c;
	gate_last.dev = d;
	return d;
}

static CUresult slow(struct gate *g, int dev, CUstream s)
{
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&g->lock);
	if (g->how == HOW_UNKNOWN)
		gate_setup(g, dev);
	if (g->how == HOW_REFUSED) {
		r = CUDA_ERROR_NOT_PERMITTED;
	} else if (gate_capturing(s)) {
		/* captured work does not run now */
	} else if (g->how != HOW_PASS) {
		/* Another thread may have exchanged while this one waited. */
		if (g->how == HOW_ORPHAN && mono_ns() >= atomic_load(&g->until))
			gate_reconnect(g, dev);
		bool gated = g->how == HOW_MODULE || g->how == HOW_STANDALONE;
		if (gated && g->paced)
			gated = gate_paced_launch(g, dev, s);
		else if (gated && mono_ns() >= atomic_load(&g->until))
			gate_exchange(g, dev, false);
		if (g->how == HOW_REFUSED)
			r = CUDA_ERROR_NOT_PERMITTED;
		else if (g->how != HOW_PASS && g->how != HOW_ORPHAN)
			gate_track_locked(g, s);
	}
	pthread_mutex_unlock(&g->lock);
	return r;
}

CUresult gs_sched_gate(int dev, CUstream s, bool per_thread)
{
	int m = atomic_load_explicit(&gate_mode, memory_order_acquire);

	if (m == MODE_OFF)
		return CUDA_SUCCESS;
	if (m == MODE_UNKNOWN) {
		pthread_once(&once, choose);
		if (atomic_load(&gate_mode) == MODE_OFF)
			return CUDA_SUCCESS;
	}
	if (dev < 0)
		dev = launch_device();
	if (dev < 0 || dev >= MAX_DEVICES)
		return CUDA_SUCCESS;	/* no context: the driver will say */
	if (!s)
		s = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
	struct gate *g = &gates[dev];
	uint64_t until = atomic_load_explicit(&g->until, memory_order_acquire);
	if (until == NEVER)
		return CUDA_SUCCESS;
	uint64_t now = mono_ns();
	if (now < until) {
		/* Paced in a slice (a native grant has nothing to pace). */
		if (g->paced && atomic_load_explicit(&g->in_slice, memory_order_relaxed)) {
			enum gs_pace_verdict v = gs_pace_launch(&g->pace, now, until);
			if (v == GS_PACE_STOP)
				return slow(g, dev, s);
			if (v == GS_PACE_PROBE) {
				pthread_mutex_lock(&g->lock);
				gate_track_locked(g, s);
				gate_probe_record(g, s);
				pthread_mutex_unlock(&g->lock);
				return CUDA_SUCCESS;
			}
		}
		if (gate_last.stream == s &&
		    gate_last.gen == atomic_load_explicit(&g->gen, memory_order_relaxed))
			return CUDA_SUCCESS;
		pthread_mutex_lock(&g->lock);
		gate_track_locked(g, s);
		pthread_mutex_unlock(&g->lock);
		return CUDA_SUCCESS;
	}
	return slow(g, dev, s);
}
