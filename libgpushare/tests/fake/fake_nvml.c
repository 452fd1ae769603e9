// SPDX-License-Identifier: Apache-2.0
/*
 * A fake NVML (libnvidia-ml.so.1) for the interposer's tests: the devices
 * of the fake CUDA driver (tests/fake/fake_cuda.c), seen through NVML.
 * Configured by the same environment:
 *
 *   FAKECUDA_DEVICES  number of devices (default 2, at most 8)
 *   FAKECUDA_MEMORY   bytes of memory per device (default 8 GiB)
 *
 * Device i is "GPU-face0000-0000-0000-0000-0000000000ii" (ii: i in two
 * lowercase hex digits), as in the fake CUDA driver.  Its memory is
 * FAKENVML_RESERVED bytes reserved by the "driver" (v2's reserved; counted
 * in v1's used, as real NVML does) and the rest free: the fake cannot see
 * the fake CUDA driver's allocations, and the interposer replaces used and
 * free with the container's figures anyway.
 *
 * Implemented: nvmlInit, nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown,
 * nvmlErrorString, nvmlSystemGetDriverVersion, nvmlDeviceGetCount(_v2),
 * nvmlDeviceGetHandleByIndex(_v2), nvmlDeviceGetHandleByUUID,
 * nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetMemoryInfo(_v2) and
 * the r615 pair nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1
 * (one soft and hard limit per device, the namespace ignored), and the
 * processes: nvmlDeviceGetComputeRunningProcesses (v1, _v2, _v3) and
 * nvmlDeviceGetProcessUtilization (fake_nvml_procs.c), from the records the
 * fake CUDA driver keeps in the simulated GPU's shared file (fake_gpu.h; without
 * FAKECUDA_GPU_STATE no process is seen):
 *
 *   FAKENVML_SAMPLE_US   the driver's sampling period (default 166667: 1/6 s)
 *   FAKENVML_PID_OFFSET  added to every pid reported, as a host sees the
 *                        processes of a container's PID namespace
 *
 * As the real driver: a process is listed on a device where it made a
 * context (and is alive), with the bytes it allocated there; utilisation
 * samples are taken at the end of every period (CLOCK_MONOTONIC multiples
 * of it), one per process with a non-zero smUtil (integer percent of the
 * period, truncated, of the kernel time the device *executed* for it then),
 * time-stamped in CLOCK_REALTIME microseconds; the driver's buffer holds
 * the last 1.5 s of them; only samples newer than lastSeenTimeStamp are
 * returned, and none is NVML_ERROR_NOT_FOUND.
 *
 * Linked with -Bsymbolic: its own calls never reach an interposer's
 * exports of the same names.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nvml.h"

#define FAKE_RESERVED_DEFAULT (64ull << 20)

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* r615's memory limits (as nvidia-ml-py 13.615 declares them). */
typedef struct {
	char *nameSpace;
	unsigned long long softLimit, hardLimit;
} nvmlSetMemoryLimits_v1_t;

typedef struct {
	char *nameSpace;
	unsigned long long softLimit, hardLimit, currentUsed;
} nvmlGetMemoryLimits_v1_t;

struct nvmlDevice_st devices[MAX_DEV];
static int ndev = 2;
static unsigned long long devmem = 8ull << 30;
static unsigned long long reserved = FAKE_RESERVED_DEFAULT;
static int init_count;
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void fake_setup(void)
{
	const char *s = getenv("FAKECUDA_DEVICES");

	if (s) {
		ndev = atoi(s);
		if (ndev < 0)
			ndev = 0;
		if (ndev > MAX_DEV)
			ndev = MAX_DEV;
	}
	s = getenv("FAKECUDA_MEMORY");
	if (s)
		devmem = strtoull(s, NULL, 10);
	s = getenv("FAKENVML_RESERVED");
	if (s)
		reserved = strtoull(s, NULL, 10);
	if (reserved > devmem)
		reserved = devmem;
	for (int i = 0; i < MAX_DEV; i++) {
		snprintf(devices[i].uuid, sizeof(devices[i].uuid),
			 "GPU-face0000-0000-0000-0000-0000000000%02x", i);
		devices[i].soft_limit = ~0ull;
		devices[i].hard_limit = ~0ull;
	}
}

int initialized(void)
{
	int n;

	pthread_mutex_lock(&lock);
	n = init_count;
	pthread_mutex_unlock(&lock);
	return n > 0;
}

/* A handle this library gave out, or NULL. */
struct nvmlDevice_st *dev_of(nvmlDevice_t d)
{
	for (int i = 0; i < ndev; i++)
		if (d == &devices[i])
			return d;
	return NULL;
}

/* Copy @s into @buf of @len bytes, NVML style. */
static nvmlReturn_t copy_out(const char *s, char *buf, unsigned int len)
{
	if (!buf)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(s) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(buf, s, strlen(s) + 1);
	return NVML_SUCCESS;
}

/* ---- init ---- */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&lock);
	init_count++;
	pthread_mutex_unlock(&lock);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlShutdown(void)
{
	nvmlReturn_t ret = NVML_SUCCESS;

	pthread_mutex_lock(&lock);
	if (init_count > 0)
		init_count--;
	else
		ret = NVML_ERROR_UNINITIALIZED;
	pthread_mutex_unlock(&lock);
	return ret;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	default: return "Unknown Error";
	}
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	return copy_out("580.00.fake", version, len);
}

/* ---- devices ---- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)ndev;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
	return nvmlDeviceGetCount_v2(count);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!device || index >= (unsigned int)ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &devices[index];
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < ndev; i++) {
		if (strcasecmp(uuid, devices[i].uuid) == 0) {
			*device = &devices[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int len)
{
	struct nvmlDevice_st *d = dev_of(device);

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!d)
		return NVML_ERROR_INVALID_ARGUMENT;
	return copy_out(d->uuid, uuid, len);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int len)
{
	struct nvmlDevice_st *d = dev_of(device);

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!d)
		return NVML_ERROR_INVALID_ARGUMENT;
	return copy_out("NVIDIA Fake GPU", name, len);
}

/* ---- memory ---- */

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!dev_of(device) || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	memory->total = devmem;
	memory->used = reserved;	/* v1's used includes the reserved memory */
	memory->free = devmem - reserved;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!dev_of(device) || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	memory->total = devmem;
	memory->reserved = reserved;
	memory->used = 0;
	memory->free = devmem - reserved;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device,
					      const nvmlSetMemoryLimits_v1_t *limits)
{
	struct nvmlDevice_st *d = dev_of(device);

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!d || !limits || limits->softLimit > limits->hardLimit)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	d->soft_limit = limits->softLimit;
	d->hard_limit = limits->hardLimit;
	pthread_mutex_unlock(&lock);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device,
					      nvmlGetMemoryLimits_v1_t *limits)
{
	struct nvmlDevice_st *d = dev_of(device);

	if (!initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!d || !limits)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	limits->softLimit = d->soft_limit;
	limits->hardLimit = d->hard_limit;
	pthread_mutex_unlock(&lock);
	limits->currentUsed = 0;
	return NVML_SUCCESS;
}
