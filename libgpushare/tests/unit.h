/* SPDX-License-Identifier: Apache-2.0 */
/* The unit tests' one assertion: report, count, carry on. */
#ifndef GPUSHARE_UNIT_H
#define GPUSHARE_UNIT_H
#include <stdio.h>

static int failures;

#define CHECK(cond)                                                             \
	do {                                                                    \
		if (!(cond)) {                                                  \
			failures++;                                             \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
		}                                                               \
	} while (0)

#define DONE(name) (printf("%s: %s\n", name, failures ? "FAILED" : "ok"), failures ? 1 : 0)
#endif
