// SPDX-License-Identifier: Apache-2.0
/*
 * The compute tests' workload: launches kernels on the fake driver's
 * simulated GPU as an application would, through libgpushare.so when it
 * is preloaded.
 *
 *   compute_load PATH KERNEL_US SECONDS [DEVICE [LOOKUP]]
 *
 * PATH    kernel  cuLaunchKernel            ex     cuLaunchKernelEx
 *         coop    cuLaunchCooperativeKernel multi  ...KernelMultiDevice
 *         graph   a graph of kernel nodes (cuGraphAddKernelNode)
 *         capture the same graph made by stream capture
 *         host    cuLaunchKernel then cuLaunchHostFunc, each time
 * KERNEL_US   each kernel's duration (its grid has that many blocks: the
 *             fake runs a block in FAKECUDA_NS_PER_BLOCK, default 1 us)
 * SECONDS     how long to launch (fractions allowed)
 * DEVICE      CUDA ordinal (default 0)
 * LOOKUP      how the launch and synchronisation entry points are found:
 *             direct (linked, the default), dlsym (dlopen + dlsym), proc
 *             (cuGetProcAddress_v2) or ptds (cuGetProcAddress_v2 asking for
 *             the per-thread default stream's variants, the _ptsz ones,
 *             launching on stream 0: the thread's default stream)
 *
 * Environment:
 *   COMPUTE_LOAD_T0          CLOCK_MONOTONIC ns: start the launches then,
 *                            after the set-up, so that several loads overlap
 *   COMPUTE_LOAD_TRACE_MS    sample the GPU time submitted every that many
 *                            ms ("trace")
 *   COMPUTE_LOAD_GRAPH_NODES kernels per graph (default 16): a graph launch
 *                            is NODES * KERNEL_US of GPU time
 *   COMPUTE_LOAD_IN_FLIGHT   the queue depth Q, in kernels (default 64)
 *   COMPUTE_LOAD_STREAMS     path kernel: launch round robin on that many
 *                            streams (default 1, at most 16)
 *   COMPUTE_LOAD_WINDOW      1: a window application (below); unset or 0:
 *                            a batch application
 *
 * The queue is bounded by Q kernels, as a real application bounds it.  A
 * batch application launches until Q are queued, then synchronises the
 * stream (the queue empties before it launches again).  A window
 * application (PyTorch-like) keeps at most Q in flight: it records an
 * event after each launch, in a ring, and before a launch that would put
 * more than Q in flight it waits (cuEventSynchronize) for the oldest, so
 * the queue never empties while it runs.  A graph launch counts its
 * nodes; one launch always goes, however long.  The last line:
 *   RESULT {"gpu_ns": N, "wall_ns": N, "launches": N, ...}
 * gpu_ns: the kernel time the fake ran for this process (all of it has
 * completed: the load synchronises before it reports); wall_ns: from the
 * first launch to that synchronisation; launches: launch calls made;
 * first_ns: how long the first launch call took (a gate's first grant);
 * in_flight, window: the queue depth Q and whether it was a window.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

#define GRAPH_NODES 16		/* default */
#define IN_FLIGHT 64		/* default */
#define MAX_IN_FLIGHT 65536
#define MAX_TRACE 4096

/* The driver entry points this program links (the fake's). */
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
				 const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, unsigned int,
				   CUstream, void **);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *, unsigned int,
					      unsigned int);
CUresult cuLaunchHostFunc(CUstream, CUhostFn, void *);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
			     CUdriverProcAddressQueryResult *);
uint64_t fakecuda_busy_ns(void);	/* the fake's: kernel time submitted */

static struct {
	cuLaunchKernel_t launch;
	cuLaunchKernelEx_t ex;
	cuLaunchCooperativeKernel_t coop;
	cuLaunchCooperativeKernelMultiDevice_t multi;
	cuLaunchHostFunc_t host;
	cuGraphLaunch_t graph;
	CUresult (*sync)(CUstream);
	CUresult (*record)(CUevent, CUstream);
	CUresult (*begin_capture)(CUstream, int);
	CUresult (*end_capture)(CUstream, CUgraph *);
} api;

