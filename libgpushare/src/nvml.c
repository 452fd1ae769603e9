// SPDX-License-Identifier: Apache-2.0
/*
 * NVML interception: nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2
 * report a device's quota as its total memory, the ledger's used bytes as
 * used, and quota - used as free, so `nvidia-smi` and pynvml inside a
 * container show `used / quota` instead of the whole GPU.
 *
 * A device with no quota (isolation none, a GPU that is not the
 * container's, a MIG instance the ledger does not know) keeps the driver's
 * own figures.  Real NVML is reached through dlopen("libnvidia-ml.so.1")
 * and the real dlsym (gs_real_dlsym: a plain dlsym call from here would
 * bind to our own wrapper, which hands out these wrappers, and a wrapper
 * would call itself).  The wrappers are both exported (for programs linked
 * against NVML) and handed to the dlsym wrapper by gs_nvml_dlsym (for
 * nvidia-smi and pynvml, which resolve everything with dlsym on NVML's
 * handle, a lookup that never searches LD_PRELOAD libraries).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "interpose.h"
#include "ledger.h"
#include "nvml_abi.h"

typedef nvmlReturn_t (*get_memory_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*get_memory_v2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*get_uuid_fn)(nvmlDevice_t, char *, unsigned int);

/* Real NVML, resolved once. */
static struct {
	pthread_once_t once;
	get_memory_fn get_memory;
	get_memory_v2_fn get_memory_v2;
	get_uuid_fn get_uuid;
} real = { .once = PTHREAD_ONCE_INIT };

static void resolve_real(void)
{
	/*
	 * The caller already holds a device handle, so NVML is loaded: this
	 * dlopen only finds it by its soname (and keeps it loaded).
	 */
	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);

	if (!nvml)
		return;
	real.get_memory = (get_memory_fn)gs_real_dlsym(nvml, "nvmlDeviceGetMemoryInfo");
	real.get_memory_v2 = (get_memory_v2_fn)gs_real_dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
	real.get_uuid = (get_uuid_fn)gs_real_dlsym(nvml, "nvmlDeviceGetUUID");
}

/*
 * The container's figures for @device: 1 with *quota and *used set, 0 when
 * the device has no quota (report the driver's figures), or a negative
 * NVML error negated when the device cannot be named (fail closed: never
 * show the whole GPU to a container that has a quota).
 */
static int container_view(nvmlDevice_t device, uint64_t *quota, uint64_t *used)
{
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	nvmlReturn_t ret;

	if (gs_ledger_mode() == GS_LEDGER_OFF)
		return 0;
	if (!real.get_uuid)
		return -NVML_ERROR_FUNCTION_NOT_FOUND;
	ret = real.get_uuid(device, uuid, sizeof(uuid));
	if (ret != NVML_SUCCESS)
		return ret > 0 ? -ret : -NVML_ERROR_UNKNOWN;
	uuid[sizeof(uuid) - 1] = '\0';
	return gs_ledger_view_uuid(uuid, quota, used) ? 1 : 0;
}

/* quota - used, never below zero, and never more than the GPU has free. */
static unsigned long long container_free(uint64_t quota, uint64_t used,
					 unsigned long long driver_free)
{
	uint64_t left = used < quota ? quota - used : 0;

	return left < driver_free ? left : driver_free;
}

/*
 * Rewrite the driver's figures for @device (already in *total, *free,
 * *used) as the container's: total = quota, used = the ledger's, free =
 * what is left of the quota.  A device with no quota keeps the driver's.
 */
static nvmlReturn_t show_container(nvmlDevice_t device, unsigned long long *total,
				   unsigned long long *free_bytes, unsigned long long *used_bytes)
{
	uint64_t quota, used;
	int view = container_view(device, &quota, &used);

	if (view < 0)
		return -view;
	if (view == 0)
		return NVML_SUCCESS;
	*free_bytes = container_free(quota, used, *free_bytes);
	*total = quota;
	*used_bytes = used;
	return NVML_SUCCESS;
}

__attribute__((visibility("default")))
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	nvmlReturn_t ret;

	pthread_once(&real.once, resolve_real);
	if (!real.get_memory)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	ret = real.get_memory(device, memory);
	if (ret != NVML_SUCCESS)
		return ret;
	return show_container(device, &memory->total, &memory->free, &memory->used);
}

__attribute__((visibility("default")))
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	nvmlReturn_t ret;

	pthread_once(&real.once, resolve_real);
	if (!real.get_memory_v2)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	/*
	 * Only the layout we know may be rewritten: a later version's struct
	 * could hold the whole GPU's figures where we do not look.  Real NVML
	 * refuses unknown versions the same way.
	 */
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	ret = real.get_memory_v2(device, memory);
	if (ret != NVML_SUCCESS)
		return ret;
	/* reserved stays the driver's (its own firmware and context memory). */
	return show_container(device, &memory->total, &memory->free, &memory->used);
}

/*
 * The dlsym wrapper's question (interpose.h): our wrapper, only for names
 * the real lookup found.  Strings compared only: no dlsym, no lock.
 */
void *gs_nvml_dlsym(void *handle, const char *name, void *found)
{
	(void)handle;
	if (!found || !name)
		return NULL;
	if (strcmp(name, "nvmlDeviceGetMemoryInfo") == 0)
		return (void *)nvmlDeviceGetMemoryInfo;
	if (strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0)
		return (void *)nvmlDeviceGetMemoryInfo_v2;
	return NULL;
}
