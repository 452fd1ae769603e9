/* SPDX-License-Identifier: Apache-2.0 */
/* A growable byte buffer, and JSON text written into one. */
#ifndef GS_FRONT_BUF_H
#define GS_FRONT_BUF_H

#include <stddef.h>

struct buf {
	char *p;	/* NUL-terminated while not failed */
	size_t len;
	size_t cap;
	int failed;	/* an allocation failed: the contents are not whole */
};

void buf_add(struct buf *b, const char *data, size_t len);
void buf_adds(struct buf *b, const char *s);
void buf_addf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(struct buf *b);

/*
 * The code point of the UTF-8 sequence at s (at most len bytes), its length
 * in *used; -1 (with *used 1) for a byte that starts no valid sequence
 * (overlong forms, surrogates and values past U+10FFFF are invalid).
 */
long utf8_next(const unsigned char *s, size_t len, size_t *used);

/*
 * s as a JSON string (quotes included) for the local API: UTF-8 kept as it
 * is, '"', '\\' and control characters escaped.  -1 (nothing added) when s
 * is not UTF-8 or holds a NUL.
 */
int json_string(struct buf *b, const char *s, size_t len);

/*
 * s as Python's json.dumps writes it (ensure_ascii): what runc's log and the
 * Python wrapper's messages hold.  A byte that is not UTF-8 is written as
 * Python decodes it from a command line (surrogateescape: \udcXX).
 */
void json_ascii(struct buf *b, const char *s, size_t len);

#endif
