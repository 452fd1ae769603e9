// SPDX-License-Identifier: Apache-2.0
/*
 * The interposer against the fake driver, reached the ways programs reach
 * the real one.  Run as
 *
 *   test_cuda MODE SCENARIO
 *
 * MODE, how the entry points are found:
 *   direct     linked against libcuda (this program's own references)
 *   dlsym      dlopen("libcuda.so.1") + dlsym of the versioned names
 *   proc       cuGetProcAddress_v2 (from dlsym), base names at 12090; the
 *              lookup function itself is looked up through itself first
 *   proc_ptds  the same with the per-thread default stream flag
 *   proc_v1    the 4-argument cuGetProcAddress, asked for at 11030
 *
 * SCENARIO, what the environment set up (tests/run_cuda.sh):
 *   quota      device 0: 512 MiB, device 1: 1 GiB (UUIDs in reverse order)
 *   managed    the same with GPUSHARE_ALLOW_MANAGED=1
 *   ordinal    the limits without UUIDs: device 0: 512 MiB, device 1: 1 GiB
 *   off        GPUSHARE_ISOLATION=none
 *   fork       the quota environment; a forked child's accounting
 *   modfork    module mode (tests/fake/fake_gsdev.c), the same quotas; a
 *              forked child shares the container's ledger
 *   refused    module mode with GPUSHARE_GPU_UUIDS rewritten: the devices
 *              in $TEST_REFUSED (digits, e.g. "01") are not matched to a
 *              quota, so every allocation on them is out of memory and
 *              they show 0 bytes; any other device allocates
 *   lookup     cuGetProcAddress edge cases: NULL name or pfn, odd versions
 *              and flags, "cuGetProcAddress" at every version
 *   launch     GPUSHARE_CORE_LIMIT=50,50 (standalone): after 40 ms of work
 *              through each launch path (kernel, Ex, cooperative, multi-
 *              device, graph, host function), the next call of that path
 *              waits (the calling thread is held to the share); a launch
 *              into a stream being captured does not wait, and the capture
 *              is not disturbed; a forked child is gated on its own.  With
 *              TEST_GATED=0 (no limit) no call waits
 *   launch_refused  module mode, GPUs not the container's: every launch
 *              path answers CUDA_ERROR_NOT_PERMITTED
 *
 * Exit 0 when every check held.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "test_cuda.h"

struct api api;
int failures;
CUcontext ctx[2];

void use(int dev)
{
	OK(api.ctx_set(ctx[dev]));
}

/* The free and total bytes the current device shows. */
void info(size_t *free_, size_t *total)
{
	OK(api.mem_info(free_, total));
}

void expect_free(size_t want, int line)
{
	size_t f = 0, t = 0;
	info(&f, &t);
	if (f != want) {
		failures++;
		fprintf(stderr, "FAIL line %d: free %zu MiB + %zu, want %zu MiB + %zu\n", line,
			f >> 20, f & (size_t)(MiB - 1), want >> 20, want & (size_t)(MiB - 1));
	}
}

int main(int argc, char **argv)
{
	CUdevice d;

	if (argc != 3) {
		fprintf(stderr, "usage: %s MODE SCENARIO\n", argv[0]);
		return 2;
	}
	const char *mode = argv[1], *scenario = argv[2];
	if (resolve(mode))
		return 1;
	check_wrapped(mode);
	OK(api.init(0));
	for (int i = 0; i < 2; i++) {
		OK(api.device_get(&d, i));
		OK(api.primary_retain(&ctx[i], d));
	}
	if (!strcmp(scenario, "quota") || !strcmp(scenario, "ordinal")) {
		views();
		linear();
		async_and_pools();
		vmm();
		arrays();
		managed(0);
	} else if (!strcmp(scenario, "managed")) {
		managed(1);
	} else if (!strcmp(scenario, "off")) {
		off();
	} else if (!strcmp(scenario, "fork")) {
		forked();
	} else if (!strcmp(scenario, "modfork")) {
		module_forked();
	} else if (!strcmp(scenario, "refused")) {
		refused();
	} else if (!strcmp(scenario, "lookup")) {
		lookup_edges();
	} else if (!strcmp(scenario, "launch")) {
		launches();
	} else if (!strcmp(scenario, "launch_refused")) {
		launches_refused();
	} else {
		fprintf(stderr, "unknown scenario %s\n", scenario);
		return 2;
	}
	printf("%s %s: %s\n", mode, scenario, failures ? "FAILED" : "ok");
	return failures ? 1 : 0;
}
