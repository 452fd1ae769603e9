// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's simulated GPU (see fake_cuda.c): the state every
 * process naming FAKECUDA_GPU_STATE shares, the clock, the streams handles
 * mean, each process's record for the fake NVML, and running a kernel.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"
#include "fake_gpu.h"

/* struct gpu_shared (fake_gpu.h): what every process naming the file shares. */
_Static_assert(MAX_DEV == FG_MAX_DEV, "one device count");
static struct gpu_shared private_gpu, *gpu = &private_gpu;
uint64_t ns_per_block = 1000;

struct CUstream_st legacy[MAX_DEV];
static _Thread_local struct CUstream_st per_thread[MAX_DEV];
_Atomic uint64_t proc_end[MAX_DEV];	/* this process's last work */
static _Atomic uint64_t proc_busy_ns;		/* its kernel time submitted */

void gpu_setup(void)
{
	const char *s = getenv("FAKECUDA_NS_PER_BLOCK");
	if (s)
		ns_per_block = strtoull(s, NULL, 10);
	for (int i = 0; i < MAX_DEV; i++)
		legacy[i].dev = i;
	s = getenv("FAKECUDA_GPU_STATE");
	if (!s || !*s)
		return;
	int fd = open(s, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat sb;
	/* Zero-filled when new; only ever grown, so racing creators agree. */
	if (fd < 0 || fstat(fd, &sb) ||
	    ((size_t)sb.st_size < sizeof(*gpu) && ftruncate(fd, sizeof(*gpu)))) {
		fprintf(stderr, "fakecuda: %s: %s\n", s, strerror(errno));
		abort();
	}
	void *p = mmap(NULL, sizeof(*gpu), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		abort();
	close(fd);
	gpu = p;
}

uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sleep_until(uint64_t t)
{
	struct timespec ts = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

void atomic_max64(_Atomic uint64_t *v, uint64_t x)
{
	uint64_t old = atomic_load(v);
	while (old < x && !atomic_compare_exchange_weak(v, &old, x))
		;
}

/*
 * The stream a handle means: NULL is the legacy default stream, or the
 * per-thread one for a _ptsz entry point; NULL when there is no context.
 */
struct CUstream_st *stream_of(CUstream s, int ptsz)
{
	int dev = cur_dev();
	if (s == CU_STREAM_PER_THREAD || (!s && ptsz)) {
		if (dev < 0)
			return NULL;
		per_thread[dev].dev = dev;
		return &per_thread[dev];
	}
	if (!s || s == CU_STREAM_LEGACY)
		return dev < 0 ? NULL : &legacy[dev];
	return s;
}

/* Device of a stream: the null and special handles mean the current one. */
int stream_dev(CUstream s)
{
	struct CUstream_st *st = stream_of(s, 0);
	return st ? st->dev : -1;
}

/*
 * This process's record in the shared file (fake_gpu.h), for the fake
 * NVML; NULL when the GPU is private (nobody else can read it).  Claimed
 * at first use (again in a forked child): a free record, or one of a
 * process that has exited.
 */
static struct fg_proc *me;
static pid_t me_pid;
static pthread_mutex_t me_lock = PTHREAD_MUTEX_INITIALIZER;	/* its writers */

static struct fg_proc *record(void)
{
	pid_t pid = getpid();

	if (gpu == &private_gpu)
		return NULL;
	if (me && me_pid == pid)
		return me;
	me = NULL;
	for (int i = 0; i < FG_PROCS && !me; i++) {
		struct fg_proc *p = &gpu->procs[i];
		int32_t old = atomic_load(&p->pid);
		if (old == pid || ((old == 0 || (kill(old, 0) && errno == ESRCH)) &&
				   atomic_compare_exchange_strong(&p->pid, &old, pid)))
			me = p;
	}
	if (!me)
		return NULL;	/* full: this process is not seen */
	me_pid = pid;
	atomic_store(&me->ctx, 0);
	for (int d = 0; d < FG_MAX_DEV; d++) {
		struct fg_runs *r = &me->dev[d];
		atomic_fetch_add(&r->seq, 1);
		atomic_store(&me->mem[d], atomic_load(&used[d]));
		atomic_store(&r->n, 0);
		atomic_store(&r->done, 0);
		atomic_fetch_add(&r->seq, 1);
	}
	return me;
}

/* Device @dev's memory in use changed: tell the record. */
void mem_note(int dev)
{
	pthread_mutex_lock(&me_lock);
	struct fg_proc *p = record();
	if (p)
		atomic_store(&p->mem[dev], atomic_load(&used[dev]));
	pthread_mutex_unlock(&me_lock);
}

/* A context on @dev: NVML lists the process there. */
void ctx_note(int dev)
{
	pthread_mutex_lock(&me_lock);
	struct fg_proc *p = record();
	if (p)
		atomic_fetch_or(&p->ctx, 1u << dev);
	pthread_mutex_unlock(&me_lock);
}

/*
 * Queue a kernel of @ns on @st: it runs when the stream and device are
 * free.  Shared, the record says when it runs (under the record's lock,
 * so that its runs are in the device's order).
 */
void gpu_run(struct CUstream_st *st, uint64_t ns)
{
	uint64_t now = now_ns(), t = max64(now, atomic_load(&st->end)), start;
	uint64_t busy = atomic_load(&gpu->busy_until[st->dev]);
	struct fg_proc *p = NULL;

	if (gpu != &private_gpu && ns) {
		pthread_mutex_lock(&me_lock);
		p = record();
		if (!p)
			pthread_mutex_unlock(&me_lock);
	}
	do {
		start = max64(busy, t);
	} while (!atomic_compare_exchange_weak(&gpu->busy_until[st->dev], &busy, start + ns));
	if (p) {
		fg_record(&p->dev[st->dev], start, start + ns, now);
		pthread_mutex_unlock(&me_lock);
	}
	atomic_max64(&st->end, start + ns);
	atomic_max64(&proc_end[st->dev], start + ns);
	atomic_fetch_add(&gpu->busy_ns[st->dev], ns);
	atomic_fetch_add(&proc_busy_ns, ns);
}

API uint64_t fakecuda_busy_ns(void)
{
	return atomic_load(&proc_busy_ns);
}

