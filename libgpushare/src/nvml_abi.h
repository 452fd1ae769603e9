/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NVML declarations the library needs (nvml.h is not shipped with the
 * driver): facts of NVML's ABI, shared by the interposer's NVML entry
 * points (nvml.c) and standalone feedback's reader (feedback_nvml.c).
 */
#ifndef GPUSHARE_NVML_ABI_H
#define GPUSHARE_NVML_ABI_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999
#define NVML_VALUE_NOT_AVAILABLE (~0ull)

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;

/* NVML's versioned-struct tag: size in the low 24 bits, version above. */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* nvmlProcessUtilizationSample_t */
typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvml_sample_t;

typedef struct {			/* nvmlProcessInfo_v1_t */
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvml_proc_v1_t;

typedef struct {			/* nvmlProcessInfo_t of _v2 and _v3 */
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvml_proc_v2_t;

#endif /* GPUSHARE_NVML_ABI_H */
