/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * The checks of the user-space unit tests (test_core, test_sched): each
 * CHECK() counts as passed or failed, a failure names its file and line.
 */
#ifndef _GS_TEST_CHECK_H
#define _GS_TEST_CHECK_H

#include <stdbool.h>

extern int passed, failed;

#define CHECK(cond) check((cond), #cond, __FILE__, __LINE__)

void check(bool ok, const char *what, const char *file, int line);

#endif /* _GS_TEST_CHECK_H */
