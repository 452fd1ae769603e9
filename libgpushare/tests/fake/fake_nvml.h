/* SPDX-License-Identifier: Apache-2.0 */
/* The fake NVML's parts (fake_nvml.c, fake_nvml_procs.c): what they share. */
#ifndef FAKE_NVML_H
#define FAKE_NVML_H

#include <pthread.h>

#define API __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_DEV 8

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

struct nvmlDevice_st {
	char uuid[48];
	unsigned long long soft_limit, hard_limit;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

/* fake_nvml.c's */
HIDDEN extern struct nvmlDevice_st devices[MAX_DEV];
HIDDEN extern pthread_mutex_t lock;
HIDDEN int initialized(void);
/* A handle this library gave out, or NULL. */
HIDDEN struct nvmlDevice_st *dev_of(nvmlDevice_t d);

#endif /* FAKE_NVML_H */
