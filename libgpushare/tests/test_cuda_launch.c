// SPDX-License-Identifier: Apache-2.0
/* test_cuda's launch scenarios: the compute gate on every launch path. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "test_cuda.h"

/* Not wrapped, and not what is tested: always linked directly. */
extern CUresult cuGraphCreate(CUgraph *, unsigned int);
extern CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
					const CUDA_KERNEL_NODE_PARAMS *);
extern CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
extern CUresult cuStreamBeginCapture_v2(CUstream, int);
extern CUresult cuStreamEndCapture(CUstream, CUgraph *);
extern CUresult cuStreamIsCapturing(CUstream, int *);

#define FN ((CUfunction)0x1)		/* the fake runs any function */
#define WORK 40000u			/* blocks: 40 ms at the fake's 1 us each */
#define MS 1000000ull

enum path { P_KERNEL, P_EX, P_COOP, P_MULTI, P_GRAPH, P_HOST, NPATHS };
static const char *const path_name[NPATHS] = {
	"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
	"cuLaunchCooperativeKernelMultiDevice", "cuGraphLaunch", "cuLaunchHostFunc",
};
static CUstream dev_stream[2];
static CUgraphExec graph_big, graph_small;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nothing(void *data)
{
	(void)data;
}

/* A graph of @nodes kernels of @blocks each (built with the driver's own calls). */
static CUgraphExec make_graph(unsigned int nodes, unsigned int blocks)
{
	struct {
		CUDA_KERNEL_NODE_PARAMS p;
		void *kern, *ctx;	/* _v2's tail */
	} np;
	CUgraph g = NULL;
	CUgraphExec e = NULL;
	CUgraphNode n, prev = NULL;

	memset(&np, 0, sizeof(np));
	np.p.func = FN;
	np.p.gridDimX = blocks;
	np.p.gridDimY = np.p.gridDimZ = np.p.blockDimX = np.p.blockDimY = np.p.blockDimZ = 1;
	OK(cuGraphCreate(&g, 0));
	for (unsigned int i = 0; i < nodes; i++) {
		OK(cuGraphAddKernelNode_v2(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &np.p));
		prev = n;
	}
	OK(cuGraphInstantiateWithFlags(&e, g, 0));
	return e;
}

