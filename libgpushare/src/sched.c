// SPDX-License-Identifier: Apache-2.0
/*
 * The compute gate (see sched_gate.h).
 *
 * Per device, a process holds a grant: until its end (CLOCK_MONOTONIC ns,
 * the module's clock too) launches go straight to the driver.  The first
 * launch after it (the slow path), under the device's mutex:
 *   1. a launch into a stream being captured passes: it runs later, as a
 *      graph, and is gated then;
 *   2. module mode, in a slice and on time: try to renew it (ACQUIRE with
 *      NOWAIT); granted, nothing needs to wait (see exchange());
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
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uapi/gpushare.h>
#include <gs_sched.h>

#include "cuda_abi.h"
#include "env.h"
#include "feedback.h"
#include "pace.h"
#include "ledger.h"
#include "cuda_driver.h"
#include "sched_gate.h"
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

#define MAX_DEVICES 64
#define MAX_STREAMS 8		/* streams timed per slice; more: drain the context */
#define NEVER UINT64_MAX	/* a grant that never ends: the device is not gated */
#define STANDALONE_DRAIN_NS 1000000000ull	/* standalone's drain bound */

/* The TLS model of a library loaded at start (preloaded): no lookup call. */
#define TLS __thread __attribute__((tls_model("initial-exec")))

enum mode { MODE_UNKNOWN, MODE_OFF, MODE_STANDALONE, MODE_MODULE };
/*
 * HOW_ORPHAN: module mode, the registration is gone (ENOENT): launches pass,
 * and the slow path asks again at most once a second (a container
 * re-registered under its ID is a new registration: the ledger reopens
 * /dev/gpushare, and the new descriptor acts for it).
 */
enum how { HOW_UNKNOWN, HOW_PASS, HOW_REFUSED, HOW_STANDALONE, HOW_MODULE, HOW_ORPHAN };

struct tracked {
	CUstream stream;	/* CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a handle */
	pthread_t owner;	/* whose per-thread default stream */
	bool timed;		/* its start event is recorded */
};

/* One device, in this process. */
struct gate {
	_Atomic uint64_t until;		/* the grant's end; 0: none */
	_Atomic uint64_t gen;		/* the slice's number (unique in the process) */
	pthread_mutex_t lock;		/* the rest */
	enum how how;
	_Atomic bool in_slice;		/* something to drain and release */
	int nstreams;
	bool overflow;			/* more streams than tracked: drain the context */
	struct tracked st[MAX_STREAMS];
	uint64_t slice_ns;		/* the GPU's slice (module), the core's (standalone) */
	bool events_tried, have_events;
	CUcontext ctx;			/* current when the events were made */
	CUevent start[MAX_STREAMS], end[MAX_STREAMS];
	/* Work a bounded drain did not see end: reported when it has. */
	int nlate;
	CUevent late_start[MAX_STREAMS], late_end[MAX_STREAMS];
	_Atomic bool rel_skip;		/* the releaser cannot drain this slice */
	uint64_t rel_retry;		/* the releaser's: mutex busy, try then */
	/*
	 * Pacing (ABI 4 module, or standalone; GPUSHARE_SCHED_PACE=0: off):
	 * the queue is kept to the grant, the drain is part of the hold and
	 * is kept alive by heartbeats, up to drain_ns.
	 */
	bool paced;
	bool held;			/* drains are heartbeats, up to drain_ns */
	uint64_t drain_ns;
	struct gs_pace pace;
	CUevent probe[GS_PACE_SLOTS];	/* the pacer's probes, by its slots */
	int probe_last;			/* the last completed probe's slot, -1: none */
	/* standalone: this process's own schedule of the device */
	struct gs_sched core;
	struct gs_sched_ent ent;
	struct gs_sched_client client;
	struct gs_feedback fb;		/* standalone: own GPU time steers the weight */
};

static struct gate gates[MAX_DEVICES];
static _Atomic uint64_t next_gen;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int mode;		/* enum mode */
static bool debug;
static bool pace_on;			/* GPUSHARE_SCHED_PACE is not 0 */
static int ndevices;			/* 1: every launch is device 0's */
static int nuuids, nlimits;
static char uuids[GS_MAX_GPUS][GS_UUID_MAX];
static uint32_t limits[GS_MAX_GPUS];

