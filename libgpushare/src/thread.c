// SPDX-License-Identifier: Apache-2.0
/* The library's own threads (see thread.h). */
#include <pthread.h>
#include <signal.h>

#include "thread.h"

/*
 * Bound to their versions before 2.34 as glibc_compat.h binds the others
 * (the library must load under an older glibc than the build host's).
 */
#if defined(GS_GLIBC_BASE)
__asm__(".symver pthread_create,pthread_create@" GS_GLIBC_BASE);
__asm__(".symver pthread_attr_setstacksize,pthread_attr_setstacksize@" GS_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" GS_GLIBC_BASE);
#endif

int gs_thread_start(void *(*fn)(void *), void *arg, size_t stack)
{
	pthread_attr_t a;
	pthread_t t;
	sigset_t all, old;
	int err;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (stack)
		pthread_attr_setstacksize(&a, stack);
	err = pthread_create(&t, &a, fn, arg);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}
