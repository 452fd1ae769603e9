/* SPDX-License-Identifier: Apache-2.0 */
/* The local API's reply, read as far as the front needs it. */
#ifndef GS_FRONT_REPLY_H
#define GS_FRONT_REPLY_H

#include <stddef.h>

struct reply {
	int ok;		/* 1 or 0 */
	int plan;	/* 1: "plan" is an object (a share), 0: null or absent */
	char *error;	/* NULL when absent; UTF-8 without NUL */
	char *reason;
	char *namespace;
};

/*
 * The reply in data (one JSON object: "ok" a boolean; "error", "reason",
 * "namespace" strings when present; "plan" an object or null; any other
 * member skipped).  0, or -1 when it is not one (nothing to free then).
 */
int reply_parse(const char *data, size_t len, struct reply *r);
void reply_free(struct reply *r);

#endif
