/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The library's own threads (the gate's releaser, the NVML feedback's
 * loader): detached, and deaf to signals, which go to the application's
 * threads, never to these.
 */
#ifndef GPUSHARE_THREAD_H
#define GPUSHARE_THREAD_H

#include <stddef.h>

/*
 * Start fn(arg) on a detached thread with every signal blocked (the
 * caller's mask is as it was on return); @stack: its stack size, 0 for
 * the default.  0, or pthread_create()'s error number.
 */
int gs_thread_start(void *(*fn)(void *), void *arg, size_t stack);

#endif /* GPUSHARE_THREAD_H */
