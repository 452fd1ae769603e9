// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* The checks of the user-space unit tests: see check.h. */
#include <stdio.h>

#include "check.h"

int passed, failed;

void check(bool ok, const char *what, const char *file, int line)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
	fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
}
