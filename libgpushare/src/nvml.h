/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVML interception: inside a container with a quota, NVML's memory figures
 * are the container's (total = quota, used = the ledger's used, free =
 * quota - used), so `nvidia-smi` and pynvml show `used / quota`.
 *
 * NOTE FOR THE dlsym WRAPPER (cuda.c): nvidia-smi and pynvml resolve every
 * NVML function with dlsym(handle_of_libnvidia_ml, name), which never
 * searches LD_PRELOAD libraries, so the exported wrappers in nvml.c are only
 * reached by programs linked against libnvidia-ml.  nvml.c defines
 * gs_nvml_dlsym (interpose.h), which the dlsym wrapper asks for every
 * lookup that is not CUDA's, passing what the real dlsym found; it answers
 * a wrapper only when the real lookup found the name, so a caller probing a
 * library that is not NVML still gets NULL.  dlvsym should ask it too.
 * gs_nvml_lookup() and gs_nvml_dlsym() only compare strings: they never
 * call dlsym and take no lock, so they are safe inside the wrapper.
 */
#ifndef GPUSHARE_NVML_H
#define GPUSHARE_NVML_H

/* Our wrapper for the NVML function @name, or NULL when we do not wrap it. */
void *gs_nvml_lookup(const char *name);

#endif /* GPUSHARE_NVML_H */
