/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The live allocation table: what each allocation the interposer let
 * through reserved (device, bytes), so that its free releases exactly that.
 * Keyed by (kind, handle): a device pointer, a CUarray, a VMM handle, ...,
 * so handles of different kinds never collide.  A chained hash table under
 * one mutex; every function is thread-safe.  Pure (no CUDA, no ledger), so
 * it is unit-tested on its own.
 */
#ifndef GPUSHARE_TABLE_H
#define GPUSHARE_TABLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gs_kind {
	GS_KIND_MEM,		/* CUdeviceptr: cuMemAlloc*, async, managed */
	GS_KIND_ARRAY,		/* CUarray */
	GS_KIND_MIPMAP,		/* CUmipmappedArray */
	GS_KIND_VMM,		/* CUmemGenericAllocationHandle (cuMemCreate) */
	GS_KIND_POOL,		/* CUmemoryPool -> its device (bytes unused) */
};

struct gs_node;

struct gs_table {
	pthread_mutex_t lock;
	struct gs_node **buckets;
	size_t nbuckets;	/* 0 or a power of two */
	size_t count;
};

#define GS_TABLE_INIT { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }

/*
 * Record @key of @kind as holding @bytes on @dev, replacing an entry with
 * the same key (a handle the driver reuses after a free we did not see).
 * 0, or -1 when memory for the entry cannot be had (nothing recorded).
 */
int gs_table_put(struct gs_table *t, enum gs_kind kind, uint64_t key, int dev,
		 uint64_t bytes);

/* Remove @key's entry and say what it held: true, or false if none. */
bool gs_table_take(struct gs_table *t, enum gs_kind kind, uint64_t key, int *dev,
		   uint64_t *bytes);

/* Same without removing it. */
bool gs_table_get(struct gs_table *t, enum gs_kind kind, uint64_t key, int *dev,
		  uint64_t *bytes);

/* Entries held. */
size_t gs_table_count(struct gs_table *t);

/* Free every entry (the table stays usable). */
void gs_table_clear(struct gs_table *t);

/*
 * In a child after fork: forget the entries without touching them (another
 * thread of the parent may have been changing them at the fork; the copy is
 * left to the child's copy-on-write memory) and make the lock usable again.
 */
void gs_table_forget_after_fork(struct gs_table *t);

#endif /* GPUSHARE_TABLE_H */
