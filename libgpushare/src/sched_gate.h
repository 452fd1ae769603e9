/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compute gate: every launch (kernels, graphs, host functions) calls
 * gs_sched_gate() before it reaches the driver, and the gate delays the
 * calling thread until its process may submit work to that GPU.  Work is
 * never reordered: only the caller waits.
 *
 * Modes, chosen once at the first launch:
 *  - off: no module registration, and GPUSHARE_ISOLATION memory or none or
 *    no GPUSHARE_CORE_LIMIT in 1..99 on any GPU.  One atomic load.
 *  - module: /dev/gpushare (GPUSHARE_IOC_SCHED) decides, for every process
 *    of the container together.  A device that is not one of the
 *    container's is not gated (said once on stderr).
 *  - standalone: GPUSHARE_CORE_LIMIT, percent per GPU; the process holds
 *    itself to it with the scheduler core (kmod/gs_sched.c) compiled in:
 *    fixed share (policy 3), one entity of weight = the limit, the process
 *    as its one client.  Each process alone: the weaker mode.
 *
 * A grant is process-wide per device: threads share the slice.  The fast
 * path (within a grant) is a clock read and an atomic load; the slow path
 * (the grant is over) drains the work submitted in the slice, measures its
 * GPU time with events, gives the GPU back with that time, and waits for
 * the next grant (one thread at a time; the others wait for its answer).
 * Work submitted to a stream that is being captured does not run now and
 * is not gated (the graph is, when launched).
 *
 * (Named sched_gate.h, not sched.h: the tests build with -Isrc, where a
 * sched.h would stand in for the C library's <sched.h>.)
 */
#ifndef GPUSHARE_SCHED_GATE_H
#define GPUSHARE_SCHED_GATE_H

#include <stdbool.h>

#include "cuda_abi.h"

/*
 * Before a launch on @stream, on CUDA device @ordinal (-1: the current
 * context's).  @per_thread: a _ptsz entry point, whose stream 0 is the
 * per-thread default stream.  CUDA_SUCCESS: launch it;
 * CUDA_ERROR_NOT_PERMITTED: module mode, a device that is not one of the
 * container's (return it to the caller without launching).
 */
CUresult gs_sched_gate(int ordinal, CUstream stream, bool per_thread);

#endif /* GPUSHARE_SCHED_GATE_H */
