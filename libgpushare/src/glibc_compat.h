/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bind the C library functions whose default version moved to GLIBC_2.34
 * (libdl and libpthread merged into libc) to their original versions.
 *
 * libgpushare.so is loaded into every process of a container through
 * /etc/ld.so.preload, whatever C library the image has.  Built on glibc
 * 2.34 or later without this, it needs dlopen@GLIBC_2.34 & co., and on an
 * image with an older glibc (Ubuntu 20.04, RHEL 8, many CUDA base images)
 * the dynamic loader refuses *every* program: "version `GLIBC_2.34' not
 * found (required by libgpushare.so)", exit 1.  The old versions are still
 * exported by new glibc (and found in libdl.so.2 / libpthread.so.0 by old
 * ones, which the Makefile keeps as dependencies), so the library loads
 * on both.  Included before everything in each source (-include).
 */
#ifndef GPUSHARE_GLIBC_COMPAT_H
#define GPUSHARE_GLIBC_COMPAT_H

#if defined(__x86_64__)
#define GS_GLIBC_BASE "GLIBC_2.2.5"
#define GS_GLIBC_DLADDR1 "GLIBC_2.3.3"
#elif defined(__aarch64__)
#define GS_GLIBC_BASE "GLIBC_2.17"
#define GS_GLIBC_DLADDR1 "GLIBC_2.17"
#endif

#ifdef GS_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" GS_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" GS_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" GS_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" GS_GLIBC_BASE);
__asm__(".symver dladdr1,dladdr1@" GS_GLIBC_DLADDR1);
__asm__(".symver pthread_once,pthread_once@" GS_GLIBC_BASE);
#endif

#endif /* GPUSHARE_GLIBC_COMPAT_H */
