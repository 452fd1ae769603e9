/* SPDX-License-Identifier: Apache-2.0 */
/* The /dev/gpushare stand-in's parts (fake_gsdev.c, fake_gsdev_sched.c): what
 * they share. */
#ifndef FAKE_GSDEV_H
#define FAKE_GSDEV_H

#include <stdint.h>

#include <uapi/gpushare.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_FILES 64
#define MAX_FDS 1024

/* The memory ledger, in FAKEGS_STATE: shared by the container's processes. */
struct state {
	uint64_t used[GPUSHARE_MAX_GPUS];	/* by GPU index */
	uint32_t next_file;
	uint64_t mine[MAX_FILES][GPUSHARE_MAX_GPUS];
	int32_t opener[MAX_FILES];		/* pid */
};

/* fake_gsdev.c's */
HIDDEN extern struct state *st;
HIDDEN extern struct gpushare_quota quotas[GPUSHARE_MAX_GPUS];
HIDDEN extern int nquotas;
HIDDEN extern const char *container;	/* FAKEGS_CONTAINER */
/* The index in quotas[] of @gpu's quota, or -1. */
HIDDEN int quota_index(uint32_t gpu);
/* The ABI version it answers as (FAKEGS_ABI). */
HIDDEN uint32_t abi_version(void);

/* fake_gsdev_sched.c's */
/* Map the schedule (FAKEGS_SCHED), initialised by the first process. */
HIDDEN void sched_setup(void);
/* GPUSHARE_IOC_SCHED on open file @file (numbered from 1). */
HIDDEN int sched(int file, struct gpushare_sched *a);
HIDDEN void sched_close(int file);

#endif /* FAKE_GSDEV_H */
