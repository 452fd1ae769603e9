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
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif /* _GS_USHIM_H */
