// SPDX-License-Identifier: Apache-2.0
/*
 * The feedback's source (feedback.h): this process's GPU time from NVML's
 * per-process utilisation samples (nvmlDeviceGetProcessUtilization: for
 * each process with some utilisation, smUtil percent of each sampling
 * period, time-stamped in CLOCK_REALTIME microseconds at its end).  Real
 * NVML is dlopen("libnvidia-ml.so.1") and the real dlsym (gs_real_dlsym),
 * as in nvml.c: none of these entry points is one of ours.
 *
 * The device: by its UUID, the one the ledger learnt from the driver for
 * the CUDA ordinal (CUDA_VISIBLE_DEVICES and the like renumber ordinals,
 * not UUIDs).
 *
 * The pid.  NVML numbers processes as the driver sees them, from the
 * initial PID namespace; inside a container's PID namespace getpid() is
 * another number, and nothing in the process tells the host's.  (NSpid in
 * /proc/self/status does not either: its entries start at the namespace
 * of the procfs mounted on /proc, the container's own in a container.)
 *  1. In the initial PID namespace (/proc/self/ns/pid is the kernel's fixed
 *     PROC_PID_INIT_INO) and listed by NVML on the device: getpid().
 *  2. Otherwise a probe: NVML's list of the device's processes with their
 *     memory, then PROBE_BYTES allocated through the real driver (not the
 *     wrapper: no quota is charged), the list again, freed, the list
 *     again.  Ours is the one process whose memory rose by at least the
 *     probe and fell back by as much; none or several (another process
 *     allocating at the same instant, memory NVML does not report): asked
 *     again later, then off.
 * No environment variable names the pid (nri_gpushare sets none): a
 * process's host pid does not exist when the container's environment is
 * made, and the environment is the tenant's to set, so a variable would
 * let a tenant name any process.  The probe trusts only what the driver
 * reports.  A wrong pid measures another process's time: a busier one
 * raises rho and lowers the weight (slower); an idle one shows nothing
 * while this process is charged, which turns the feedback off (the limit
 * again); only one busy at a lower rate than this process would raise the
 * weight (up to 100, no more than removing the limit), and the probe picks
 * it only if it allocates and frees as much in the same milliseconds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "cuda_driver.h"
#include "env.h"
#include "feedback.h"
#include "interpose.h"
#include "ledger.h"
#include "nvml_abi.h"
#include "thread.h"

#define PROC_PID_INIT_INO 0xEFFFFFFCu	/* the initial PID namespace's inode */
#define PROBE_BYTES (32ull << 20)
#define MAX_PROCS 256
#define MAX_SAMPLES 256

typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, void *);

static struct {
	bool ok;
	nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
	nvmlReturn_t (*util)(nvmlDevice_t, nvml_sample_t *, unsigned int *, unsigned long long);
	procs_fn procs;
	bool procs_v2;			/* _v3 or _v2: the longer entry */
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*free)(CUdeviceptr);
	CUresult (*ctx_device)(CUdevice *);
} nv;

/*
 * NVML is loaded (dlopen, nvmlInit: up to seconds on a real GPU) by a
 * thread of its own, started by the first gs_fb_source_ready(), so that
 * no launch waits for it; its state is published when it is done.
 */
enum { NV_NONE, NV_LOADING, NV_OK, NV_FAILED };
static _Atomic int nv_state;

static void load(void)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	nvmlReturn_t (*init)(void);

	if (!h)
		return;
	init = (nvmlReturn_t (*)(void))gs_real_dlsym(h, "nvmlInit_v2");
	nv.by_uuid = (__typeof__(nv.by_uuid))gs_real_dlsym(h, "nvmlDeviceGetHandleByUUID");
	nv.util = (__typeof__(nv.util))gs_real_dlsym(h, "nvmlDeviceGetProcessUtilization");
	nv.procs_v2 = true;
	nv.procs = (procs_fn)gs_real_dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!nv.procs)
		nv.procs = (procs_fn)gs_real_dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
	if (!nv.procs) {
		nv.procs_v2 = false;
		nv.procs = (procs_fn)gs_real_dlsym(h, "nvmlDeviceGetComputeRunningProcesses");
	}
	nv.alloc = (__typeof__(nv.alloc))gs_driver_sym("cuMemAlloc_v2");
	nv.free = (__typeof__(nv.free))gs_driver_sym("cuMemFree_v2");
	nv.ctx_device = (__typeof__(nv.ctx_device))gs_driver_sym("cuCtxGetDevice");
	/* NVML stays initialised for the process's life (it counts inits). */
	nv.ok = init && nv.by_uuid && nv.util && nv.procs && init() == NVML_SUCCESS;
}

static void *loader(void *arg)
{
	(void)arg;
	load();
	atomic_store(&nv_state, nv.ok ? NV_OK : NV_FAILED);
	return NULL;
}

/* A fork during the load: the child loads again (the thread is not there). */
static void child_after_fork(void)
{
	int s = NV_LOADING;

	atomic_compare_exchange_strong(&nv_state, &s, NV_NONE);
}

__attribute__((constructor)) static void nvml_feedback_setup(void)
{
	pthread_atfork(NULL, NULL, child_after_fork);
}

int gs_fb_source_ready(void)
{
	int s = NV_NONE;

	if (atomic_compare_exchange_strong(&nv_state, &s, NV_LOADING)) {
		if (gs_thread_start(loader, NULL, 0))
			atomic_store(&nv_state, NV_FAILED);
		s = atomic_load(&nv_state);
	}
	return s == NV_OK ? 1 : s == NV_FAILED ? -1 : 0;
}

