/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the interposer's parts share about symbol lookup.  cuda_lookup.c
 * wraps dlsym (the one wrapper: a second definition would clash); NVML's
 * part gets its say through gs_nvml_dlsym.
 */
#ifndef GPUSHARE_INTERPOSE_H
#define GPUSHARE_INTERPOSE_H

/* The C library's dlsym, never the wrapper: for finding the real drivers. */
void *gs_real_dlsym(void *handle, const char *name);

/*
 * Optional, defined by the NVML part: asked by the dlsym wrapper for every
 * lookup that is not one of CUDA's, with what the real dlsym @found.  It
 * returns its wrapper for (@handle, @name) when it has one, else NULL (the
 * real answer is returned).  Weak: the library builds without it.
 */
void *gs_nvml_dlsym(void *handle, const char *name, void *found) __attribute__((weak));

#endif /* GPUSHARE_INTERPOSE_H */