/* What the last launch of this thread found: skips the lookups next time. */
static TLS struct {
	CUcontext ctx;		/* current context ... */
	int dev;		/* ... and its device */
	CUstream stream;	/* tracked in slice gen */
	uint64_t gen;
} last;

static struct {
	CUresult (*ctx_get_current)(CUcontext *);
	CUresult (*ctx_get_device)(CUdevice *);
	CUresult (*device_get_count)(int *);
	CUresult (*is_capturing)(CUstream, int *);
	CUresult (*event_create)(CUevent *, unsigned int);
	CUresult (*event_destroy)(CUevent);
	CUresult (*event_record)(CUevent, CUstream);
	CUresult (*event_sync)(CUevent);
	CUresult (*event_query)(CUevent);
	CUresult (*ctx_set_current)(CUcontext);
	CUresult (*elapsed)(float *, CUevent, CUevent);
	CUresult (*stream_sync)(CUstream);
	CUresult (*ctx_sync)(void);
} drv;

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = (time_t)(t / 1000000000ull),
			       .tv_nsec = (long)(t % 1000000000ull) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* A polling wait's step: 0.1 ms from @now, never past @end (> @now). */
static void poll_nap(uint64_t now, uint64_t end)
{
	sleep_until(end - now < 100000 ? end : now + 100000);
}

/*
 * The releaser: one thread per process, started at the first slice of a
 * gated device, that gives a slice back when its grant has ended and no
 * launch came to take the slow path (a process that launched, then went
 * idle on the CPU).  Without it the module would end the slice by force a
 * grace later, and the next launch, maybe seconds later, would report a
 * span of events that takes in all the idle time: charged as late work.
 * It waits on rel_cv (CLOCK_MONOTONIC) until the earliest grant end, plus
 * REL_DELAY, among the devices in a slice; never with a gate's mutex held.
 */
static pthread_mutex_t rel_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rel_cv;
static bool rel_started;
static _Atomic bool exiting;

/* After a grant's end: the launching thread's chance to renew first. */
static uint64_t rel_delay(const struct gate *g)
{
	return g->slice_ns / 8;		/* half the grace, so before a forced end */
}

static void rel_init(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&rel_cv, &a);
	pthread_condattr_destroy(&a);
	pthread_mutex_init(&rel_mu, NULL);
	rel_started = false;
}

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
	memset(&last, 0, sizeof(last));
	rel_init();	/* no releaser in the child: started again at its first slice */
}

__attribute__((constructor)) static void sched_setup(void)
{
	for (int i = 0; i < MAX_DEVICES; i++)
		pthread_mutex_init(&gates[i].lock, NULL);
	rel_init();
	pthread_atfork(NULL, NULL, child_after_fork);
}

/* Process exit: the releaser (detached) touches nothing from here on. */
__attribute__((destructor)) static void sched_teardown(void)
{
	atomic_store(&exiting, true);
}

#define LOAD(field, name) (drv.field = (__typeof__(drv.field))gs_driver_sym(name))

/* Chosen once, at the first launch. */
static void choose(void)
{
	const char *u = getenv("GPUSHARE_GPU_UUIDS"), *l = getenv("GPUSHARE_CORE_LIMIT");
	const char *bad = NULL;
	enum mode m = MODE_OFF;

	debug = getenv("GPUSHARE_DEBUG") != NULL;
	const char *pace = getenv("GPUSHARE_SCHED_PACE");
	pace_on = !pace || strcmp(pace, "0") != 0;
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
	if (!drv.event_destroy)
		LOAD(event_destroy, "cuEventDestroy");
	if (!drv.device_get_count || drv.device_get_count(&ndevices) != CUDA_SUCCESS)
		ndevices = 0;

	nuuids = u && *u ? gs_parse_uuids(u, uuids, GS_MAX_GPUS) : 0;
	nlimits = l && *l ? gs_parse_percents(l, limits, GS_MAX_GPUS) : 0;
	if (nuuids < 0)
		bad = "GPUSHARE_GPU_UUIDS is not a list of at most 16 UUIDs";
	else if (nlimits < 0)
		bad = "GPUSHARE_CORE_LIMIT is not a list of at most 16 percents (0-100)";
	else if (nuuids && nlimits && nuuids != nlimits)
		bad = "GPUSHARE_CORE_LIMIT and GPUSHARE_GPU_UUIDS differ in length";
	if (bad)
		nlimits = 0;

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
		for (int i = 0; i < nlimits; i++)
			if (limits[i] > 0 && limits[i] < 100)
				m = MODE_STANDALONE;
	}
	if (debug) {
		char buf[GS_MAX_GPUS * 12 + 1] = "";
		uint32_t w[GS_MAX_GPUS];
		int n = m == MODE_MODULE ? gs_ledger_weights(w, GS_MAX_GPUS) : nlimits;
		for (int i = 0; i < n; i++)
			snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%" PRIu32,
				 i ? "," : "", m == MODE_MODULE ? w[i] : limits[i]);
		if (m == MODE_MODULE)
			fprintf(stderr, "gpushare: pid %d: compute module, weights [%s]\n",
				(int)getpid(), buf);
		else if (m == MODE_STANDALONE)
			fprintf(stderr, "gpushare: pid %d: compute standalone, limits [%s] percent, %s\n",
				(int)getpid(), buf, nuuids ? "GPUs by UUID" : "GPUs by CUDA ordinal");
		else
			fprintf(stderr, "gpushare: pid %d: compute off\n", (int)getpid());
	}
	atomic_store(&mode, m);
}

