/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVML interception: inside a container with a quota, NVML's memory figures
 * are the container's (total = quota, used = the ledger's used, free =
 * quota - used), so `nvidia-smi` and pynvml show `used / quota`.
 *
 * NOTE FOR THE dlsym WRAPPER (src/ owner): nvidia-smi and pynvml resolve
 * every NVML function with dlsym(handle_of_libnvidia_ml, name), which never
 * searches LD_PRELOAD libraries, so the exported wrappers in nvml.c are
 * only reached by programs linked against libnvidia-ml.  The dlsym (and
 * dlvsym) wrapper must ask gs_nvml_lookup() first:
 *
 *	void *w = gs_nvml_lookup(name);
 *	void *p = real_dlsym(handle, name);
 *	return (w && p) ? w : p;
 *
 * (substitute only when the real lookup found the symbol, so a caller that
 * probes a library which is not NVML still gets NULL).  gs_nvml_lookup()
 * only compares strings: it never calls dlsym and takes no lock, so it is
 * safe to call from inside the wrapper.
 */
#ifndef GPUSHARE_NVML_H
#define GPUSHARE_NVML_H

/* Our wrapper for the NVML function @name, or NULL when we do not wrap it. */
void *gs_nvml_lookup(const char *name);

#endif /* GPUSHARE_NVML_H */
