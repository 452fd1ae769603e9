// SPDX-License-Identifier: Apache-2.0
/*
 * The fake NVML's processes (see fake_nvml.c): the running processes and
 * their utilisation samples, from the fake CUDA driver's records in the
 * simulated GPU's shared file (fake_gpu.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"
#include "fake_nvml.h"

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

#define BUFFER_NS 1500000000ull		/* the driver's sample buffer */
#define MAX_SAMPLES (FG_PROCS * 64)

static pthread_once_t procs_once = PTHREAD_ONCE_INIT;
static unsigned int pid_offset;
static uint64_t period_ns = 166667000ull;
static int64_t realtime_off;		/* CLOCK_REALTIME - CLOCK_MONOTONIC, ns */
static struct gpu_shared *_Atomic shared;

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void procs_setup(void)
{
	const char *s = getenv("FAKENVML_PID_OFFSET");

	if (s)
		pid_offset = (unsigned int)strtoul(s, NULL, 10);
	s = getenv("FAKENVML_SAMPLE_US");
	if (s && strtoull(s, NULL, 10) >= 1000)
		period_ns = strtoull(s, NULL, 10) * 1000;
	/* Fixed once: a sample keeps its time stamp from call to call. */
	realtime_off = (int64_t)(clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC));
}

/* The shared file, once the fake driver has made it (NULL: none). */
static struct gpu_shared *gpu_file(void)
{
	struct gpu_shared *g = atomic_load(&shared);
	const char *path = getenv("FAKECUDA_GPU_STATE");
	struct stat sb;
	int fd;

	pthread_once(&procs_once, procs_setup);
	if (g || !path || !*path)
		return g;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(*g)) {
		void *p = mmap(NULL, sizeof(*g), PROT_READ, MAP_SHARED, fd, 0);
		struct gpu_shared *none = NULL;
		if (p != MAP_FAILED && !atomic_compare_exchange_strong(&shared, &none, p))
			munmap(p, sizeof(*g));
	}
	close(fd);
	return atomic_load(&shared);
}

/* The device's index, or -1. */
static int dev_index(nvmlDevice_t d)
{
	return dev_of(d) ? (int)(d - devices) : -1;
}

static bool alive(int32_t pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* Processes with a context on @device: fill @pids/@mem up to @max; the count. */
static nvmlReturn_t running(nvmlDevice_t device, unsigned int *pids,
			    unsigned long long *mem, unsigned int max, unsigned int *n)
{
	struct gpu_shared *g;
	int d = dev_index(device);

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (d < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = 0;
	g = gpu_file();
	for (int i = 0; g && i < FG_PROCS; i++) {
		const struct fg_proc *p = &g->procs[i];
		int32_t pid = atomic_load(&p->pid);
		if (!(atomic_load(&p->ctx) & (1u << d)) || !alive(pid))
			continue;
		if (*n < max) {
			pids[*n] = (unsigned int)pid + pid_offset;
			mem[*n] = atomic_load(&p->mem[d]);
		}
		(*n)++;
	}
	return NVML_SUCCESS;
}

#define RUNNING(name, type, extra)						\
API nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, type *infos)	\
{										\
	unsigned int pids[FG_PROCS], n;						\
	unsigned long long mem[FG_PROCS];					\
	nvmlReturn_t r;								\
										\
	if (!count || (*count && !infos))					\
		return NVML_ERROR_INVALID_ARGUMENT;				\
	r = running(device, pids, mem, FG_PROCS, &n);				\
	if (r != NVML_SUCCESS)							\
		return r;							\
	if (n > *count) {							\
		*count = n;							\
		return NVML_ERROR_INSUFFICIENT_SIZE;				\
	}									\
	for (unsigned int i = 0; i < n; i++) {					\
		memset(&infos[i], 0, sizeof(infos[i]));				\
		infos[i].pid = pids[i];						\
		infos[i].usedGpuMemory = mem[i];				\
		extra;								\
	}									\
	*count = n;								\
	return NVML_SUCCESS;							\
}

RUNNING(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)
RUNNING(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t,
	infos[i].gpuInstanceId = infos[i].computeInstanceId = ~0u)
RUNNING(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t,
	infos[i].gpuInstanceId = infos[i].computeInstanceId = ~0u)

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
						 nvmlProcessUtilizationSample_t *utilization,
						 unsigned int *count,
						 unsigned long long lastSeenTimeStamp)
{
	static nvmlProcessUtilizationSample_t out[MAX_SAMPLES];	/* under lock */
	struct gpu_shared *g;
	int d = dev_index(device);
	unsigned int n = 0;
	nvmlReturn_t r = NVML_SUCCESS;

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (d < 0 || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	g = gpu_file();
	uint64_t now = clock_ns(CLOCK_MONOTONIC), hi = now / period_ns;
	uint64_t depth = BUFFER_NS / period_ns ? BUFFER_NS / period_ns : 1;
	pthread_mutex_lock(&lock);
	for (uint64_t k = hi >= depth ? hi - depth + 1 : 1; g && k <= hi; k++) {
		uint64_t b = k * period_ns;
		unsigned long long ts = (unsigned long long)((int64_t)b + realtime_off) / 1000;
		if (ts <= lastSeenTimeStamp)
			continue;
		for (int i = 0; i < FG_PROCS && n < MAX_SAMPLES; i++) {
			struct fg_proc *p = &g->procs[i];
			int32_t pid = atomic_load(&p->pid);
			uint64_t e0, e1;
			if (pid <= 0 || !fg_executed(&p->dev[d], b - period_ns, b, &e0, &e1))
				continue;
			unsigned int util = (unsigned int)((e1 - e0) * 100 / period_ns);
			if (!util)
				continue;
			out[n++] = (nvmlProcessUtilizationSample_t){
				.pid = (unsigned int)pid + pid_offset, .timeStamp = ts,
				.smUtil = util > 100 ? 100 : util };
		}
	}
	if (!n) {
		r = NVML_ERROR_NOT_FOUND;
	} else if (!utilization || *count < n) {
		r = NVML_ERROR_INSUFFICIENT_SIZE;
	} else {
		memcpy(utilization, out, n * sizeof(*out));
	}
	*count = n;
	pthread_mutex_unlock(&lock);
	return r;
}
