/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What bench/interposer_loop.c and bench/launch_loop.c share: the CUDA
 * driver reached through dlopen + dlsym, as the CUDA runtime's clients reach
 * it (so a preloaded interposer sees every call), device 0's primary context
 * made current, and a monotonic clock.  Each program defines PROG, its name
 * for messages, before including this.
 */
#ifndef BENCH_DRIVER_LOOP_H
#define BENCH_DRIVER_LOOP_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*init_fn)(unsigned int);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_retain_fn)(void **, int);
typedef int (*ctx_set_fn)(void *);

/* @name in the driver; exit 2 when it has none. */
static inline void *lookup(void *driver, const char *name)
{
	void *fn = dlsym(driver, name);

	if (!fn) {
		fprintf(stderr, PROG ": %s: %s\n", name, dlerror());
		exit(2);
	}
	return fn;
}

static inline double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* libcuda.so.1 with device 0's primary context current; exit 2 when not. */
static inline void *open_driver(void)
{
	void *driver = dlopen("libcuda.so.1", RTLD_NOW), *ctx;
	int dev, err;

	if (!driver) {
		fprintf(stderr, PROG ": %s\n", dlerror());
		exit(2);
	}
	err = ((init_fn)lookup(driver, "cuInit"))(0);
	if (!err)
		err = ((device_get_fn)lookup(driver, "cuDeviceGet"))(&dev, 0);
	if (!err)
		err = ((ctx_retain_fn)lookup(driver, "cuDevicePrimaryCtxRetain"))(&ctx, dev);
	if (!err)
		err = ((ctx_set_fn)lookup(driver, "cuCtxSetCurrent"))(ctx);
	if (err) {
		fprintf(stderr, PROG ": setting up the driver failed: CUresult %d\n", err);
		exit(2);
	}
	return driver;
}

#endif
