/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The real CUDA driver (dlopen("libcuda.so.1"), its entry points from the C
 * library's dlsym) and its devices, for the wrappers and the compute gate.
 */
#ifndef GPUSHARE_CUDA_DRIVER_H
#define GPUSHARE_CUDA_DRIVER_H

#include "cuda_abi.h"
#include "lookup.h"

/* The driver's @fn, or NULL (no driver, or it lacks the entry point). */
void *gs_driver_fn(enum gs_fn fn);

/* Call the driver's @fn as type @T; CUDA_ERROR_NOT_FOUND when it has none. */
#define REAL(T, fn, ...) \
	({ T _f = (T)gs_driver_fn(GS_FN_##fn); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

/* The driver's @fn is @p, unless it already had one (a lookup found it). */
void gs_driver_adopt(enum gs_fn fn, void *p);

/* The real driver's entry point @name (NULL if none). */
void *gs_driver_sym(const char *name);

/* Tell the ledger @ordinal's UUID (once; reads it from the driver). */
void gs_cuda_attach(int ordinal);

/* The current context's device, or -1 (no context: the driver will say). */
int gs_current_device(void);

/* @s's device (cuStreamGetDevice where the driver has it), else the current one. */
int gs_stream_device(CUstream s);

/* The device whose default pool @pool is, or -1 (none of them). */
int gs_default_pool_device(CUmemoryPool pool);

#endif /* GPUSHARE_CUDA_DRIVER_H */