/* The device of a launch on the current context; cached per thread. */
static int launch_device(void)
{
	CUcontext c = NULL;
	CUdevice d;

	if (ndevices == 1)
		return 0;
	if (!drv.ctx_get_current || drv.ctx_get_current(&c) != CUDA_SUCCESS || !c)
		return -1;
	if (c == last.ctx)
		return last.dev;
	if (!drv.ctx_get_device || drv.ctx_get_device(&d) != CUDA_SUCCESS)
		return -1;
	last.ctx = c;
	last.dev = d;
	return d;
}

/* The handle the driver's calls take for a tracked stream. */
static CUstream drv_stream(CUstream s)
{
	return s == CU_STREAM_LEGACY ? NULL : s;
}

/*
 * Is @s being captured?  An error counts as yes: during a capture the
 * driver answers some streams with an error (the legacy stream while
 * another is captured), and then nothing must be recorded into them.
 */
static bool capturing(CUstream s)
{
	int status = CU_STREAM_CAPTURE_STATUS_NONE;

	if (!drv.is_capturing)
		return false;
	return drv.is_capturing(drv_stream(s), &status) != CUDA_SUCCESS ||
	       status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Events for timing, made once per device (in the context current then). */
static void make_events(struct gate *g)
{
	int made = 0;

	if (g->events_tried)
		return;
	g->events_tried = true;
	if (!drv.event_create || !drv.event_record || !drv.event_sync || !drv.elapsed)
		return;
	for (; made < 2 * MAX_STREAMS; made++) {
		CUevent *e = made < MAX_STREAMS ? &g->start[made] : &g->end[made - MAX_STREAMS];
		if (drv.event_create(e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
			break;
	}
	for (int i = 0; made == 2 * MAX_STREAMS && i < GS_PACE_SLOTS; i++)
		if (drv.event_create(&g->probe[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
			for (int k = 0; k < i && drv.event_destroy; k++)
				drv.event_destroy(g->probe[k]);
			made = 0;	/* no probes: no events at all */
			break;
		}
	if (made == 2 * MAX_STREAMS) {
		g->have_events = true;
		if (!drv.ctx_get_current || drv.ctx_get_current(&g->ctx) != CUDA_SUCCESS)
			g->ctx = NULL;
		return;
	}
	for (int i = 0; i < made && drv.event_destroy; i++)
		drv.event_destroy(i < MAX_STREAMS ? g->start[i] : g->end[i - MAX_STREAMS]);
}

/* A launch on @s in the current slice: time @s from here if it is new. */
static void track_locked(struct gate *g, CUstream s)
{
	pthread_t self = pthread_self();
	int i;

	if (g->in_slice) {
		for (i = 0; i < g->nstreams; i++)
			if (g->st[i].stream == s &&
			    (s != CU_STREAM_PER_THREAD || pthread_equal(g->st[i].owner, self)))
				break;
		if (i == g->nstreams) {
			if (capturing(s))
				return;		/* not cached: asked again next time */
			if (i == MAX_STREAMS) {
				g->overflow = true;
			} else {
				make_events(g);
				g->st[i].stream = s;
				g->st[i].owner = self;
				g->st[i].timed = g->have_events &&
					drv.event_record(g->start[i], drv_stream(s)) == CUDA_SUCCESS;
				g->nstreams++;
			}
		}
	}
	last.stream = s;
	last.gen = atomic_load_explicit(&g->gen, memory_order_relaxed);
}

/* Elapsed ns between two completed events, 0 when it cannot be read. */
static uint64_t span_ns(CUevent a, CUevent b)
{
	float ms = 0;

	if (drv.elapsed(&ms, a, b) != CUDA_SUCCESS || !(ms > 0) || ms >= 1e9f)
		return 0;
	return (uint64_t)((double)ms * 1e6);
}

/* Work left running by earlier drains: what has ended since, in ns. */
static uint64_t late_done(struct gate *g)
{
	uint64_t used = 0;
	int k = 0;

	for (int i = 0; i < g->nlate; i++) {
		CUresult r = drv.event_query(g->late_end[i]);
		if (r == CUDA_ERROR_NOT_READY) {
			g->late_start[k] = g->late_start[i];
			g->late_end[k++] = g->late_end[i];
			continue;
		}
		if (r == CUDA_SUCCESS)
			used += span_ns(g->late_start[i], g->late_end[i]);
		if (drv.event_destroy) {
			drv.event_destroy(g->late_start[i]);
			drv.event_destroy(g->late_end[i]);
		}
	}
	g->nlate = k;
	return used;
}

/*
 * Stream @i's end event has not completed within the drain's bound: keep
 * its pair to report at a later exchange, and give the slot new events.
 */
static void keep_late(struct gate *g, int i)
{
	CUevent s, e;

	if (g->nlate == MAX_STREAMS || !drv.event_destroy ||
	    drv.event_create(&s, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
		return;		/* not measured: the core charges the hold */
	if (drv.event_create(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
		drv.event_destroy(s);
		return;
	}
	g->late_start[g->nlate] = g->start[i];
	g->late_end[g->nlate++] = g->end[i];
	g->start[i] = s;
	g->end[i] = e;
}

/* Can this slice be drained without cuCtxSynchronize (from any thread)? */
static bool nameable(const struct gate *g)
{
	if (g->overflow)
		return false;
	for (int i = 0; i < g->nstreams; i++)
		if (g->st[i].stream == CU_STREAM_PER_THREAD)
			return false;
	return true;
}

/*
 * Wait for the slice's work; true with its GPU time in *@used, ns (0: none
 * measured).  The end events are polled for at most @bound: work that runs
 * on longer (a kernel that waits for one this process has not launched
 * yet) is not waited for.  @keep: then the slice is given up all the same,
 * and the unfinished work's time is reported at a later exchange, once it
 * has ended; else (the releaser) false, and the slice stays as it was, to
 * be drained later.  A per-thread
 * default stream of another thread cannot be named here, nor can more
 * streams than tracked: the context is synchronised (unbounded; the
 * releaser leaves such slices to the slow path).  A stream captured since
 * it was tracked cannot be waited for; it is skipped.
 */
static void heartbeat(struct gate *g);

static bool drain(struct gate *g, uint64_t bound, bool keep, uint64_t *used_out)
{
	pthread_t self = pthread_self();
	bool ended[MAX_STREAMS] = { false };
	bool whole = g->overflow;
	uint64_t used = 0, late = 0;
	int pending = 0;

	if (bound < 1000000)
		bound = 1000000;

	for (int i = 0; i < g->nstreams; i++) {
		struct tracked *t = &g->st[i];
		if (t->stream == CU_STREAM_PER_THREAD && !pthread_equal(t->owner, self)) {
			whole = true;
			continue;
		}
		if (capturing(t->stream))
			continue;
		if (t->timed && drv.event_record(g->end[i], drv_stream(t->stream)) == CUDA_SUCCESS) {
			ended[i] = true;
			pending++;
		} else if (!drv.stream_sync || drv.stream_sync(drv_stream(t->stream)) != CUDA_SUCCESS) {
			whole = true;
		}
	}
	uint64_t deadline = mono_ns() + bound, beat = 0;
	while (pending) {
		for (int i = 0; i < g->nstreams; i++) {
			if (!ended[i])
				continue;
			CUresult r = drv.event_query ? drv.event_query(g->end[i]) :
				     drv.event_sync(g->end[i]);
			if (r == CUDA_ERROR_NOT_READY)
				continue;
			ended[i] = false;
			pending--;
			if (r != CUDA_SUCCESS)
				continue;	/* not timed: the core charges the hold */
			uint64_t ns = span_ns(g->start[i], g->end[i]);
			if (ns > used)
				used = ns;
		}
		if (!pending)
			break;
		uint64_t now = mono_ns();
		/* Paced: the drain is part of the hold, kept alive while it runs. */
		if (g->held && now >= beat) {
			heartbeat(g);
			beat = now + g->slice_ns / 8;
		}
		if (now >= deadline) {
			if (!keep)
				return false;
			for (int i = 0; i < g->nstreams; i++)
				if (ended[i])
					keep_late(g, i);
			break;
		}
		poll_nap(now, deadline);
	}
	if (whole && drv.ctx_sync)
		drv.ctx_sync();
	if (g->nlate)
		late = late_done(g);
	g->nstreams = 0;
	g->overflow = false;
	*used_out = used + late;
	return true;
}

static void *releaser(void *arg);

/* A new slice (or a renewed one) on a device: the releaser's next deadline. */
static void rel_kick(void)
{
	pthread_mutex_lock(&rel_mu);
	if (!rel_started)
		rel_started = gs_thread_start(releaser, NULL, 256 * 1024) == 0;
	pthread_cond_signal(&rel_cv);
	pthread_mutex_unlock(&rel_mu);
}

/* A new grant until @until: a new slice (nothing tracked yet) when @in_slice. */
static void granted(struct gate *g, uint64_t until, bool in_slice)
{
	g->in_slice = in_slice;
	g->nstreams = 0;
	g->overflow = false;
	g->rel_skip = false;
	atomic_store(&g->gen, atomic_fetch_add(&next_gen, 1) + 1);
	atomic_store(&g->until, until);
	if (in_slice)
		rel_kick();
}

static void pass(struct gate *g)
{
	g->how = HOW_PASS;
	g->in_slice = false;
	atomic_store(&g->until, NEVER);
}

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
 * again at the first launch a second from now (see reconnect()).
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
		pass(g);
}

/* ---- module mode: GPUSHARE_IOC_SCHED ---- */

static int sched_op(int dev, uint32_t op, uint32_t flags, uint64_t used,
		    struct gpushare_sched *q)
{
	memset(q, 0, sizeof(*q));
	q->op = op;
	q->flags = flags;
	q->used_ns = used;
	return gs_ledger_sched(dev, q);
}

static bool module_renew(struct gate *g, int dev, bool early)
{
	uint32_t flags = GPUSHARE_SCHED_NOWAIT | (early ? GPUSHARE_SCHED_EARLY : 0);
	struct gpushare_sched q;

	if (sched_op(dev, GPUSHARE_SCHED_ACQUIRE, flags, 0, &q))
		return false;
	g->slice_ns = q.slice_ns;
	gs_pace_set_slice(&g->pace, q.slice_ns);
	if (q.out_flags & GPUSHARE_SCHED_NATIVE) {
		/* Switched to native: nothing to wait for, nothing to report. */
		sched_op(dev, GPUSHARE_SCHED_RELEASE, 0, 0, &q);
		granted(g, q.until, false);
	} else {
		atomic_store(&g->until, q.until);	/* the same slice, renewed */
		rel_kick();
	}
	return true;
}

static void module_acquire(struct gate *g, int dev)
{
	struct gpushare_sched q;

	while (sched_op(dev, GPUSHARE_SCHED_ACQUIRE, 0, 0, &q)) {
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
	granted(g, q.until, !(q.out_flags & GPUSHARE_SCHED_NATIVE));
}

/* ---- standalone: the core, this process its only client ---- */

static void standalone_acquire(struct gate *g)
{
	uint64_t t = mono_ns();
	uint32_t w = gs_feedback_weight(&g->fb, gs_sched_used(&g->core, &g->ent, t), t);

	if (w)
		gs_sched_set_weight(&g->core, &g->ent, w, t);
	for (;;) {
		u64 now = mono_ns(), until;
		if (gs_sched_acquire(&g->core, &g->client, now, &until) == GS_SCHED_GRANT) {
			granted(g, until, true);
			return;
		}
		/* Nobody else can wake us: sleep until the core says (bounded). */
		if (until <= now)
			until = now + 100000;
		else if (until - now > 1000000000ull)
			until = now + 1000000000ull;
		sleep_until(until);
	}
}

/* GPUSHARE_CORE_LIMIT for @dev: by its UUID's place, or by ordinal. */
static uint32_t standalone_limit(int dev)
{
	char uuid[GS_UUID_MAX];

	if (!nuuids)
		return dev < nlimits ? limits[dev] : 0;
	gs_cuda_attach(dev);
	if (!gs_ledger_uuid(dev, uuid))
		return 0;
	for (int i = 0; i < nuuids; i++)
		if (gs_uuid_equal(uuids[i], uuid))
			return limits[i];
	return 0;
}

/*
 * Held drains (heartbeats, up to drain_ns) when the scheduler has a drain
 * bound (ABI 4, or standalone's own core); pacing too in module mode,
 * where the holder is alone on the GPU.  Standalone is not paced: its
 * neighbours' kernels run between its probes (the GPU is not its own),
 * which inflates the cost estimate until the process starves itself.
 */
static void pace_setup(struct gate *g, uint64_t drain_ns, bool pacer)
{
	g->held = pace_on && drain_ns > 0;
	g->paced = g->held && pacer;
	g->drain_ns = drain_ns;
	g->probe_last = -1;
	gs_pace_init(&g->pace, g->slice_ns, mono_ns());
	if (debug)
		fprintf(stderr, "gpushare: pid %d: CUDA device %d %s\n", (int)getpid(),
			(int)(g - gates), g->paced ? "paced" : g->held ? "drains held, not paced" :
			"not paced (old module or GPUSHARE_SCHED_PACE=0)");
}

/* The first slow path on @dev: how it is gated. */
static void setup(struct gate *g, int dev)
{
	if (atomic_load(&mode) == MODE_MODULE) {
		struct gpushare_sched q;
		gs_cuda_attach(dev);
		if (sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q) == 0) {
			g->how = HOW_MODULE;
			g->slice_ns = q.slice_ns;
			/* ABI 4 answers drain_ns; an older module leaves it 0. */
			pace_setup(g, q.drain_ns, true);
			return;
		}
		int err = errno;

		if (not_ours(err)) {
			refuse(g, dev, err);
			return;
		}
		/* A module without the scheduler: the environment's limit, if any. */
		if (err != ENOTTY && err != EINVAL) {
			unscheduled(g, dev, err);
			return;
		}
	}
	uint32_t limit = standalone_limit(dev);
	if (limit == 0 || limit >= 100) {
		pass(g);
		return;
	}
	uint64_t now = mono_ns();
	gs_sched_init(&g->core, now);
	gs_sched_set_policy(&g->core, 3, now);
	/*
	 * Its own core: a long drain stalls nobody else, so it may be long
	 * (a second) and every queue shorter than that is charged exactly.
	 */
	gs_sched_set_drain(&g->core, STANDALONE_DRAIN_NS, now);
	if (gs_sched_add(&g->core, &g->ent, limit, 0, now)) {
		pass(g);
		return;
	}
	gs_sched_attach(&g->core, &g->client, &g->ent, now);
	gs_feedback_init(&g->fb, dev, limit, now);
	g->slice_ns = g->core.slice_ns;
	pace_setup(g, g->core.drain_ns, false);
	g->how = HOW_STANDALONE;
}

/*
 * HOW_ORPHAN, a second after it was last asked: is there a registration
 * again?  The descriptor of the deleted one answers ENOENT for ever, so
 * the ledger opens /dev/gpushare again (at most once a second for the
 * process: another device may have done it already).
 */
static _Atomic uint64_t last_reopen;

static void reconnect(struct gate *g, int dev)
{
	struct gpushare_sched q;
	uint64_t now = mono_ns(), t = atomic_load(&last_reopen);
	int r = sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q);

	if (r && errno == ENOENT && now - t >= 1000000000ull &&
	    atomic_compare_exchange_strong(&last_reopen, &t, now) && gs_ledger_reopen() == 0)
		r = sched_op(dev, GPUSHARE_SCHED_INFO, 0, 0, &q);
	if (r == 0) {
		fprintf(stderr, "gpushare: launches on CUDA device %d are scheduled again: "
			"the container is registered\n", dev);
		g->how = HOW_MODULE;
		g->slice_ns = q.slice_ns;
		pace_setup(g, q.drain_ns, true);
		g->in_slice = false;
		atomic_store(&g->until, 0);
	} else if (not_ours(errno)) {
		refuse(g, dev, errno);
	} else {
		atomic_store(&g->until, now + 1000000000ull);
	}
}

/* ---- pacing: heartbeats and probes (pace.h) ---- */

/* Draining, paced: the forced end moves to a grace from now (bounded). */
static void heartbeat(struct gate *g)
{
	if (g->how == HOW_MODULE) {
		struct gpushare_sched q;
		sched_op((int)(g - gates), GPUSHARE_SCHED_EXTEND, 0, 0, &q);
	} else if (g->how == HOW_STANDALONE) {
		u64 until;
		gs_sched_extend(&g->core, &g->client, mono_ns(), &until);
	}
}

/* The pacer learns from the probes completed since it last looked. */
static void probes_poll(struct gate *g)
{
	int i;

	while ((i = gs_pace_oldest(&g->pace)) >= 0) {
		CUresult r = drv.event_query(g->probe[i]);
		if (r == CUDA_ERROR_NOT_READY)
			return;
		if (r != CUDA_SUCCESS) {
			gs_pace_probe_lost(&g->pace);
			g->probe_last = -1;
			continue;
		}
		uint64_t el = g->probe_last >= 0 ? span_ns(g->probe[g->probe_last], g->probe[i]) : 0;
		gs_pace_probe_done(&g->pace, mono_ns(), el);
		g->probe_last = i;
	}
}

/*
 * A probe before this launch on @s.  With GS_PACE_PENDING pending, wait for
 * the oldest first (never past the grant's end): the run-ahead is capped
 * by the GPU's real progress.
 */
static void probe_record(struct gate *g, CUstream s)
{
	int slot;

	if (!g->have_events || !drv.event_query || capturing(s))
		return;
	probes_poll(g);
	while ((slot = gs_pace_probe_slot(&g->pace)) < 0) {
		uint64_t now = mono_ns(), until = atomic_load(&g->until);
		if (now >= until)
			return;
		poll_nap(now, until);
		probes_poll(g);
	}
	if (drv.event_record(g->probe[slot], drv_stream(s)) != CUDA_SUCCESS)
		gs_pace_probe_cancel(&g->pace);
}

/*
 * Stopped with no probe pending: one at the queue's tail, so that waiting
 * for the queue ends when it really does, and an over-estimated chat
 * (which keeps the queue too short for a backlogged sample) comes down.
 */
static void probe_tail(struct gate *g, CUstream s)
{
	int slot;

	if (gs_pace_oldest(&g->pace) >= 0 || capturing(s))
		return;
	slot = gs_pace_tail_slot(&g->pace);
	if (slot >= 0 && drv.event_record(g->probe[slot], drv_stream(s)) != CUDA_SUCCESS)
		gs_pace_probe_cancel(&g->pace);
}

/* The slice's work is done (@used ns of GPU time): give the GPU back. */
static void give_back(struct gate *g, int dev, uint64_t used)
{
	if (g->how == HOW_MODULE) {
		struct gpushare_sched q;
		sched_op(dev, GPUSHARE_SCHED_RELEASE, 0, used, &q);
	} else {
		gs_sched_release(&g->core, &g->client, used, mono_ns());
	}
	g->in_slice = false;
	if (g->paced) {
		if (g->have_events)
			probes_poll(g);
		/* A drain that gave up leaves the queue (and its probes) as is. */
		if (!g->nlate) {
			gs_pace_drained(&g->pace, mono_ns());
			g->probe_last = -1;
		}
	}
}

/* A drain's bound: paced, drain_ns (kept alive by heartbeats); else a slice. */
static uint64_t drain_bound(const struct gate *g)
{
	return g->held ? g->drain_ns : g->slice_ns;
}

/*
 * The grant is over: renew it, or drain, give back and wait for the next.
 *
 * Only the module renews without draining, and only on time (within a
 * grace of the grant's end): the core charges a slice's holder for the
 * hold, and learns what the work really took only at the release, so a
 * process that queued work far past its slice (or came back long after
 * it) must drain and report it before it gets more.  Standalone, the
 * process is alone: it drains every slice, which costs the GPU one launch
 * latency per slice and keeps the queue from running ahead of the share.
 */
static void exchange(struct gate *g, int dev, bool early)
{
	bool module = g->how == HOW_MODULE;

	if (g->in_slice) {
		uint64_t until = atomic_load(&g->until);
		bool on_time = early || mono_ns() < until + g->slice_ns / 4;
		if (module && on_time && module_renew(g, dev, early))
			return;
		/*
		 * Closed until the next grant: every launch waits on the mutex
		 * (an early stop drains before the grant's end, and launches
		 * of other threads must not slip in behind the drain).
		 */
		atomic_store(&g->until, 0);
		uint64_t used = 0;
		drain(g, drain_bound(g), true, &used);
		give_back(g, dev, used);
	}
	if (module)
		module_acquire(g, dev);
	else
		standalone_acquire(g);
}

/*
 * Paced, a launch under a grant (the mutex held): may it go now?  A launch
 * whose queue would outlast the grant renews early; granted, it waits for
 * the queue to fit the new grant; refused, the process drains, gives the
 * GPU back and waits for its next turn (exchange()).  Every new grant goes
 * back through the pacer.  False: the device is no longer gated.
 */
static bool paced_launch(struct gate *g, int dev, CUstream s)
{
	bool renewed = false;

	for (;;) {
		uint64_t now = mono_ns(), until = atomic_load(&g->until);
		if (g->how != HOW_MODULE && g->how != HOW_STANDALONE)
			return false;
		if (now >= until) {
			exchange(g, dev, false);
			renewed = false;
			continue;
		}
		if (!g->in_slice)
			return true;	/* a native grant: nothing to pace */
		enum gs_pace_verdict v = gs_pace_launch(&g->pace, now, until);
		if (v == GS_PACE_STOP && g->have_events) {
			probes_poll(g);		/* the GPU may be further on */
			v = gs_pace_launch(&g->pace, now, until);
			if (v == GS_PACE_STOP)
				probe_tail(g, s);
		}
		if (v == GS_PACE_PROBE)
			probe_record(g, s);
		if (v != GS_PACE_STOP)
			return true;
		if (renewed) {
			/* Renewed, but the queue is still longer: let it run. */
			poll_nap(now, until);
			continue;
		}
		exchange(g, dev, true);
		renewed = true;
	}
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
	if (!nameable(g) || (g->nstreams && (!g->ctx || !drv.ctx_set_current ||
					     drv.ctx_set_current(g->ctx) != CUDA_SUCCESS))) {
		g->rel_skip = true;	/* the slow path drains it */
		return;
	}
	uint64_t used = 0;
	if (!drain(g, g->held ? g->drain_ns : g->slice_ns / 4, g->held, &used)) {
		/* Still working, not idle: look again a slice later. */
		g->rel_retry = mono_ns() + g->slice_ns;
		return;
	}
	give_back(g, dev, used);
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

static CUresult slow(struct gate *g, int dev, CUstream s)
{
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&g->lock);
	if (g->how == HOW_UNKNOWN)
		setup(g, dev);
	if (g->how == HOW_REFUSED) {
		r = CUDA_ERROR_NOT_PERMITTED;
	} else if (capturing(s)) {
		/* captured work does not run now */
	} else if (g->how != HOW_PASS) {
		/* Another thread may have exchanged while this one waited. */
		if (g->how == HOW_ORPHAN && mono_ns() >= atomic_load(&g->until))
			reconnect(g, dev);
		bool gated = g->how == HOW_MODULE || g->how == HOW_STANDALONE;
		if (gated && g->paced)
			gated = paced_launch(g, dev, s);
		else if (gated && mono_ns() >= atomic_load(&g->until))
			exchange(g, dev, false);
		if (g->how == HOW_REFUSED)
			r = CUDA_ERROR_NOT_PERMITTED;
		else if (g->how != HOW_PASS && g->how != HOW_ORPHAN)
			track_locked(g, s);
	}
	pthread_mutex_unlock(&g->lock);
	return r;
}

CUresult gs_sched_gate(int dev, CUstream s, bool per_thread)
{
	int m = atomic_load_explicit(&mode, memory_order_acquire);

	if (m == MODE_OFF)
		return CUDA_SUCCESS;
	if (m == MODE_UNKNOWN) {
		pthread_once(&once, choose);
		if (atomic_load(&mode) == MODE_OFF)
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
				track_locked(g, s);
				probe_record(g, s);
				pthread_mutex_unlock(&g->lock);
				return CUDA_SUCCESS;
			}
		}
		if (last.stream == s &&
		    last.gen == atomic_load_explicit(&g->gen, memory_order_relaxed))
			return CUDA_SUCCESS;
		pthread_mutex_lock(&g->lock);
		track_locked(g, s);
		pthread_mutex_unlock(&g->lock);
		return CUDA_SUCCESS;
	}
	return slow(g, dev, s);
}
