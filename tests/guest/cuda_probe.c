// SPDX-License-Identifier: Apache-2.0
/*
 * A CUDA driver client for the end-to-end test in the guest: it runs in a
 * container of a pod with a GPU share, against the tests' fake driver,
 * with libgpushare.so preloaded by the container's /etc/ld.so.preload.
 *
 * It resolves the driver as the CUDA runtime does (dlopen + dlsym, names
 * with their _v2 suffix), then prints one line per step:
 *
 *   info <total> <free>        cuMemGetInfo_v2
 *   devtotal <bytes>           cuDeviceTotalMem_v2
 *   over <bytes> <result>      cuMemAlloc_v2 of the quota + 1 byte
 *   hold <bytes> <result>      cuMemAlloc_v2 of argv[1] bytes, kept
 *   held                       (then waits until the file argv[2] exists)
 *   freed <result>             cuMemFree_v2 of the kept allocation
 *
 * and exits 0.  Results are CUresult numbers (0 success, 2 out of memory).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_retain_fn)(void **, int);
typedef int (*ctx_set_fn)(void *);
typedef int (*mem_info_fn)(size_t *, size_t *);
typedef int (*total_mem_fn)(size_t *, int);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);

static void *lookup(void *driver, const char *name)
{
	void *fn = dlsym(driver, name);

	if (!fn) {
		fprintf(stderr, "cuda_probe: %s: %s\n", name, dlerror());
		exit(2);
	}
	return fn;
}

int main(int argc, char **argv)
{
	unsigned long long over_ptr, held_ptr;
	size_t total, free_bytes, devtotal;
	void *driver, *ctx;
	int dev, ret;

	if (argc != 3) {
		fprintf(stderr, "usage: cuda_probe <bytes-to-hold> <release-file>\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	driver = dlopen("libcuda.so.1", RTLD_NOW);
	if (!driver) {
		fprintf(stderr, "cuda_probe: %s\n", dlerror());
		return 2;
	}
	if (((init_fn)lookup(driver, "cuInit"))(0) ||
	    ((device_get_fn)lookup(driver, "cuDeviceGet"))(&dev, 0) ||
	    ((ctx_retain_fn)lookup(driver, "cuDevicePrimaryCtxRetain"))(&ctx, dev) ||
	    ((ctx_set_fn)lookup(driver, "cuCtxSetCurrent"))(ctx)) {
		fprintf(stderr, "cuda_probe: no device\n");
		return 2;
	}

	ret = ((mem_info_fn)lookup(driver, "cuMemGetInfo_v2"))(&free_bytes, &total);
	printf("info %zu %zu %d\n", total, free_bytes, ret);
	ret = ((total_mem_fn)lookup(driver, "cuDeviceTotalMem_v2"))(&devtotal, dev);
	printf("devtotal %zu %d\n", devtotal, ret);

	alloc_fn alloc = (alloc_fn)lookup(driver, "cuMemAlloc_v2");
	free_fn release = (free_fn)lookup(driver, "cuMemFree_v2");

	ret = alloc(&over_ptr, total + 1);
	printf("over %zu %d\n", total + 1, ret);
	if (!ret)
		release(over_ptr);

	ret = alloc(&held_ptr, strtoull(argv[1], NULL, 10));
	printf("hold %s %d\n", argv[1], ret);
	printf("held\n");
	while (access(argv[2], F_OK))
		usleep(100 * 1000);
	printf("freed %d\n", ret ? -1 : release(held_ptr));
	return 0;
}
