// SPDX-License-Identifier: Apache-2.0
/*
 * A hostile tenant of the compute scheduler, for tests/test_contention.py:
 * it launches kernels on the fake driver's simulated GPU WITHOUT the gate
 * (no libgpushare.so: only the /dev/gpushare stand-in, fake_gsdev.so, is
 * preloaded) and drives GPUSHARE_IOC_SCHED itself, lying where it can.
 *
 *   hostile_sched MODE KERNEL_US SECONDS
 *
 * Each turn: ACQUIRE (blocking), then launch KERNEL_US kernels while now is
 * before the grant's end, at most Q queued (COMPUTE_LOAD_IN_FLIGHT, default
 * 64; a batch: when Q are queued it waits for all of them, polling, never
 * past the grant's end).  At the grant's end, by MODE:
 *
 *   honest  wait for its work (drain), RELEASE with the GPU time the turn's
 *           work took (the kernel time it submitted since the grant)
 *   zero    drain, RELEASE with used_ns 0
 *   max     drain, RELEASE with used_ns 2^64 - 1
 *   x10     drain, RELEASE with ten times the honest figure
 *   extend  a hog: go on launching past the grant's end, sending EXTEND
 *           every EXTEND_NS, until its queue would just drain by the drain's
 *           bound (drain_ns past the grant's end); drain, still sending
 *           EXTEND, and RELEASE honest (inside the bound: nothing is late)
 *   early   RELEASE with used_ns 0 at once, without draining (its queued
 *           tail runs on in the next holder's turn), and ask again
 *
 * Environment: COMPUTE_LOAD_T0 and COMPUTE_LOAD_IN_FLIGHT as for
 * compute_load.  The last line is compute_load's RESULT (gpu_ns: the kernel
 * time it ran, all completed; wall_ns; launches; kernels) plus turns,
 * extends (EXTEND calls granted), gputime_ns (what the scheduler charged
 * the container, its last answer) and forced_ends (the GPU's slices ended
 * by force, its last answer; -1 when the module did not say: ABI 3).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <gpushare.h>

#include "cuda_abi.h"

#define IN_FLIGHT 64			/* default queue depth */
#define POLL_NS 100000u			/* how often a batch's end is looked for */
#define EXTEND_NS 1000000u		/* heartbeats while it hogs */

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
uint64_t fakecuda_busy_ns(void);	/* the fake's: kernel time submitted */

enum mode { HONEST, ZERO, MAX, X10, EXTEND, EARLY };
static const char *const modes[] = { "honest", "zero", "max", "x10", "extend", "early" };

static int fd;
static CUstream s;
static unsigned int us, depth = IN_FLIGHT;
static uint64_t launches, queued, extends;
static struct gpushare_sched last;	/* the scheduler's last answer */

static char kernel_code;		/* the fake runs any non-NULL function */
#define KERNEL ((CUfunction)(void *)&kernel_code)

static void check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "hostile_sched: %s: error %d\n", what, r);
		exit(1);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
	nanosleep(&ts, NULL);
}

/* One SCHED call: 0, or the errno (EAGAIN is an answer, the rest fatal). */
static int sched(uint32_t op, uint32_t flags, uint64_t used_ns)
{
	struct gpushare_sched q;
	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.op = op;
	q.flags = flags;
	q.used_ns = used_ns;
	q.forced_ends = UINT64_MAX;	/* an ABI 3 module leaves it so */
	while (ioctl(fd, GPUSHARE_IOC_SCHED, &q)) {
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || (errno == EINVAL && op == GPUSHARE_SCHED_EXTEND))
			return errno;
		fprintf(stderr, "hostile_sched: SCHED op %u: %s\n", op, strerror(errno));
		exit(1);
	}
	last = q;
	return 0;
}

/* Launch one kernel unless Q are queued and still running; 1 if it did. */
static int launch_one(void)
{
	if (queued >= depth) {
		CUresult r = cuStreamQuery(s);
		if (r == CUDA_ERROR_NOT_READY) {
			nap(POLL_NS);
			return 0;
		}
		check(r, "cuStreamQuery");
		queued = 0;
	}
	check(cuLaunchKernel(KERNEL, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL), "cuLaunchKernel");
	launches++;
	queued++;
	return 1;
}

static void drain(void)
{
	check(cuStreamSynchronize(s), "cuStreamSynchronize");
	queued = 0;
}

