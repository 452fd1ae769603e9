/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ledger's module backend (ledger.c): the open /dev/gpushare file and
 * what its QUERY said of the registration (each position's quota, the
 * module's GPU index, the compute weight), in the container's GPU order.
 * The ledger's lock serialises connect, reconnect and forget; the ioctls
 * themselves run without it, as they always have.
 */
#ifndef GPUSHARE_LEDGER_DEV_H
#define GPUSHARE_LEDGER_DEV_H

#include <stdint.h>

#include "env.h"

struct gpushare_mem;
struct gpushare_sched;

/*
 * Open /dev/gpushare and QUERY the registration: its number of GPUs, with
 * their quotas in @quota; 0 when there is none, or the module has no
 * memory ledger (nothing is kept open).
 */
int gs_dev_connect(uint64_t quota[GS_MAX_GPUS]);

/*
 * Open /dev/gpushare again, for a registration made since: 0, with the new
 * one's count in *@count and quotas in @quota, the new file under the old
 * one's number; -1 with everything (the old file, @quota) as it was.
 */
int gs_dev_reconnect(uint64_t quota[GS_MAX_GPUS], int *count);

/* fork's child: close the parent's file (its reservations), keep nothing. */
void gs_dev_forget(void);

/* GPUSHARE_IOC_MEM @op of @bytes on position @slot's GPU. */
int gs_dev_mem(uint32_t op, int slot, uint64_t bytes, struct gpushare_mem *m);

/* The module's GPU index of position @slot. */
uint32_t gs_dev_gpu(int slot);

/* The file, to use outside the ledger's lock (gs_dev_sched). */
int gs_dev_fd(void);

/* GPUSHARE_IOC_SCHED on @fd for position @slot's GPU (size and gpu set here). */
int gs_dev_sched(int fd, int slot, struct gpushare_sched *s);

/* The compute weights of the first @n positions. */
void gs_dev_weights(uint32_t *out, int n);

#endif /* GPUSHARE_LEDGER_DEV_H */
