/* SPDX-License-Identifier: Apache-2.0 */
/* The fake CUDA driver's parts (see fake_cuda.c): what they share. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../../src/cuda_abi.h"

#define API __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_DEV 8

struct CUctx_st { int dev; int primary; };
struct CUmemPoolHandle_st { int dev; };

struct CUstream_st {
	int dev;
	_Atomic uint64_t end;		/* when its last work ends */
	unsigned hostfns;		/* host functions not run yet (hlock) */
	struct CUgraph_st *capture;	/* the graph it captures into, or NULL */
	int invalidated;		/* the capture failed */
};

/* Driver errors beyond what cuda_abi.h declares. */
enum {
	ERR_ILLEGAL_STATE = 401,
	ERR_CAPTURE_UNSUPPORTED = 900,
	ERR_CAPTURE_INVALIDATED = 901,
	ERR_CAPTURED_EVENT = 907,
};

/* fake_cuda.c: setup, devices, contexts */
HIDDEN extern uint64_t devmem;		/* bytes of memory per device */
HIDDEN extern struct CUmemPoolHandle_st defpool[MAX_DEV];
HIDDEN extern _Thread_local CUcontext current;
HIDDEN extern int initialized;
HIDDEN int cur_dev(void);
HIDDEN int bad_dev(CUdevice d);

/* fake_cuda_mem.c: memory */
HIDDEN extern _Atomic uint64_t used[MAX_DEV];	/* each device's memory in use */
HIDDEN extern pthread_mutex_t lock;	/* allocations, VMM handles and mappings */
/* Take @bytes of device @dev's memory: 0, or -1 when it has no more. */
HIDDEN int take(int dev, size_t bytes);
/* Give back @bytes of device @dev's memory. */
HIDDEN void unuse(int dev, size_t bytes);

/* fake_cuda_gpu.c: the simulated GPU */
HIDDEN extern uint64_t ns_per_block;
HIDDEN extern struct CUstream_st legacy[MAX_DEV];
HIDDEN extern _Atomic uint64_t proc_end[MAX_DEV];	/* this process's last work */
HIDDEN void gpu_setup(void);
HIDDEN uint64_t now_ns(void);
HIDDEN void sleep_until(uint64_t t);
HIDDEN uint64_t max64(uint64_t a, uint64_t b);
HIDDEN void atomic_max64(_Atomic uint64_t *v, uint64_t x);
HIDDEN struct CUstream_st *stream_of(CUstream s, int ptsz);
HIDDEN int stream_dev(CUstream s);
/* Device @dev's memory in use changed: tell the record. */
HIDDEN void mem_note(int dev);
/* A context on @dev: NVML lists the process there. */
HIDDEN void ctx_note(int dev);
HIDDEN void gpu_run(struct CUstream_st *st, uint64_t ns);

/* fake_cuda_launch.c: host functions */
/* Wait for the host functions of @st (NULL: of the process) to have run. */
HIDDEN void host_wait(struct CUstream_st *st);
HIDDEN int host_pending(struct CUstream_st *st);

/* fake_cuda_graph.c */
/* Append a kernel of @ns to @g: its node, or NULL (out of memory). */
HIDDEN struct CUgraphNode_st *graph_add(struct CUgraph_st *g, uint64_t ns);

#endif /* FAKE_CUDA_H */
