/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What test_cuda's files share (test_cuda.c has the modes and scenarios):
 * the entry points under test, however they were found, and the checks.
 */
#ifndef GPUSHARE_TEST_CUDA_H
#define GPUSHARE_TEST_CUDA_H

#include <stddef.h>
#include <stdio.h>

#include "cuda_abi.h"

#define MiB (1ull << 20)
#define Q0 (512 * MiB)		/* device 0's quota */
#define Q1 (1024 * MiB)		/* device 1's quota */
#define DEVMEM (8192 * MiB)	/* the fake's memory per device (run_cuda.sh) */

/* The entry points the test uses, however they were found. */
struct api {
	CUresult (*init)(unsigned int);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*total_mem)(size_t *, CUdevice);
	CUresult (*get_uuid)(CUuuid *, CUdevice);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*managed)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*stream_create)(CUstream *, unsigned int);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*default_pool)(CUmemoryPool *, CUdevice);
	CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*pool_destroy)(CUmemoryPool);
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*granularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t,
			       const CUmemAllocationProp *, unsigned long long);
	CUresult (*mem_release)(CUmemGenericAllocationHandle);
	CUresult (*addr_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*addr_free)(CUdeviceptr, size_t);
	CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			    unsigned long long);
	CUresult (*mem_unmap)(CUdeviceptr, size_t);
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
	CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
	CUresult (*array_destroy)(CUarray);
	CUresult (*mipmap_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
				  unsigned int);
	CUresult (*mipmap_destroy)(CUmipmappedArray);
	cuLaunchKernel_t launch;
	cuLaunchKernelEx_t launch_ex;
	cuLaunchCooperativeKernel_t launch_coop;
	cuLaunchCooperativeKernelMultiDevice_t launch_multi;
	cuGraphLaunch_t graph_launch;
	cuLaunchHostFunc_t host_func;
	CUresult (*ctx_sync)(void);
};
extern struct api api;

extern int failures;
extern CUcontext ctx[2];	/* each device's primary context */

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			failures++;                                             \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                           \
			fputc('\n', stderr);                                    \
		}                                                               \
	} while (0)
#define OK(call) CHECK((call) == CUDA_SUCCESS, "%s", "")
#define OOM(call) CHECK((call) == CUDA_ERROR_OUT_OF_MEMORY, "%s", "expected out of memory")


/* test_cuda.c */
void use(int dev);
void info(size_t *free_, size_t *total);
void expect_free(size_t want, int line);
#define EXPECT_FREE(n) expect_free(n, __LINE__)

/* test_cuda_lookup.c: the modes */
int resolve(const char *mode);
void check_wrapped(const char *mode);
void lookup_edges(void);

/* test_cuda_mem.c: the memory scenarios */
void views(void);
void linear(void);
void async_and_pools(void);
void vmm(void);
void arrays(void);
void managed(int allowed);
void off(void);
void forked(void);
void module_forked(void);
void refused(void);

/* test_cuda_launch.c: the compute gate */
void launches(void);
void launches_refused(void);

#endif /* GPUSHARE_TEST_CUDA_H */
