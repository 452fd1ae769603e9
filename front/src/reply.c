// SPDX-License-Identifier: Apache-2.0
/*
 * A small strict JSON reader for the daemon's replies: the top-level object's
 * members are walked, the few the front uses are kept, every other value is
 * checked and skipped (nested at most MAX_DEPTH deep).  Strings are
 * unescaped (\uXXXX, surrogate pairs too, to UTF-8); a NUL, a lone surrogate,
 * a raw control character or bytes that are not UTF-8 make the reply invalid.
 */
#include "reply.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define MAX_DEPTH 64

struct reader {
	const unsigned char *s;
	size_t len;
	size_t at;
};

static void blank(struct reader *r)
{
	while (r->at < r->len && (r->s[r->at] == ' ' || r->s[r->at] == '\t' ||
				  r->s[r->at] == '\n' || r->s[r->at] == '\r'))
		r->at++;
}

static int take(struct reader *r, char c)
{
	blank(r);
	if (r->at < r->len && r->s[r->at] == c) {
		r->at++;
		return 1;
	}
	return 0;
}

static long hex4(struct reader *r)
{
	long v = 0;
	int i;

	if (r->len - r->at < 4)
		return -1;
	for (i = 0; i < 4; i++) {
		unsigned char c = r->s[r->at++];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return -1;
	}
	return v;
}

static void put_utf8(struct buf *out, long cp)
{
	char u[4];

	if (cp < 0x80) {
		u[0] = (char)cp;
		buf_add(out, u, 1);
	} else if (cp < 0x800) {
		u[0] = (char)(0xc0 | cp >> 6);
		u[1] = (char)(0x80 | (cp & 0x3f));
		buf_add(out, u, 2);
	} else if (cp < 0x10000) {
		u[0] = (char)(0xe0 | cp >> 12);
		u[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		u[2] = (char)(0x80 | (cp & 0x3f));
		buf_add(out, u, 3);
	} else {
		u[0] = (char)(0xf0 | cp >> 18);
		u[1] = (char)(0x80 | (cp >> 12 & 0x3f));
		u[2] = (char)(0x80 | (cp >> 6 & 0x3f));
		u[3] = (char)(0x80 | (cp & 0x3f));
		buf_add(out, u, 4);
	}
}

static int escape(struct reader *r, struct buf *out)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	const char *hit;
	long cp, low;

	if (r->at >= r->len)
		return -1;
	if (r->s[r->at] != 'u') {
		hit = r->s[r->at] ? strchr(from, r->s[r->at]) : NULL;
		if (!hit)
			return -1;
		r->at++;
		if (out)
			buf_add(out, &to[hit - from], 1);
		return 0;
	}
	r->at++;
	cp = hex4(r);
	if (cp < 0 || cp == 0 || (cp >= 0xdc00 && cp <= 0xdfff))
		return -1;
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (r->len - r->at < 2 || r->s[r->at] != '\\' || r->s[r->at + 1] != 'u')
			return -1;
		r->at += 2;
		low = hex4(r);
		if (low < 0xdc00 || low > 0xdfff)
			return -1;
		cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
	}
	if (out)
		put_utf8(out, cp);
	return 0;
}

/* A string at r (its opening quote next), into out unless out is NULL. */
static int string(struct reader *r, struct buf *out)
{
	size_t used;

	if (!take(r, '"'))
		return -1;
	if (out)
		buf_add(out, "", 0);
	while (r->at < r->len) {
		unsigned char c = r->s[r->at];

		if (c == '"') {
			r->at++;
			return out && out->failed ? -1 : 0;
		}
		if (c == '\\') {
			r->at++;
			if (escape(r, out))
				return -1;
			continue;
		}
		if (c < 0x20 || utf8_next(r->s + r->at, r->len - r->at, &used) < 0)
			return -1;
		if (out)
			buf_add(out, (const char *)r->s + r->at, used);
		r->at += used;
	}
	return -1;
}

static int word(struct reader *r, const char *w)
{
	size_t n = strlen(w);

	if (r->len - r->at < n || memcmp(r->s + r->at, w, n))
		return -1;
	r->at += n;
	return 0;
}

