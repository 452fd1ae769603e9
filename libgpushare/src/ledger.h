/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The interposer's memory ledger: how much of each of the container's GPUs
 * this process may still allocate.  Two backends, chosen once at start:
 *
 *  - module: /dev/gpushare (GPUSHARE_IOC_MEM), shared by every process of
 *    the container, returned by the kernel when a process dies;
 *  - standalone: the quota from GPUSHARE_MEMORY_LIMIT, counted in this
 *    process only (the weaker mode: each process gets the whole quota).
 *
 * A GPU is named by its CUDA device ordinal in this process.  Standalone
 * (and off), a device with no quota (isolation none, or not one of the
 * listed GPUs) is unlimited: reserve always succeeds and the views report
 * the driver's own figures.  In module mode a device that cannot be
 * matched to one of the registration's quotas (its UUID not in
 * GPUSHARE_GPU_UUIDS, or that list not exactly as long as the
 * registration) is refused: reserve fails (one line on stderr per device)
 * and the views report a quota of 0.  Every function is thread-safe and
 * async-signal-unsafe (a signal handler must not call them, nor any CUDA
 * entry point the interposer wraps).
 */
#ifndef GPUSHARE_LEDGER_H
#define GPUSHARE_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "env.h"

struct gpushare_sched;

/* Which backend holds the ledger (for logs and tests). */
enum gs_ledger_mode {
	GS_LEDGER_OFF,		/* no quota anywhere: pass everything through */
	GS_LEDGER_MODULE,
	GS_LEDGER_STANDALONE,
};

enum gs_ledger_mode gs_ledger_mode(void);

/*
 * Map the driver's device to its quota: @uuid is the 16 raw bytes of
 * cuDeviceGetUuid for CUDA ordinal @ordinal.  Called by the CUDA wrappers
 * the first time they see a device, before any reserve on it.
 */
void gs_ledger_attach(int ordinal, const unsigned char uuid[16]);

/* Module mode: @ordinal is not one of the container's GPUs (nothing fits). */
bool gs_ledger_refused(int ordinal);

/* The quota of @ordinal in bytes (0 when refused), or false when unlimited. */
bool gs_ledger_quota(int ordinal, uint64_t *quota);

/*
 * Quota and bytes in use on @ordinal (by the container with the module,
 * by this process standalone).  false when unlimited.
 */
bool gs_ledger_view(int ordinal, uint64_t *quota, uint64_t *used);

/* Same, for a device named by its NVML UUID string ("GPU-xxxxxxxx-..."). */
bool gs_ledger_view_uuid(const char *uuid, uint64_t *quota, uint64_t *used);

/* Reserve @bytes on @ordinal: 0, or -1 over the quota (nothing reserved). */
int gs_ledger_reserve(int ordinal, uint64_t bytes);

/* Give back @bytes reserved earlier on @ordinal. */
void gs_ledger_release(int ordinal, uint64_t bytes);

/* The UUID @ordinal was attached with ("GPU-..."); false when not attached. */
bool gs_ledger_uuid(int ordinal, char out[GS_UUID_MAX]);

/*
 * Module mode: the compute weights of the registration, in the container's
 * GPU order; the count (0 in the other modes).
 */
int gs_ledger_weights(uint32_t *out, int max);

/*
 * Module mode: GPUSHARE_IOC_SCHED on @ordinal's GPU, on the ledger's
 * descriptor (@s's op, flags and used_ns filled in by the caller; size and
 * gpu here).  0, or -1 with errno: the ioctl's, or ENODEV when @ordinal is
 * not one of the container's GPUs (as for memory: refused), ENOSYS when
 * not in module mode.  The lock is not held across the call (ACQUIRE
 * blocks).
 */
int gs_ledger_sched(int ordinal, struct gpushare_sched *s);

/*
 * Module mode, the registration is gone (GPUSHARE_IOC_SCHED or MEM said
 * ENOENT): open /dev/gpushare again, for a registration made since (a
 * container registered again under its ID is a new registration; the old
 * descriptor acts for the deleted one for ever).  0: the new descriptor
 * answered QUERY and replaced the old one (the quotas, weights and GPU
 * indexes are the new registration's); -1: none (the old one is kept).
 * The caller limits how often it asks (an open and a QUERY each time).
 */
int gs_ledger_reopen(void);

#endif /* GPUSHARE_LEDGER_H */
