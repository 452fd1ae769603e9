// SPDX-License-Identifier: Apache-2.0
/* The growable buffer and the two JSON string writers. */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int grow(struct buf *b, size_t more)
{
	size_t want, cap;
	char *p;

	if (b->failed)
		return -1;
	if (more > (size_t)-1 / 2 - b->len)
		goto fail;
	want = b->len + more + 1;
	if (want <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 256;
	while (cap < want)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p)
		goto fail;
	b->p = p;
	b->cap = cap;
	return 0;
fail:
	b->failed = 1;
	return -1;
}

void buf_add(struct buf *b, const char *data, size_t len)
{
	if (grow(b, len))
		return;
	memcpy(b->p + b->len, data, len);
	b->len += len;
	b->p[b->len] = '\0';
}

void buf_adds(struct buf *b, const char *s)
{
	buf_add(b, s, strlen(s));
}

void buf_addf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || grow(b, (size_t)n)) {
		b->failed = 1;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void buf_free(struct buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

long utf8_next(const unsigned char *s, size_t len, size_t *used)
{
	static const long least[] = { 0, 0, 0x80, 0x800, 0x10000 };
	size_t n, i;
	long cp;

	*used = 1;
	if (s[0] < 0x80)
		return s[0];
	if ((s[0] & 0xe0) == 0xc0) {
		n = 2;
		cp = s[0] & 0x1f;
	} else if ((s[0] & 0xf0) == 0xe0) {
		n = 3;
		cp = s[0] & 0x0f;
	} else if ((s[0] & 0xf8) == 0xf0) {
		n = 4;
		cp = s[0] & 0x07;
	} else {
		return -1;
	}
	if (len < n)
		return -1;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return -1;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return -1;
	*used = n;
	return cp;
}

static const char *short_escape(unsigned char c)
{
	switch (c) {
	case '"': return "\\\"";
	case '\\': return "\\\\";
	case '\n': return "\\n";
	case '\r': return "\\r";
	case '\t': return "\\t";
	case '\b': return "\\b";
	case '\f': return "\\f";
	default: return NULL;
	}
}

int json_string(struct buf *b, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, used, start = b->len;
	const char *esc;

	buf_add(b, "\"", 1);
	while (i < len) {
		if (u[i] == 0 || utf8_next(u + i, len - i, &used) < 0) {
			b->len = start;
			if (b->p)
				b->p[start] = '\0';
			return -1;
		}
		esc = short_escape(u[i]);
		if (esc)
			buf_adds(b, esc);
		else if (u[i] < 0x20)
			buf_addf(b, "\\u%04x", u[i]);
		else
			buf_add(b, s + i, used);
		i += used;
	}
	buf_add(b, "\"", 1);
	return 0;
}

void json_ascii(struct buf *b, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, used;
	const char *esc;
	long cp;

	buf_add(b, "\"", 1);
	while (i < len) {
		cp = utf8_next(u + i, len - i, &used);
		esc = cp >= 0 && cp < 0x80 ? short_escape((unsigned char)cp) : NULL;
		if (cp < 0)
			buf_addf(b, "\\udc%02x", u[i]);
		else if (esc)
			buf_adds(b, esc);
		else if (cp < 0x20 || (cp >= 0x7f && cp < 0x10000))
			buf_addf(b, "\\u%04lx", cp);
		else if (cp >= 0x10000)
			buf_addf(b, "\\u%04lx\\u%04lx", 0xd800 + ((cp - 0x10000) >> 10),
				 0xdc00 + ((cp - 0x10000) & 0x3ff));
		else
			buf_add(b, s + i, 1);
		i += used;
	}
	buf_add(b, "\"", 1);
}
