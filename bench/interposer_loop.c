// SPDX-License-Identifier: Apache-2.0
/*
 * The allocation-heavy loop of bench/interposer_overhead.py: <pairs>
 * cuMemAlloc_v2 + cuMemFree_v2 of <bytes>, then as many cuMemAllocAsync +
 * cuMemFreeAsync, reached through dlsym as the CUDA runtime's clients do.
 * Prints "sync <ns per pair>" and "async <ns per pair>".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*init_fn)(unsigned int);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_retain_fn)(void **, int);
typedef int (*ctx_set_fn)(void *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);
typedef int (*alloc_async_fn)(unsigned long long *, size_t, void *);
typedef int (*free_async_fn)(unsigned long long, void *);

static void *lookup(void *driver, const char *name)
{
	void *fn = dlsym(driver, name);

	if (!fn) {
		fprintf(stderr, "interposer_loop: %s: %s\n", name, dlerror());
		exit(2);
	}
	return fn;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	unsigned long long ptr;
	void *driver, *ctx;
	long pairs, i;
	size_t bytes;
	double t;
	int dev;

	if (argc != 3) {
		fprintf(stderr, "usage: interposer_loop <pairs> <bytes>\n");
		return 2;
	}
	pairs = atol(argv[1]);
	bytes = strtoull(argv[2], NULL, 10);
	driver = dlopen("libcuda.so.1", RTLD_NOW);
	if (!driver) {
		fprintf(stderr, "interposer_loop: %s\n", dlerror());
		return 2;
	}
	if (((init_fn)lookup(driver, "cuInit"))(0) ||
	    ((device_get_fn)lookup(driver, "cuDeviceGet"))(&dev, 0) ||
	    ((ctx_retain_fn)lookup(driver, "cuDevicePrimaryCtxRetain"))(&ctx, dev) ||
	    ((ctx_set_fn)lookup(driver, "cuCtxSetCurrent"))(ctx))
		return 2;

	alloc_fn alloc = (alloc_fn)lookup(driver, "cuMemAlloc_v2");
	free_fn release = (free_fn)lookup(driver, "cuMemFree_v2");
	alloc_async_fn alloc_async = (alloc_async_fn)lookup(driver, "cuMemAllocAsync");
	free_async_fn free_async = (free_async_fn)lookup(driver, "cuMemFreeAsync");

	t = now_ns();
	for (i = 0; i < pairs; i++)
		if (alloc(&ptr, bytes) || release(ptr))
			return 1;
	printf("sync %.1f\n", (now_ns() - t) / pairs);

	t = now_ns();
	for (i = 0; i < pairs; i++)
		if (alloc_async(&ptr, bytes, NULL) || free_async(ptr, NULL))
			return 1;
	printf("async %.1f\n", (now_ns() - t) / pairs);
	return 0;
}