static int digits(struct reader *r)
{
	size_t from = r->at;

	while (r->at < r->len && r->s[r->at] >= '0' && r->s[r->at] <= '9')
		r->at++;
	return r->at > from ? 0 : -1;
}

static int number(struct reader *r)
{
	if (r->at < r->len && r->s[r->at] == '-')
		r->at++;
	if (r->at < r->len && r->s[r->at] == '0')
		r->at++;
	else if (digits(r))
		return -1;
	if (r->at < r->len && r->s[r->at] == '.') {
		r->at++;
		if (digits(r))
			return -1;
	}
	if (r->at < r->len && (r->s[r->at] == 'e' || r->s[r->at] == 'E')) {
		r->at++;
		if (r->at < r->len && (r->s[r->at] == '+' || r->s[r->at] == '-'))
			r->at++;
		if (digits(r))
			return -1;
	}
	return 0;
}

static int value(struct reader *r, int depth);

static int members(struct reader *r, int depth, char close, int keyed)
{
	if (take(r, close))
		return 0;
	do {
		if (keyed && (string(r, NULL) || !take(r, ':')))
			return -1;
		if (value(r, depth))
			return -1;
	} while (take(r, ','));
	return take(r, close) ? 0 : -1;
}

/* Any value at r, checked and skipped. */
static int value(struct reader *r, int depth)
{
	blank(r);
	if (r->at >= r->len || depth > MAX_DEPTH)
		return -1;
	switch (r->s[r->at]) {
	case '{':
		r->at++;
		return members(r, depth + 1, '}', 1);
	case '[':
		r->at++;
		return members(r, depth + 1, ']', 0);
	case '"':
		return string(r, NULL);
	case 't':
		return word(r, "true");
	case 'f':
		return word(r, "false");
	case 'n':
		return word(r, "null");
	default:
		return number(r);
	}
}

/* A string member's value into *dst (the last of equal keys wins). */
static int keep(struct reader *r, char **dst)
{
	struct buf b = { 0 };

	if (string(r, &b) || b.failed) {
		buf_free(&b);
		return -1;
	}
	free(*dst);
	*dst = b.p;
	return 0;
}

static int member(struct reader *r, struct reply *out, int *ok_seen)
{
	struct buf key = { 0 };
	int rc = -1;

	if (string(r, &key) || key.failed || !take(r, ':'))
		goto done;
	blank(r);
	if (!strcmp(key.p, "ok")) {
		rc = word(r, "true") == 0 ? (out->ok = 1, 0) :
		     word(r, "false") == 0 ? (out->ok = 0, 0) : -1;
		*ok_seen = !rc;
	} else if (!strcmp(key.p, "plan")) {
		out->plan = r->at < r->len && r->s[r->at] == '{';
		rc = out->plan ? value(r, 1) : word(r, "null");
	} else if (!strcmp(key.p, "error")) {
		rc = keep(r, &out->error);
	} else if (!strcmp(key.p, "reason")) {
		rc = keep(r, &out->reason);
	} else if (!strcmp(key.p, "namespace")) {
		rc = keep(r, &out->namespace);
	} else {
		rc = value(r, 1);
	}
done:
	buf_free(&key);
	return rc;
}

int reply_parse(const char *data, size_t len, struct reply *out)
{
	struct reader r = { (const unsigned char *)data, len, 0 };
	int ok_seen = 0;

	memset(out, 0, sizeof(*out));
	if (!take(&r, '{'))
		return -1;
	if (!take(&r, '}')) {
		do {
			if (member(&r, out, &ok_seen))
				goto bad;
		} while (take(&r, ','));
		if (!take(&r, '}'))
			goto bad;
	}
	blank(&r);
	if (r.at != r.len || !ok_seen)
		goto bad;
	return 0;
bad:
	reply_free(out);
	return -1;
}

void reply_free(struct reply *r)
{
	free(r->error);
	free(r->reason);
	free(r->namespace);
	memset(r, 0, sizeof(*r));
}