static void check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "compute_load: %s: error %d\n", what, r);
		exit(1);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Find @name (driver version 12.9's meaning) the way @how says. */
static void *entry(const char *how, const char *name, const char *versioned, void *direct)
{
	void *p = NULL;
	if (!strcmp(how, "direct")) {
		p = direct;
	} else if (!strcmp(how, "dlsym")) {
		void *h = dlopen("libcuda.so.1", RTLD_NOW);
		p = h ? dlsym(h, versioned) : NULL;
	} else if (!strcmp(how, "proc") || !strcmp(how, "ptds")) {
		CUdriverProcAddressQueryResult st;
		cuuint64_t flags = strcmp(how, "ptds") ? CU_GET_PROC_ADDRESS_DEFAULT :
				   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
		check(cuGetProcAddress_v2(name, &p, 12090, flags, &st), name);
	} else {
		fprintf(stderr, "compute_load: unknown lookup %s\n", how);
		exit(2);
	}
	if (!p) {
		fprintf(stderr, "compute_load: %s not found by %s\n", name, how);
		exit(1);
	}
	return p;
}

static void resolve(const char *how)
{
	api.launch = (cuLaunchKernel_t)entry(how, "cuLaunchKernel", "cuLaunchKernel",
					     (void *)cuLaunchKernel);
	api.ex = (cuLaunchKernelEx_t)entry(how, "cuLaunchKernelEx", "cuLaunchKernelEx",
					   (void *)cuLaunchKernelEx);
	api.coop = (cuLaunchCooperativeKernel_t)entry(how, "cuLaunchCooperativeKernel",
						      "cuLaunchCooperativeKernel",
						      (void *)cuLaunchCooperativeKernel);
	api.multi = (cuLaunchCooperativeKernelMultiDevice_t)entry(
		how, "cuLaunchCooperativeKernelMultiDevice",
		"cuLaunchCooperativeKernelMultiDevice",
		(void *)cuLaunchCooperativeKernelMultiDevice);
	api.host = (cuLaunchHostFunc_t)entry(how, "cuLaunchHostFunc", "cuLaunchHostFunc",
					     (void *)cuLaunchHostFunc);
	api.graph = (cuGraphLaunch_t)entry(how, "cuGraphLaunch", "cuGraphLaunch",
					   (void *)cuGraphLaunch);
	api.sync = (CUresult (*)(CUstream))entry(how, "cuStreamSynchronize",
						 "cuStreamSynchronize",
						 (void *)cuStreamSynchronize);
	api.record = (CUresult (*)(CUevent, CUstream))entry(how, "cuEventRecord", "cuEventRecord",
							      (void *)cuEventRecord);
	api.begin_capture = (CUresult (*)(CUstream, int))entry(
		how, "cuStreamBeginCapture", "cuStreamBeginCapture_v2",
		(void *)cuStreamBeginCapture_v2);
	api.end_capture = (CUresult (*)(CUstream, CUgraph *))entry(
		how, "cuStreamEndCapture", "cuStreamEndCapture", (void *)cuStreamEndCapture);
}

/* Host functions check they run in submission order. */
static _Atomic uint64_t host_ran;
static _Atomic int host_disorder;

static void host_fn(void *data)
{
	uint64_t want = (uint64_t)(uintptr_t)data;
	if (atomic_fetch_add(&host_ran, 1) != want)
		atomic_store(&host_disorder, 1);
}

static char kernel_code;	/* the fake runs any non-NULL function */
#define KERNEL ((CUfunction)(void *)&kernel_code)

static unsigned int graph_nodes = GRAPH_NODES;

/* A window application's launches in flight: an event after each, in a ring. */
static struct {
	CUevent *ev;
	unsigned int *kernels;		/* each launch's */
	unsigned int cap, first, n;	/* the ring: capacity, oldest, launches */
	uint64_t in_flight;		/* kernels */
} win;

static void window_setup(unsigned int depth)
{
	win.ev = calloc(depth, sizeof(*win.ev));
	win.kernels = calloc(depth, sizeof(*win.kernels));
	if (!win.ev || !win.kernels) {
		fprintf(stderr, "compute_load: out of memory\n");
		exit(1);
	}
	for (unsigned int i = 0; i < depth; i++)
		check(cuEventCreate(&win.ev[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	win.cap = depth;
}

/* Before a launch of @k kernels: wait for the oldest until it fits in @depth. */
static void window_wait(uint64_t k, uint64_t depth)
{
	while (win.n && (win.in_flight + k > depth || win.n == win.cap)) {
		check(cuEventSynchronize(win.ev[win.first]), "cuEventSynchronize");
		win.in_flight -= win.kernels[win.first];
		win.first = (win.first + 1) % win.cap;
		win.n--;
	}
}

/* After a launch of @k kernels on @s. */
static void window_push(CUstream s, unsigned int k)
{
	unsigned int i = (win.first + win.n) % win.cap;
	check(api.record(win.ev[i], s), "cuEventRecord");
	win.kernels[i] = k;
	win.n++;
	win.in_flight += k;
}

static CUgraphExec make_graph(const char *path, CUstream s, unsigned int us)
{
	CUgraph g;
	CUgraphExec e;
	if (!strcmp(path, "graph")) {
		CUgraphNode prev = NULL, node;
		check(cuGraphCreate(&g, 0), "cuGraphCreate");
		for (unsigned int i = 0; i < graph_nodes; i++) {
			CUDA_KERNEL_NODE_PARAMS p = { .func = KERNEL, .gridDimX = us,
						      .gridDimY = 1, .gridDimZ = 1,
						      .blockDimX = 32, .blockDimY = 1,
						      .blockDimZ = 1 };
			check(cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL,
						      prev ? 1 : 0, &p),
			      "cuGraphAddKernelNode_v2");
			prev = node;
		}
	} else {
		check(api.begin_capture(s, 0), "cuStreamBeginCapture_v2");
		for (unsigned int i = 0; i < graph_nodes; i++)
			check(api.launch(KERNEL, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL),
			      "cuLaunchKernel (capture)");
		check(api.end_capture(s, &g), "cuStreamEndCapture");
	}
	check(cuGraphInstantiateWithFlags(&e, g, 0), "cuGraphInstantiateWithFlags");
	return e;
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc > 6) {
		fprintf(stderr, "usage: compute_load kernel|ex|coop|multi|graph|capture|host "
				"KERNEL_US SECONDS [DEVICE [direct|dlsym|proc|ptds]]\n");
		return 2;
	}
	const char *path = argv[1];
	unsigned int us = (unsigned int)strtoul(argv[2], NULL, 10);
	uint64_t run_ns = (uint64_t)(strtod(argv[3], NULL) * 1e9);
	int dev = argc > 4 ? atoi(argv[4]) : 0;
	const char *how = argc > 5 ? argv[5] : "direct";
	const char *t0s = getenv("COMPUTE_LOAD_T0"), *trs = getenv("COMPUTE_LOAD_TRACE_MS");
	uint64_t trace_ns = trs ? strtoull(trs, NULL, 10) * 1000000u : 0;
	static uint64_t trace[MAX_TRACE];
	unsigned int ntrace = 0;

	CUcontext ctx;
	CUstream s;
	check(cuInit(0), "cuInit");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	check(cuStreamCreate(&s, 0), "cuStreamCreate");
	resolve(how);
	if (!strcmp(how, "ptds"))
		s = NULL;	/* with a _ptsz entry point: the per-thread stream */

	const char *gn = getenv("COMPUTE_LOAD_GRAPH_NODES");
	if (gn && atoi(gn) > 0)
		graph_nodes = (unsigned int)atoi(gn);
	const char *qs = getenv("COMPUTE_LOAD_IN_FLIGHT"), *ws = getenv("COMPUTE_LOAD_WINDOW");
	unsigned int depth = qs && *qs ? (unsigned int)strtoul(qs, NULL, 10) : IN_FLIGHT;
	int window = ws && *ws && strcmp(ws, "0");
	if (!depth || depth > MAX_IN_FLIGHT) {
		fprintf(stderr, "compute_load: COMPUTE_LOAD_IN_FLIGHT: 1..%d\n", MAX_IN_FLIGHT);
		return 2;
	}
	if (window)
		window_setup(depth);
	const char *ns = getenv("COMPUTE_LOAD_STREAMS");
	unsigned int nstreams = ns && *ns ? (unsigned int)strtoul(ns, NULL, 10) : 1;
	CUstream streams[16] = { s };
	if (!nstreams || nstreams > 16) {
		fprintf(stderr, "compute_load: COMPUTE_LOAD_STREAMS: 1..16\n");
		return 2;
	}
	for (unsigned int i = 1; i < nstreams; i++)
		check(cuStreamCreate(&streams[i], 0), "cuStreamCreate");
	int graph = !strcmp(path, "graph") || !strcmp(path, "capture");
	unsigned int per_launch = graph ? graph_nodes : 1;	/* kernels */
	CUgraphExec exec = graph ? make_graph(path, s, us) : NULL;
	CUlaunchConfig cfg = { .gridDimX = us, .gridDimY = 1, .gridDimZ = 1,
			       .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
			       .hStream = s };
	CUDA_LAUNCH_PARAMS multi = { .function = KERNEL, .gridDimX = us, .gridDimY = 1,
				     .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
				     .blockDimZ = 1, .hStream = s };
	int host = !strcmp(path, "host");
	if (!graph && !host && strcmp(path, "kernel") && strcmp(path, "ex") &&
	    strcmp(path, "coop") && strcmp(path, "multi")) {
		fprintf(stderr, "compute_load: unknown path %s\n", path);
		return 2;
	}

	if (t0s) {
		uint64_t t0 = strtoull(t0s, NULL, 10);
		struct timespec ts = { (time_t)(t0 / 1000000000u), (long)(t0 % 1000000000u) };
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	uint64_t busy0 = fakecuda_busy_ns(), start = now_ns(), next_trace = start + trace_ns;
	uint64_t launches = 0, queued = 0, last = busy0, first = 0;
	while (now_ns() - start < run_ns) {
		CUresult r;
		if (window)
			window_wait(per_launch, depth);
		if (!strcmp(path, "kernel"))
			s = streams[launches % nstreams];
		if (!strcmp(path, "kernel") || host)
			r = api.launch(KERNEL, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
		else if (!strcmp(path, "ex"))
			r = api.ex(&cfg, KERNEL, NULL, NULL);
		else if (!strcmp(path, "coop"))
			r = api.coop(KERNEL, us, 1, 1, 32, 1, 1, 0, s, NULL);
		else if (!strcmp(path, "multi"))
			r = api.multi(&multi, 1, 0);
		else
			r = api.graph(exec, s);
		check(r, path);
		if (!launches)
			first = now_ns() - start;
		if (host)
			check(api.host(s, host_fn, (void *)(uintptr_t)launches), "cuLaunchHostFunc");
		launches++;
		if (window) {
			window_push(s, per_launch);
		} else if ((queued += per_launch) >= depth) {
			for (unsigned int i = 0; i < nstreams; i++)
				check(api.sync(streams[i]), "cuStreamSynchronize");
			queued = 0;
		}
		if (trace_ns && now_ns() >= next_trace && ntrace < MAX_TRACE) {
			uint64_t b = fakecuda_busy_ns();
			trace[ntrace++] = b - last;
			last = b;
			next_trace += trace_ns;
		}
	}
	for (unsigned int i = 0; i < nstreams; i++)
		check(api.sync(streams[i]), "cuStreamSynchronize");
	uint64_t wall = now_ns() - start;
	uint64_t gpu = fakecuda_busy_ns() - busy0;

	printf("RESULT {\"path\": \"%s\", \"lookup\": \"%s\", \"gpu_ns\": %llu, "
	       "\"wall_ns\": %llu, \"launches\": %llu, \"kernels\": %llu, "
	       "\"start_ns\": %llu, \"first_ns\": %llu, \"host_ran\": %llu, \"host_disorder\": %d, "
	       "\"in_flight\": %u, \"window\": %d, \"trace\": [",
	       path, how, (unsigned long long)gpu, (unsigned long long)wall,
	       (unsigned long long)launches, (unsigned long long)(launches * per_launch),
	       (unsigned long long)start, (unsigned long long)first,
	       (unsigned long long)atomic_load(&host_ran),
	       atomic_load(&host_disorder), depth, window);
	for (unsigned int i = 0; i < ntrace; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)trace[i]);
	printf("]}\n");
	return 0;
}
