/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Accounting of the memory wrappers.  An allocation reserves its bytes in
 * the ledger before the driver is called (over the quota:
 * CUDA_ERROR_OUT_OF_MEMORY, the driver is not called, nothing is
 * reserved), releases them if the driver fails, and is recorded (handle ->
 * device, bytes) so that its free releases exactly that.  A device is the
 * current context's (cuCtxGetDevice), or the stream's, pool's or
 * allocation property's where the call names one.  Choices (README.md):
 * async frees release when cuMemFreeAsync is called; arrays count an
 * estimate from their descriptor; managed memory is refused unless
 * GPUSHARE_ALLOW_MANAGED=1; after fork the child's table starts empty; VMM
 * memory is held until released and unmapped.
 */
#ifndef GPUSHARE_CUDA_ACCOUNT_H
#define GPUSHARE_CUDA_ACCOUNT_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "table.h"

/* The live allocations (and pools, and VMM handles) of this process. */
extern struct gs_table gs_alloc_table;

/*
 * Before an allocation of @bytes on @dev: CUDA_SUCCESS (*counted says
 * whether the ledger holds a reservation for it) or CUDA_ERROR_OUT_OF_MEMORY.
 */
CUresult gs_alloc_admit(int dev, uint64_t bytes, bool *counted);

/* After the driver answered @r: record the allocation, or give it back. */
void gs_alloc_settle(CUresult r, bool counted, enum gs_kind kind, uint64_t key, int dev,
		     uint64_t bytes);

/*
 * The driver refused to free @key because it holds no such allocation any
 * more (freed behind our back: a double free racing with the allocation
 * that reused the address, a context destroyed).  Its record must go, or
 * its bytes would stay reserved for good.
 */
bool gs_alloc_gone(CUresult r, enum gs_kind kind);

/*
 * After the free answered @r: release; or record it again if it failed
 * with the allocation still there.
 */
void gs_alloc_freed(CUresult r, bool had, enum gs_kind kind, uint64_t key, int dev,
		    uint64_t bytes);

/*
 * Free @key of @kind by evaluating @call (the driver's free), returning its
 * answer: the record goes before the call (the driver may hand the value
 * out again at once), gs_alloc_freed() settles after it.
 */
#define FREE_RECORDED(kind, key, call) ({					\
	int _dev;								\
	uint64_t _bytes;							\
	bool _had = gs_table_take(&gs_alloc_table, kind, key, &_dev, &_bytes);	\
	CUresult _r = (call);							\
	gs_alloc_freed(_r, _had, kind, key, _dev, _bytes);			\
	_r; })

#endif /* GPUSHARE_CUDA_ACCOUNT_H */
