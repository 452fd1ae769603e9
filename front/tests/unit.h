/* SPDX-License-Identifier: Apache-2.0 */
/* The front's C unit tests: CHECK counts and reports, main returns failures. */
#ifndef GS_FRONT_UNIT_H
#define GS_FRONT_UNIT_H

#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                              \
		}                                                                \
	} while (0)

#define CHECK_STR(got, want)                                                           \
	do {                                                                           \
		const char *g_ = (got), *w_ = (want);                                  \
		if (!g_ || strcmp(g_, w_)) {                                           \
			fprintf(stderr, "%s:%d: %s is \"%s\", not \"%s\"\n", __FILE__, \
				__LINE__, #got, g_ ? g_ : "(null)", w_);               \
			failures++;                                                    \
		}                                                                      \
	} while (0)

#endif
