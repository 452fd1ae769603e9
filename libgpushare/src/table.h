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
struct gs_map;

struct gs_table {
	pthread_mutex_t lock;
	struct gs_node **buckets;
	size_t nbuckets;	/* 0 or a power of two */
	size_t count;
	struct gs_map *maps;	/* VMM mappings, unordered */
	size_t nmaps, capmaps;
	uint64_t next_token;	/* gs_vmm_unmap_begin's */
};

#define GS_TABLE_INIT { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, NULL, 0, 0, 0 }

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
 * ---- VMM: a handle's bytes are held until it is released AND unmapped ----
 *
 * As the driver keeps a cuMemCreate allocation's memory until cuMemRelease
 * has been called and its last mapping is unmapped, a GS_KIND_VMM entry
 * carries a count of references: each mapping of it recorded here, and each
 * hold taken across a driver call.  At cuMemRelease the entry leaves the
 * hash (the driver may hand its handle value out again) and lives on,
 * referenced by its mappings, until the last reference is dropped; only then
 * are its bytes to be released.  A hold is a pointer to the entry.
 */

/*
 * Before cuMemMap of @handle: a hold on its entry, so that its bytes cannot
 * go before the map is settled; NULL if @handle is not in the table.
 */
struct gs_node *gs_vmm_hold(struct gs_table *t, uint64_t handle);

/*
 * The map of [@va, @va + @size) succeeded: @hold becomes that mapping.
 * 0, or -1 when there is no memory for it (the hold is then kept for
 * good: the bytes stay held, never released too early).
 */
int gs_vmm_mapped(struct gs_table *t, struct gs_node *hold, uint64_t va, uint64_t size);

/*
 * Drop @hold (a map that failed, a release that went through).  True, with
 * what the entry held, when that was the last reference to a released
 * entry: release those bytes.
 */
bool gs_vmm_drop(struct gs_table *t, struct gs_node *hold, int *dev, uint64_t *bytes);

/*
 * Before cuMemRelease of @handle: take its entry out of the hash, marked
 * released, and return a hold on it; NULL if @handle is not in the table.
 * After the driver answered: gs_vmm_drop(hold) if the handle is gone, or
 * gs_vmm_unrelease(hold) if the driver refused and still has it.
 */
struct gs_node *gs_vmm_release(struct gs_table *t, uint64_t handle);
void gs_vmm_unrelease(struct gs_table *t, struct gs_node *hold);

/*
 * Before cuMemUnmap of [@va, @va + @size): mark the mappings recorded in the
 * range as being unmapped, and return a token for gs_vmm_unmap_end (0: none,
 * a range never mapped through us).  A mapping only partly in the range is
 * split, and only its part inside is marked: the rest stays mapped, and keeps
 * the handle's bytes held (the real driver refuses such an unmap; should one
 * pass, the bytes are held until every part is gone).  If there is no memory
 * to split it, it is left whole and unmarked.
 */
uint64_t gs_vmm_unmap_begin(struct gs_table *t, uint64_t va, uint64_t size);

/*
 * After the driver answered cuMemUnmap: when @ok, forget the marked
 * mappings and call @release (outside the lock) for each released entry
 * whose last mapping that was; else unmark them (they are mapped still).
 */
void gs_vmm_unmap_end(struct gs_table *t, uint64_t token, bool ok,
		      void (*release)(int dev, uint64_t bytes));

/* Mappings recorded (for tests). */
size_t gs_vmm_count_maps(struct gs_table *t);

/*
 * In a child after fork: forget the entries without touching them (another
 * thread of the parent may have been changing them at the fork; the copy is
 * left to the child's copy-on-write memory) and make the lock usable again.
 */
void gs_table_forget_after_fork(struct gs_table *t);

#endif /* GPUSHARE_TABLE_H */
