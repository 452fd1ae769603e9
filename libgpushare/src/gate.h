/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute gate's insides (sched_gate.h is its interface): a device's
 * state in this process, and what the gate's files share.
 *
 *   gate.c            the environment, the mode, the launch path
 *   gate_grant.c      how a device is gated; grants, exchanges, giving back
 *   gate_module.c     module mode: GPUSHARE_IOC_SCHED
 *   gate_standalone.c standalone mode: the core, this process its only client
 *   gate_pace.c       pacing: heartbeats, probes, the paced launch
 *   gate_drain.c      the slice's streams, their events, drains
 *   gate_releaser.c   the thread that gives back slices left idle
 */
#ifndef GPUSHARE_GATE_H
#define GPUSHARE_GATE_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <uapi/gpushare.h>
#include <gs_sched.h>

#include "cuda_abi.h"
#include "env.h"
#include "feedback.h"
#include "pace.h"

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

/* The environment, read at the first launch (gate.c). */
struct gate_config {
	bool debug;
	bool pace_on;			/* GPUSHARE_SCHED_PACE is not 0 */
	int nuuids, nlimits;
	char uuids[GS_MAX_GPUS][GS_UUID_MAX];
	uint32_t limits[GS_MAX_GPUS];
};

/* What the last launch of this thread found: skips the lookups next time. */
struct gate_last {
	CUcontext ctx;		/* current context ... */
	int dev;		/* ... and its device */
	CUstream stream;	/* tracked in slice gen */
	uint64_t gen;
};

/* The driver's entry points the gate calls (loaded at the first launch). */
struct gate_driver {
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
};

/* gate.c */
extern struct gate gates[MAX_DEVICES];
extern _Atomic int gate_mode;		/* enum mode */
extern struct gate_config gate_cfg;
extern TLS struct gate_last gate_last;
extern struct gate_driver gate_drv;

/* CLOCK_MONOTONIC, in ns: the module's clock too. */
static inline uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = (time_t)(t / 1000000000ull),
			       .tv_nsec = (long)(t % 1000000000ull) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* A polling wait's step: 0.1 ms from @now, never past @end (> @now). */
static inline void poll_nap(uint64_t now, uint64_t end)
{
	sleep_until(end - now < 100000 ? end : now + 100000);
}

/* gate_grant.c */
void gate_setup(struct gate *g, int dev);
void gate_granted(struct gate *g, uint64_t until, bool in_slice);
void gate_pass(struct gate *g);
void gate_exchange(struct gate *g, int dev, bool early);
void gate_give_back(struct gate *g, int dev, uint64_t used);

/* gate_module.c */
int gate_sched_op(int dev, uint32_t op, uint32_t flags, uint64_t used,
		  struct gpushare_sched *q);
bool gate_module_setup(struct gate *g, int dev);
bool gate_module_renew(struct gate *g, int dev, bool early);
void gate_module_acquire(struct gate *g, int dev);
void gate_reconnect(struct gate *g, int dev);

/* gate_standalone.c */
void gate_standalone_setup(struct gate *g, int dev);
void gate_standalone_acquire(struct gate *g);

/* gate_pace.c */
void gate_pace_setup(struct gate *g, uint64_t drain_ns, bool pacer);
void gate_heartbeat(struct gate *g);
void gate_probes_poll(struct gate *g);
void gate_probe_record(struct gate *g, CUstream s);
bool gate_paced_launch(struct gate *g, int dev, CUstream s);

/* gate_drain.c */
CUstream gate_drv_stream(CUstream s);
bool gate_capturing(CUstream s);
void gate_track_locked(struct gate *g, CUstream s);
uint64_t gate_span_ns(CUevent a, CUevent b);
bool gate_nameable(const struct gate *g);
bool gate_drain(struct gate *g, uint64_t bound, bool keep, uint64_t *used_out);

/* gate_releaser.c */
void gate_releaser_reset(void);
void gate_releaser_kick(void);

#endif /* GPUSHARE_GATE_H */