/* A list of the device's processes. */
struct procs {
	int n;
	unsigned int pid[MAX_PROCS];
	unsigned long long mem[MAX_PROCS];	/* NVML_VALUE_NOT_AVAILABLE: unknown */
	union {
		nvml_proc_v1_t v1[MAX_PROCS];
		nvml_proc_v2_t v2[MAX_PROCS];
	} raw;
};

static bool list(nvmlDevice_t d, struct procs *l)
{
	unsigned int n = MAX_PROCS;

	if (nv.procs(d, &n, &l->raw) != NVML_SUCCESS || n > MAX_PROCS)
		return false;
	for (unsigned int i = 0; i < n; i++) {
		l->pid[i] = nv.procs_v2 ? l->raw.v2[i].pid : l->raw.v1[i].pid;
		l->mem[i] = nv.procs_v2 ? l->raw.v2[i].usedGpuMemory : l->raw.v1[i].usedGpuMemory;
	}
	l->n = (int)n;
	return true;
}

/* @pid's place in @l, or -1. */
static int find(const struct procs *l, unsigned int pid)
{
	for (int i = 0; i < l->n; i++)
		if (l->pid[i] == pid)
			return i;
	return -1;
}

static bool init_pid_ns(void)
{
	char want[32], got[32] = "";
	ssize_t n = readlink("/proc/self/ns/pid", got, sizeof(got) - 1);

	snprintf(want, sizeof(want), "pid:[%u]", PROC_PID_INIT_INO);
	return n > 0 && strcmp(got, want) == 0;
}

/* The probe (above) with three lists' room: the pid, 0 when it cannot tell. */
static uint32_t probe(const struct gs_feedback *f, nvmlDevice_t d, struct procs l[3])
{
	CUdeviceptr ptr;
	CUdevice cur;
	uint32_t found = 0;

	/* The allocation goes to the current context's device: it must be ours. */
	if (!nv.alloc || !nv.free || !nv.ctx_device || nv.ctx_device(&cur) != CUDA_SUCCESS ||
	    cur != f->dev)
		return 0;
	if (!list(d, &l[0]) || nv.alloc(&ptr, PROBE_BYTES) != CUDA_SUCCESS)
		return 0;
	bool ok = list(d, &l[1]);
	nv.free(ptr);
	if (!ok || !list(d, &l[2]))
		return 0;
	for (int i = 0; i < l[1].n; i++) {
		int b = find(&l[0], l[1].pid[i]), a = find(&l[2], l[1].pid[i]);
		unsigned long long up = l[1].mem[i], before = b < 0 ? 0 : l[0].mem[b];
		if (a < 0 || up == NVML_VALUE_NOT_AVAILABLE || before == NVML_VALUE_NOT_AVAILABLE ||
		    l[2].mem[a] == NVML_VALUE_NOT_AVAILABLE)
			continue;
		if (up < before + PROBE_BYTES || up < l[2].mem[a] + PROBE_BYTES)
			continue;
		if (found)
			return 0;		/* two: cannot tell */
		found = l[1].pid[i];
	}
	return found;
}

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int gs_fb_source_open(struct gs_feedback *f)
{
	char uuid[GS_UUID_MAX];
	nvmlDevice_t d = f->priv;
	uint32_t me = (uint32_t)getpid();
	struct procs *l;

	if (atomic_load(&nv_state) != NV_OK)
		return -1;
	if (!d) {
		gs_cuda_attach(f->dev);
		if (!gs_ledger_uuid(f->dev, uuid) || nv.by_uuid(uuid, &d) != NVML_SUCCESS)
			return -1;
		f->priv = d;
	}
	l = malloc(3 * sizeof(*l));
	if (!l)
		return 0;
	if (!(init_pid_ns() && list(d, &l[0]) && find(&l[0], me) >= 0))
		me = probe(f, d, l);
	free(l);
	if (!me)
		return 0;
	f->pid = me;
	f->cursor = clock_ns(CLOCK_REALTIME) / 1000;	/* samples from now on */
	return 1;
}

int gs_fb_source_poll(struct gs_feedback *f, struct gs_fb_sample *out, int max,
		      uint64_t *newest)
{
	nvml_sample_t buf[MAX_SAMPLES], *s = buf;
	unsigned int n = MAX_SAMPLES;
	nvmlReturn_t r = nv.util(f->priv, s, &n, f->cursor);
	unsigned long long top = f->cursor;
	int k = 0;

	if (r == NVML_ERROR_INSUFFICIENT_SIZE && n > MAX_SAMPLES && n < 65536 &&
	    (s = malloc(n * sizeof(*s))))
		r = nv.util(f->priv, s, &n, f->cursor);
	if (r == NVML_ERROR_NOT_FOUND) {
		n = 0;		/* nothing new */
	} else if (r != NVML_SUCCESS) {
		if (s != buf)
			free(s);
		return -1;
	}
	/* NVML's clock is CLOCK_REALTIME, in microseconds. */
	uint64_t off = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
	for (unsigned int i = 0; i < n; i++) {
		if (s[i].timeStamp <= f->cursor)
			continue;
		if (s[i].timeStamp > top)
			top = s[i].timeStamp;
		if (s[i].pid != f->pid)
			continue;
		if (s[i].timeStamp * 1000 <= off)
			continue;	/* not a time */
		/* In time order (NVML does not promise one); beyond @max, the newest. */
		uint64_t at = s[i].timeStamp * 1000 - off;
		if (k == max) {
			memmove(out, out + 1, (size_t)(max - 1) * sizeof(*out));
			k--;
		}
		int j = k++;
		while (j > 0 && out[j - 1].at > at) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = (struct gs_fb_sample){ .util = s[i].smUtil, .at = at };
	}
	if (s != buf)
		free(s);
	*newest = top > f->cursor ? top * 1000 - off : 0;
	f->cursor = top;
	return k;
}
