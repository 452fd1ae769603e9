/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake GPU's per-process record, in the simulated GPU's shared file
 * (FAKECUDA_GPU_STATE): written by the fake driver (fake_cuda_gpu.c) of each
 * process for itself, read by the fake NVML (fake_nvml.c) of any process,
 * as the real NVML reads the real driver's.
 *
 * Per process and device: whether it has a context there, the bytes it
 * has allocated, and the kernel time the device has *executed* for it.
 * The device is FIFO, so a process's kernels on it run one after another
 * in submission order, each [start, end) known at submission: they are
 * kept as runs (adjacent kernels merged), and executed(t) is the part of
 * them before t.  Runs that ended more than FG_KEEP_NS ago are folded into
 * one total, so NVML can look back as far as that, exactly.  More runs
 * pending than FG_RUNS: the oldest is folded early (counted as done).
 *
 * Each record has one writer, its process (its threads serialise on a
 * mutex of their own); readers in other processes take a consistent copy
 * with the record's sequence number (odd while it is written), and give
 * up after a few tries (a writer killed mid-write: the record is skipped).
 */
#ifndef FAKE_GPU_H
#define FAKE_GPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define FG_MAX_DEV 8
#define FG_PROCS 32
#define FG_RUNS 256
#define FG_KEEP_NS 2000000000ull

struct fg_runs {
	_Atomic uint32_t seq;		/* odd while its process writes */
	_Atomic uint32_t head, n;	/* the ring of runs not folded */
	_Atomic uint64_t done;		/* kernel time of the runs folded */
	_Atomic uint64_t start[FG_RUNS], end[FG_RUNS];
};

struct fg_proc {
	_Atomic int32_t pid;		/* 0: a free record */
	_Atomic uint32_t ctx;		/* bit d: it made a context on device d */
	_Atomic uint64_t mem[FG_MAX_DEV];	/* bytes allocated */
	struct fg_runs dev[FG_MAX_DEV];
};

/* What every process naming the same FAKECUDA_GPU_STATE shares. */
struct gpu_shared {
	_Atomic uint64_t busy_until[FG_MAX_DEV];	/* the device's last kernel ends */
	_Atomic uint64_t busy_ns[FG_MAX_DEV];		/* kernel time it ran, in all */
	struct fg_proc procs[FG_PROCS];
};

static inline uint64_t fg_min(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Writer: fold the ring's front into done while it ended before @before. */
static inline void fg_fold(struct fg_runs *r, uint64_t before, bool one)
{
	uint32_t h = atomic_load(&r->head), n = atomic_load(&r->n);

	while (n && (one || atomic_load(&r->end[h]) <= before)) {
		atomic_fetch_add(&r->done, atomic_load(&r->end[h]) - atomic_load(&r->start[h]));
		h = (h + 1) % FG_RUNS;
		n--;
		one = false;
	}
	atomic_store(&r->head, h);
	atomic_store(&r->n, n);
}

/* Writer (its process's lock held): a kernel ran [@start, @end) at @now. */
static inline void fg_record(struct fg_runs *r, uint64_t start, uint64_t end, uint64_t now)
{
	uint32_t n, last;

	if (end <= start)
		return;
	atomic_fetch_add(&r->seq, 1);
	if (now > FG_KEEP_NS)
		fg_fold(r, now - FG_KEEP_NS, false);
	n = atomic_load(&r->n);
	last = (atomic_load(&r->head) + n + FG_RUNS - 1) % FG_RUNS;
	if (n && atomic_load(&r->end[last]) == start) {
		atomic_store(&r->end[last], end);	/* adjacent: one run */
	} else {
		if (n == FG_RUNS)
			fg_fold(r, 0, true);
		n = atomic_load(&r->n);
		last = (atomic_load(&r->head) + n) % FG_RUNS;
		atomic_store(&r->start[last], start);
		atomic_store(&r->end[last], end);
		atomic_store(&r->n, n + 1);
	}
	atomic_fetch_add(&r->seq, 1);
}

/*
 * Reader: the kernel time executed by @t0 and by @t1 (@t0 <= @t1, both
 * within FG_KEEP_NS of now).  false: no consistent copy.
 */
static inline bool fg_executed(struct fg_runs *r, uint64_t t0, uint64_t t1, uint64_t *e0,
			       uint64_t *e1)
{
	for (int tries = 0; tries < 100; tries++) {
		uint32_t seq = atomic_load(&r->seq);
		if (seq & 1)
			continue;
		uint64_t a = atomic_load(&r->done), b = a;
		uint32_t h = atomic_load(&r->head), n = atomic_load(&r->n);
		for (uint32_t i = 0; i < n && i < FG_RUNS; i++) {
			uint32_t k = (h + i) % FG_RUNS;
			uint64_t s = atomic_load(&r->start[k]), e = atomic_load(&r->end[k]);
			if (t0 > s)
				a += fg_min(t0, e) - s;
			if (t1 > s)
				b += fg_min(t1, e) - s;
		}
		if (atomic_load(&r->seq) == seq) {
			*e0 = a;
			*e1 = b;
			return true;
		}
	}
	return false;
}

#endif /* FAKE_GPU_H */
