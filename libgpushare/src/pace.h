/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gate's pacer: keeps what a process has queued on the GPU at a grant's
 * end short, so that its work ends inside its own hold and the next holder
 * runs alone.  Pure logic (no driver, no clock): every call is given the
 * time, so the same pace.c runs in libgpushare.so and in the scheduler's
 * simulated-time tests (kmod/tests).
 *
 * The model.  Each launch adds chat ns (the estimated GPU time of one
 * launch) to vfin, the estimated end of the queued work (from now if the
 * queue is empty).  A launch that would end past the grant's end stops
 * (the gate then renews early, or drains and gives the GPU back), unless
 * nothing is queued: a launch longer than a slice still runs, once.
 * chat is learnt from probes: an event recorded every quarter slice of
 * estimated work (while chat is unknown, after 1, 2, 4 ... 64 launches).
 * Two probes' elapsed time over the launches between them is a sample
 * only when the second was recorded while the first was still pending
 * (the GPU was busy all along: idle time would inflate the estimate, and
 * an over-estimate starves a lone process); otherwise it is an upper
 * bound, used only to bring an over-estimate down.  When the pacer stops
 * with no probe pending, the gate records one at the queue's tail
 * (gs_pace_tail_slot()): its wait then ends when the queue really does,
 * and the tail times the last launches even when the queue was too short
 * for a backlogged sample.  A probe's completion re-anchors vfin on the
 * GPU's real progress.  At most GS_PACE_PENDING probes are pending: a
 * further one waits for the oldest (the gate polls it, never past the
 * grant's end), which caps the run-ahead by the GPU's progress even when
 * chat is wrong.
 *
 * The estimate changes throughput and latency, never a share: shares come
 * from the scheduler charging holds.  An under-estimate lengthens the
 * drain (charged to the holder), an over-estimate stops a little early.
 *
 * Locking: gs_pace_launch() is lock-free (any thread); the probe calls are
 * made under the caller's lock, one thread at a time.
 */
#ifndef GPUSHARE_PACE_H
#define GPUSHARE_PACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GS_PACE_PENDING 2	/* probes pending at most */
#define GS_PACE_SLOTS (GS_PACE_PENDING + 1)

enum gs_pace_verdict {
	GS_PACE_GO,		/* launch */
	GS_PACE_PROBE,		/* launch, then record a probe (gs_pace_probe_slot()) */
	GS_PACE_STOP,		/* do not launch yet: the queue would outlast the grant */
};

struct gs_pace_probe {
	uint64_t n;		/* launches counted when it was recorded */
	bool backlogged;	/* an older probe was pending then */
};

struct gs_pace {
	_Atomic uint64_t vfin;		/* estimated end of the queued work, ns */
	_Atomic uint64_t chat;		/* estimated GPU ns per launch, 0: unknown */
	_Atomic uint64_t launches;	/* counted launches */
	_Atomic uint64_t next_probe;	/* launch count due for a probe */
	/* Written under the caller's lock, read by gs_pace_launch(): atomic. */
	_Atomic uint64_t slice_ns;
	_Atomic uint64_t boot;		/* launches between probes while chat is unknown */
	/* Under the caller's lock: probes in record order, oldest first. */
	struct gs_pace_probe probe[GS_PACE_SLOTS];
	unsigned int first, pending;	/* ring of pending probes */
	bool have_last;			/* a completed probe to time from */
	uint64_t last_n;		/* its launch count */
};

void gs_pace_init(struct gs_pace *p, uint64_t slice_ns, uint64_t now);

/* A launch at @now under a grant until @until. */
enum gs_pace_verdict gs_pace_launch(struct gs_pace *p, uint64_t now, uint64_t until);

/*
 * After GS_PACE_PROBE: the ring slot (0..GS_PACE_SLOTS-1) to record the
 * probe's event in, or -1 when GS_PACE_PENDING are pending (wait for the
 * oldest first: gs_pace_oldest()).
 */
int gs_pace_probe_slot(struct gs_pace *p);

/* The probe just given a slot could not be recorded: forget it. */
void gs_pace_probe_cancel(struct gs_pace *p);

/*
 * At a STOP with no probe pending: the slot of a probe recorded after every
 * counted launch (the queue's tail; no launch goes with it), -1 if none is
 * free.  Waiting on it ends when the queue really ends, and it times the
 * launches since the last probe, so an over-estimated chat (which keeps the
 * queue too short to ever give a backlogged sample) comes down.
 */
int gs_pace_tail_slot(struct gs_pace *p);

/* The oldest pending probe's slot, -1 if none. */
int gs_pace_oldest(const struct gs_pace *p);

/*
 * The oldest pending probe completed by @now; @elapsed_ns: its time since
 * the last completed probe, 0 if unknown (none, or not measurable).
 */
void gs_pace_probe_done(struct gs_pace *p, uint64_t now, uint64_t elapsed_ns);

/* The oldest pending probe failed: forget it (no sample, no anchor). */
void gs_pace_probe_lost(struct gs_pace *p);

/* Everything queued has ended by @now (a drain): the queue is empty. */
void gs_pace_drained(struct gs_pace *p, uint64_t now);

/* The slice length changed. */
void gs_pace_set_slice(struct gs_pace *p, uint64_t slice_ns);

#endif /* GPUSHARE_PACE_H */
