// SPDX-License-Identifier: Apache-2.0
/*
 * The allocation-heavy loop of bench/interposer_overhead.py: <pairs>
 * cuMemAlloc_v2 + cuMemFree_v2 of <bytes>, then as many cuMemAllocAsync +
 * cuMemFreeAsync, reached through dlsym as the CUDA runtime's clients do.
 * Prints "sync <ns per pair>" and "async <ns per pair>".
 */
#define PROG "interposer_loop"
#include "driver_loop.h"

typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);
typedef int (*alloc_async_fn)(unsigned long long *, size_t, void *);
typedef int (*free_async_fn)(unsigned long long, void *);

int main(int argc, char **argv)
{
	unsigned long long ptr;
	long pairs, i;
	size_t bytes;
	void *driver;
	double t;

	if (argc != 3) {
		fprintf(stderr, "usage: interposer_loop <pairs> <bytes>\n");
		return 2;
	}
	pairs = atol(argv[1]);
	bytes = strtoull(argv[2], NULL, 10);
	driver = open_driver();

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
