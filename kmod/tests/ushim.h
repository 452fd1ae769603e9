/* SPDX-License-Identifier: GPL-2.0-only */
/* The few kernel definitions gs_core.c needs, for the user-space build. */
#ifndef _GS_USHIM_H
#define _GS_USHIM_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <linux/types.h>

typedef __u32 u32;
typedef __u64 u64;

#define U64_MAX ((u64)~0ULL)
#define U32_MAX ((u32)~0U)
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/*
 * kstrtou64() as lib/kstrtox.c has it, for base 10: an optional '+',
 * digits, an optional trailing newline; -ERANGE on overflow.  (strsep()
 * comes from the C library.)
 */
static inline int kstrtou64(const char *s, unsigned int base, u64 *res)
{
	u64 v = 0;
	const char *p;

	if (base != 10)
		return -EINVAL;
	if (*s == '+')
		s++;
	for (p = s; *p >= '0' && *p <= '9'; p++) {
		unsigned int d = *p - '0';

		if (v > (U64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	if (p == s)
		return -EINVAL;
	if (*p == '\n')
		p++;
	if (*p)
		return -EINVAL;
	*res = v;
	return 0;
}

/* strscpy() as lib/string.c has it: -E2BIG when @src is cut short. */
static inline long strscpy(char *dst, const char *src, size_t size)
{
	size_t len;

	if (!size)
		return -E2BIG;
	for (len = 0; len < size - 1 && src[len]; len++)
		dst[len] = src[len];
	dst[len] = '\0';
	return src[len] ? -E2BIG : (long)len;
}

#endif /* _GS_USHIM_H */
