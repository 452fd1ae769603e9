// SPDX-License-Identifier: Apache-2.0
/*
 * The launch-heaviest loop there is, for bench/gpu_compute.py: an empty
 * kernel (JIT-compiled from the PTX below) launched with cuLaunchKernel,
 * reached through dlsym as the CUDA runtime's clients do, and a
 * cuCtxSynchronize after every PER_SYNC (1000) launches (the queue stays short,
 * as in a framework's eager loop).  Nothing else runs in the loop, so what
 * the interposer adds to a launch is as large a part of it as it can be.
 *
 *   launch_loop <warm-up launches> <launches per round> <rounds>
 *
 * Prints "round <ns per launch>" for each round; exit 2 when the driver
 * cannot be used, 1 when a call fails in the loop.
 */
#define PROG "launch_loop"
#include "driver_loop.h"

typedef int (*module_load_fn)(void **, const void *);
typedef int (*module_function_fn)(void **, void *, const char *);
typedef int (*launch_fn)(void *, unsigned int, unsigned int, unsigned int,
			 unsigned int, unsigned int, unsigned int, unsigned int,
			 void *, void **, void **);
typedef int (*sync_fn)(void);

static const char empty_ptx[] =
	".version 7.0\n"
	".target sm_50\n"
	".address_size 64\n"
	".visible .entry gs_empty()\n"
	"{\n"
	"\tret;\n"
	"}\n";

#define PER_SYNC 1000

/* @n launches of @kernel, synchronising every PER_SYNC: 0, or the error. */
static int launches(launch_fn launch, sync_fn sync, void *kernel, long n)
{
	long i;
	int err;

	for (i = 1; i <= n; i++) {
		err = launch(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		if (err)
			return err;
		if (i % PER_SYNC == 0 || i == n) {
			err = sync();
			if (err)
				return err;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	void *driver, *module, *kernel;
	long warmup, per_round, rounds, r;
	launch_fn launch;
	sync_fn sync;
	double t;
	int err;

	if (argc != 4) {
		fprintf(stderr, "usage: launch_loop <warm-up> <per round> <rounds>\n");
		return 2;
	}
	warmup = atol(argv[1]);
	per_round = atol(argv[2]);
	rounds = atol(argv[3]);
	if (warmup < 0 || per_round < 1 || rounds < 1) {
		fprintf(stderr, "launch_loop: counts must be positive\n");
		return 2;
	}
	driver = open_driver();
	err = ((module_load_fn)lookup(driver, "cuModuleLoadData"))(&module, empty_ptx);
	if (!err)
		err = ((module_function_fn)lookup(driver, "cuModuleGetFunction"))(&kernel, module,
										   "gs_empty");
	if (err) {
		fprintf(stderr, "launch_loop: loading the empty kernel failed: CUresult %d\n", err);
		return 2;
	}
	launch = (launch_fn)lookup(driver, "cuLaunchKernel");
	sync = (sync_fn)lookup(driver, "cuCtxSynchronize");

	err = launches(launch, sync, kernel, warmup);
	for (r = 0; !err && r < rounds; r++) {
		t = now_ns();
		err = launches(launch, sync, kernel, per_round);
		if (!err)
			printf("round %.2f\n", (now_ns() - t) / per_round);
	}
	if (err) {
		fprintf(stderr, "launch_loop: a launch or synchronize failed: CUresult %d\n", err);
		return 1;
	}
	return 0;
}