/* Submit @blocks of work through @path on device 0 (and 1 for the multi-device one). */
static void submit(enum path path, unsigned int blocks)
{
	CUlaunchConfig c = { blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, 0 };
	CUDA_LAUNCH_PARAMS list[2];

	switch (path) {
	case P_KERNEL:
		OK(api.launch(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		break;
	case P_EX:
		OK(api.launch_ex(&c, FN, NULL, NULL));
		break;
	case P_COOP:
		OK(api.launch_coop(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL));
		break;
	case P_MULTI:
		for (int d = 0; d < 2; d++)
			list[d] = (CUDA_LAUNCH_PARAMS){ FN, blocks, 1, 1, 1, 1, 1, 0,
							dev_stream[d], NULL };
		OK(api.launch_multi(list, 2, 0));
		break;
	case P_GRAPH:	/* 40 ms as 400 kernels: charged what it took */
		OK(api.graph_launch(blocks > 1 ? graph_big : graph_small, NULL));
		break;
	case P_HOST:	/* the work as a kernel, then the host function */
		if (blocks > 1)
			OK(api.launch(FN, blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		OK(api.host_func(NULL, nothing, NULL));
		break;
	default:
		break;
	}
}

static void sync_all(void)
{
	use(1);
	OK(api.ctx_sync());
	use(0);
	OK(api.ctx_sync());
}

/*
 * 40 ms of work through @path, waited for; then how long the next call of
 * @path held the calling thread, in ns.  At 50 % the first 40 ms leave a
 * debt of about 20 ms, paid back at half speed.
 */
static uint64_t held(enum path path)
{
	use(0);
	submit(path, WORK);
	sync_all();
	uint64_t t0 = now_ns();
	submit(path, 1);
	uint64_t dt = now_ns() - t0;
	sync_all();
	return dt;
}

static void check_held(const char *what, uint64_t dt, int gated)
{
	printf("  %s: the call waited %.1f ms\n", what, (double)dt / MS);
	if (gated)
		CHECK(dt >= 10 * MS, "%s: not gated (%.1f ms)", what, (double)dt / MS);
	else
		CHECK(dt < 8 * MS, "%s: gated without a limit (%.1f ms)", what, (double)dt / MS);
}

/* Captured launches do not run now: they pass, and the capture holds. */
static void captured(int gated)
{
	CUstream s;
	CUgraph g = NULL;
	CUgraphExec e = NULL;
	int status = -1;

	use(0);
	OK(api.stream_create(&s, 0));
	submit(P_KERNEL, WORK);
	sync_all();			/* the grant is over: the next launch would wait */
	OK(cuStreamBeginCapture_v2(s, 0));
	uint64_t t0 = now_ns();
	for (int i = 0; i < 4; i++)
		OK(api.launch(FN, WORK / 4, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
	uint64_t dt = now_ns() - t0;
	OK(cuStreamIsCapturing(s, &status));
	CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capture status %d", status);
	OK(cuStreamEndCapture(s, &g));
	printf("  captured launches: waited %.1f ms\n", (double)dt / MS);
	CHECK(dt < 5 * MS, "captured launches waited %.1f ms", (double)dt / MS);
	/* The graph is gated when it runs. */
	OK(cuGraphInstantiateWithFlags(&e, g, 0));
	sync_all();
	OK(api.graph_launch(e, s));
	sync_all();
	uint64_t t1 = now_ns();
	OK(api.graph_launch(e, s));
	check_held("the captured graph, launched", now_ns() - t1, gated);
	sync_all();
}

void launches(void)
{
	const char *g = getenv("TEST_GATED");
	int gated = !g || strcmp(g, "0");

	for (int d = 0; d < 2; d++) {
		use(d);
		OK(api.stream_create(&dev_stream[d], 0));
	}
	use(0);
	graph_big = make_graph(400, WORK / 400);
	graph_small = make_graph(1, 1);
	for (int p = 0; p < NPATHS; p++) {
		if (!*(void **)((p == P_EX) ? (void *)&api.launch_ex : (void *)&api.launch)) {
			printf("  %s: not at this version\n", path_name[p]);
			continue;
		}
		check_held(path_name[p], held((enum path)p), gated);
	}
	captured(gated);
	/* A forked child starts with no grant, and is held to the share on its own. */
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		check_held("cuLaunchKernel in a forked child", held(P_KERNEL), gated);
		fflush(stdout);
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
}

/*
 * Module mode, GPUs that are not the container's: every launch path is
 * refused (CUDA_ERROR_NOT_PERMITTED) and nothing reaches the GPU.
 */
void launches_refused(void)
{
	CUlaunchConfig c = { 1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0 };
	CUDA_LAUNCH_PARAMS list[2];

	for (int d = 0; d < 2; d++) {
		use(d);
		OK(api.stream_create(&dev_stream[d], 0));
		list[d] = (CUDA_LAUNCH_PARAMS){ FN, 1, 1, 1, 1, 1, 1, 0, dev_stream[d], NULL };
	}
	use(0);
	graph_small = make_graph(1, 1);
	CHECK(api.launch(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchKernel not refused");
	if (api.launch_ex)
		CHECK(api.launch_ex(&c, FN, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
		      "%s", "cuLaunchKernelEx not refused");
	CHECK(api.launch_coop(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchCooperativeKernel not refused");
	CHECK(api.launch_multi(list, 2, 0) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchCooperativeKernelMultiDevice not refused");
	CHECK(api.graph_launch(graph_small, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuGraphLaunch not refused");
	CHECK(api.host_func(NULL, nothing, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchHostFunc not refused");
	use(1);
	CHECK(api.launch(FN, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED,
	      "%s", "cuLaunchKernel on device 1 not refused");
	sync_all();
}