/* One turn on the GPU, in @mode, ending no later than @end (the run's). */
static void turn(enum mode mode, uint64_t end)
{
	sched(GPUSHARE_SCHED_ACQUIRE, 0, 0);
	uint64_t until = last.until, busy0 = fakecuda_busy_ns(), beat = 0;
	while (now_ns() < until && now_ns() < end)
		launch_one();
	if (mode == EXTEND) {
		/* Submit until its queue would just drain by the bound, then drain. */
		uint64_t tail = (uint64_t)depth * us * 1000u + EXTEND_NS;
		uint64_t stop = until + last.drain_ns > tail ? until + last.drain_ns - tail : 0;
		for (uint64_t t; (t = now_ns()) < end;) {
			if (t >= beat + EXTEND_NS) {
				if (sched(GPUSHARE_SCHED_EXTEND, 0, 0))
					break;	/* at the bound (or an old module) */
				extends++;
				beat = t;
			}
			if (t < stop)
				launch_one();
			else if (cuStreamQuery(s) == CUDA_SUCCESS)
				break;
			else
				nap(POLL_NS);
		}
	}
	if (mode == EARLY) {
		sched(GPUSHARE_SCHED_RELEASE, 0, 0);
		return;
	}
	drain();
	uint64_t used = fakecuda_busy_ns() - busy0;
	if (mode == ZERO)
		used = 0;
	else if (mode == MAX)
		used = UINT64_MAX;
	else if (mode == X10)
		used *= 10;
	sched(GPUSHARE_SCHED_RELEASE, 0, used);
}

int main(int argc, char **argv)
{
	int mode = -1;
	if (argc >= 4)
		for (int i = 0; i < (int)(sizeof(modes) / sizeof(modes[0])); i++)
			if (!strcmp(argv[1], modes[i]))
				mode = i;
	if (mode < 0) {
		fprintf(stderr, "usage: hostile_sched honest|zero|max|x10|extend|early "
				"KERNEL_US SECONDS\n");
		return 2;
	}
	us = (unsigned int)strtoul(argv[2], NULL, 10);
	uint64_t run_ns = (uint64_t)(strtod(argv[3], NULL) * 1e9);
	const char *t0s = getenv("COMPUTE_LOAD_T0"), *qs = getenv("COMPUTE_LOAD_IN_FLIGHT");
	if (qs && *qs)
		depth = (unsigned int)strtoul(qs, NULL, 10);
	if (!us || !depth) {
		fprintf(stderr, "hostile_sched: KERNEL_US and COMPUTE_LOAD_IN_FLIGHT must be > 0\n");
		return 2;
	}

	CUcontext ctx;
	check(cuInit(0), "cuInit");
	check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	check(cuStreamCreate(&s, 0), "cuStreamCreate");
	fd = open("/dev/" GPUSHARE_DEV_NAME, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("hostile_sched: /dev/" GPUSHARE_DEV_NAME);
		return 1;
	}
	if (t0s) {
		uint64_t t0 = strtoull(t0s, NULL, 10);
		struct timespec ts = { (time_t)(t0 / 1000000000u), (long)(t0 % 1000000000u) };
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	uint64_t busy0 = fakecuda_busy_ns(), start = now_ns(), turns = 0;
	while (now_ns() - start < run_ns) {
		turn((enum mode)mode, start + run_ns);
		turns++;
	}
	drain();
	uint64_t wall = now_ns() - start, gpu = fakecuda_busy_ns() - busy0;
	sched(GPUSHARE_SCHED_INFO, 0, 0);
	close(fd);
	printf("RESULT {\"path\": \"%s\", \"lookup\": \"hostile\", \"gpu_ns\": %llu, "
	       "\"wall_ns\": %llu, \"launches\": %llu, \"kernels\": %llu, \"in_flight\": %u, "
	       "\"turns\": %llu, \"extends\": %llu, \"gputime_ns\": %llu, "
	       "\"forced_ends\": %lld}\n",
	       modes[mode], (unsigned long long)gpu, (unsigned long long)wall,
	       (unsigned long long)launches, (unsigned long long)launches, depth,
	       (unsigned long long)turns, (unsigned long long)extends,
	       (unsigned long long)last.gputime_ns,
	       last.forced_ends == UINT64_MAX ? -1LL : (long long)last.forced_ends);
	return 0;
}
