// SPDX-License-Identifier: Apache-2.0
/*
 * The fake CUDA driver's graphs and stream capture (see fake_cuda.c): a
 * graph is its kernels' durations, run in the order they were added.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "fake_cuda_api.h"

struct CUgraphNode_st { struct CUgraph_st *g; };
struct CUgraph_st {
	uint64_t *ns;			/* kernel durations, in order */
	struct CUgraphNode_st **nodes;
	unsigned n, cap;
};
struct CUgraphExec_st { uint64_t *ns; unsigned n; };

/* Append a kernel of @ns to @g: its node, or NULL (out of memory). */
struct CUgraphNode_st *graph_add(struct CUgraph_st *g, uint64_t ns)
{
	if (g->n == g->cap) {
		unsigned cap = g->cap ? 2 * g->cap : 16;
		uint64_t *a = realloc(g->ns, cap * sizeof(*a));
		if (!a)
			return NULL;
		g->ns = a;
		struct CUgraphNode_st **b = realloc(g->nodes, cap * sizeof(*b));
		if (!b)
			return NULL;
		g->nodes = b;
		g->cap = cap;
	}
	struct CUgraphNode_st *node = malloc(sizeof(*node));
	if (!node)
		return NULL;
	node->g = g;
	g->ns[g->n] = ns;
	g->nodes[g->n++] = node;
	return node;
}

/* ---- graphs and stream capture ---- */

API CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
	if (!g || flags)
		return CUDA_ERROR_INVALID_VALUE;
	*g = calloc(1, sizeof(**g));
	return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuGraphDestroy(CUgraph g)
{
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned int i = 0; i < g->n; i++)
		free(g->nodes[i]);
	free(g->nodes);
	free(g->ns);
	free(g);
	return CUDA_SUCCESS;
}

/* The nodes run in the order they were added: a valid order of @deps. */
API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				  size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
	if (!node || !g || !p || (ndeps && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < ndeps; i++)
		if (!deps[i] || deps[i]->g != g)
			return CUDA_ERROR_INVALID_VALUE;
	if (!p->func)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!p->gridDimX || !p->gridDimY || !p->gridDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	*node = graph_add(g, (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ * ns_per_block);
	return *node ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* _v2's parameters begin with version 1's (then a CUkernel and a context). */
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
				     size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
	return cuGraphAddKernelNode(node, g, deps, ndeps, p);
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	if (!e || !g || flags)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraphExec_st *x = malloc(sizeof(*x));
	uint64_t *ns = malloc((g->n ? g->n : 1) * sizeof(*ns));
	if (!x || !ns) {
		free(x);
		free(ns);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memcpy(ns, g->ns, g->n * sizeof(*ns));
	x->ns = ns;
	x->n = g->n;
	*e = x;
	return CUDA_SUCCESS;
}

/* Before CUDA 12: (exec, graph, error node, log buffer, its size). */
API CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				   size_t logsize)
{
	(void)err;
	if (log && logsize)
		log[0] = 0;
	return cuGraphInstantiateWithFlags(e, g, 0);
}

API CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
				size_t logsize)
{
	return cuGraphInstantiate_v2(e, g, err, log, logsize);
}

API CUresult cuGraphExecDestroy(CUgraphExec e)
{
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	free(e->ns);
	free(e);
	return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec e, CUstream s, int ptsz)
{
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (st->capture) {
		if (st->invalidated)
			return ERR_CAPTURE_INVALIDATED;
		for (unsigned int i = 0; i < e->n; i++)
			if (!graph_add(st->capture, e->ns[i]))
				return CUDA_ERROR_OUT_OF_MEMORY;
		return CUDA_SUCCESS;
	}
	for (unsigned int i = 0; i < e->n; i++)
		gpu_run(st, e->ns[i]);
	return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	return graph_launch(e, s, 0);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
	return graph_launch(e, s, 1);
}

/* The legacy default stream cannot be captured, as with the real driver. */
static CUresult begin_capture(CUstream s, int mode, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (mode < 0 || mode > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if (st >= &legacy[0] && st < &legacy[MAX_DEV])
		return ERR_CAPTURE_UNSUPPORTED;
	if (st->capture)
		return ERR_ILLEGAL_STATE;
	CUgraph g;
	CUresult r = cuGraphCreate(&g, 0);
	if (r != CUDA_SUCCESS)
		return r;
	st->capture = g;
	st->invalidated = 0;
	return CUDA_SUCCESS;
}

API CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	return begin_capture(s, mode, 0);
}

API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
	return begin_capture(s, mode, 1);
}

API CUresult cuStreamBeginCapture(CUstream s)
{
	return begin_capture(s, 0, 0);
}

API CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return begin_capture(s, 0, 1);
}

static CUresult end_capture(CUstream s, CUgraph *g, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!st->capture)
		return ERR_ILLEGAL_STATE;
	*g = st->capture;
	st->capture = NULL;
	if (st->invalidated) {
		cuGraphDestroy(*g);
		*g = NULL;
		return ERR_CAPTURE_INVALIDATED;
	}
	return CUDA_SUCCESS;
}

API CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	return end_capture(s, g, 0);
}

API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	return end_capture(s, g, 1);
}

static CUresult is_capturing(CUstream s, int *status, int ptsz)
{
	struct CUstream_st *st = stream_of(s, ptsz);
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	if (!st)
		return CUDA_ERROR_INVALID_CONTEXT;
	*status = !st->capture ? CU_STREAM_CAPTURE_STATUS_NONE :
		  st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED :
		  CU_STREAM_CAPTURE_STATUS_ACTIVE;
	return CUDA_SUCCESS;
}

API CUresult cuStreamIsCapturing(CUstream s, int *status)
{
	return is_capturing(s, status, 0);
}

API CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status)
{
	return is_capturing(s, status, 1);
}

API CUresult cuStreamGetDevice(CUstream s, CUdevice *d)
{
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = stream_dev(s);
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = dev;
	return CUDA_SUCCESS;
}
