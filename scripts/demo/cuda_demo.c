// SPDX-License-Identifier: Apache-2.0
/*
 * The demo's memory program, run in a pod with `gpu-memory: 1Gi` on the
 * tests' fake CUDA driver, with libgpushare.so preloaded by the container's
 * /etc/ld.so.preload.  It finds the driver and NVML as the CUDA runtime and
 * nvidia-smi do (dlopen + dlsym), and prints what it sees and gets:
 *
 *   cuMemGetInfo total <bytes> free <bytes>
 *   cuDeviceTotalMem <bytes>
 *   nvmlDeviceGetMemoryInfo total <bytes> used <bytes>
 *   cuMemAlloc <bytes> -> <CUresult>          (chunks of STEP up to the total)
 *   cuMemAlloc 1 more byte -> <CUresult>      (2: CUDA_ERROR_OUT_OF_MEMORY)
 *   held <bytes>                              (then waits for RELEASE to exist)
 *
 *   cuda_demo DEVICE STEP_BYTES RELEASE
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct nvml_memory {
	unsigned long long total, free, used;
};

static void *need(void *lib, const char *name)
{
	void *fn = dlsym(lib, name);

	if (!fn) {
		fprintf(stderr, "cuda_demo: %s: %s\n", name, dlerror());
		exit(2);
	}
	return fn;
}

int main(int argc, char **argv)
{
	size_t total, free_bytes, step, held = 0;
	unsigned long long ptrs[64], extra;
	struct nvml_memory mem;
	void *cuda, *nvml, *ctx, *handle;
	int dev, n = 0, ret;

	if (argc != 4) {
		fprintf(stderr, "usage: cuda_demo DEVICE STEP_BYTES RELEASE\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	cuda = dlopen("libcuda.so.1", RTLD_NOW);
	nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!cuda || !nvml) {
		fprintf(stderr, "cuda_demo: %s\n", dlerror());
		return 2;
	}
	int (*init)(unsigned int) = need(cuda, "cuInit");
	int (*get)(int *, int) = need(cuda, "cuDeviceGet");
	int (*retain)(void **, int) = need(cuda, "cuDevicePrimaryCtxRetain");
	int (*set)(void *) = need(cuda, "cuCtxSetCurrent");
	int (*info)(size_t *, size_t *) = need(cuda, "cuMemGetInfo_v2");
	int (*devtotal)(size_t *, int) = need(cuda, "cuDeviceTotalMem_v2");
	int (*alloc)(unsigned long long *, size_t) = need(cuda, "cuMemAlloc_v2");
	int (*release)(unsigned long long) = need(cuda, "cuMemFree_v2");
	int (*ninit)(void) = need(nvml, "nvmlInit_v2");
	int (*nbyindex)(unsigned int, void **) = need(nvml, "nvmlDeviceGetHandleByIndex_v2");
	int (*nmem)(void *, struct nvml_memory *) = need(nvml, "nvmlDeviceGetMemoryInfo");

	if (init(0) || get(&dev, atoi(argv[1])) || retain(&ctx, dev) || set(ctx) || ninit() ||
	    nbyindex((unsigned int)dev, &handle)) {
		fprintf(stderr, "cuda_demo: no device %s\n", argv[1]);
		return 2;
	}
	step = strtoull(argv[2], NULL, 10);
	ret = info(&free_bytes, &total);
	printf("cuMemGetInfo total %zu free %zu -> %d\n", total, free_bytes, ret);
	ret = devtotal(&total, dev);
	printf("cuDeviceTotalMem %zu -> %d\n", total, ret);
	ret = nmem(handle, &mem);
	printf("nvmlDeviceGetMemoryInfo total %llu used %llu -> %d\n", mem.total, mem.used, ret);

	while (step && held + step <= total && n < 64) {
		ret = alloc(&ptrs[n], step);
		printf("cuMemAlloc %zu -> %d\n", step, ret);
		if (ret)
			break;
		held += step;
		n++;
	}
	ret = alloc(&extra, 1);
	printf("cuMemAlloc 1 more byte -> %d\n", ret);
	if (!ret)
		release(extra);
	info(&free_bytes, &total);
	nmem(handle, &mem);
	printf("after: cuMemGetInfo free %zu, nvmlDeviceGetMemoryInfo used %llu\n", free_bytes,
	       mem.used);
	printf("held %zu\n", held);
	while (access(argv[3], F_OK))
		usleep(100 * 1000);
	while (n--)
		release(ptrs[n]);
	printf("freed\n");
	return 0;
}
