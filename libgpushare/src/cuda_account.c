// SPDX-License-Identifier: Apache-2.0
/* The memory wrappers' accounting (cuda_account.h): the table and the ledger. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "cuda_abi.h"
#include "cuda_account.h"
#include "cuda_driver.h"
#include "ledger.h"
#include "table.h"

struct gs_table gs_alloc_table = GS_TABLE_INIT;

static void cuda_child_after_fork(void)
{
	/* The parent's allocations are not the child's to free (ledger.c). */
	gs_table_forget_after_fork(&gs_alloc_table);
}

__attribute__((constructor)) static void cuda_setup(void)
{
	pthread_atfork(NULL, NULL, cuda_child_after_fork);
}

CUresult gs_alloc_admit(int dev, uint64_t bytes, bool *counted)
{
	*counted = false;
	if (dev < 0 || gs_ledger_mode() == GS_LEDGER_OFF)
		return CUDA_SUCCESS;
	gs_cuda_attach(dev);
	if (gs_ledger_reserve(dev, bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*counted = true;
	return CUDA_SUCCESS;
}

void gs_alloc_settle(CUresult r, bool counted, enum gs_kind kind, uint64_t key, int dev,
		     uint64_t bytes)
{
	if (!counted)
		return;
	if (r != CUDA_SUCCESS) {
		gs_ledger_release(dev, bytes);
		return;
	}
	if (gs_table_put(&gs_alloc_table, kind, key, dev, bytes))
		/* No memory for the record: the bytes stay reserved (a leak of
		 * quota, never an overrun) until the process exits. */
		fprintf(stderr, "gpushare: out of memory recording an allocation\n");
}

bool gs_alloc_gone(CUresult r, enum gs_kind kind)
{
	return r == CUDA_ERROR_INVALID_VALUE ||
	       (r == CUDA_ERROR_INVALID_HANDLE && (kind == GS_KIND_ARRAY || kind == GS_KIND_MIPMAP));
}

void gs_alloc_freed(CUresult r, bool had, enum gs_kind kind, uint64_t key, int dev,
		    uint64_t bytes)
{
	if (!had)
		return;
	if (r == CUDA_SUCCESS || gs_alloc_gone(r, kind))
		gs_ledger_release(dev, bytes);
	else if (gs_table_put(&gs_alloc_table, kind, key, dev, bytes))
		gs_ledger_release(dev, bytes);
}
