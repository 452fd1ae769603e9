// SPDX-License-Identifier: Apache-2.0
/*
 * nriscan: see nriscan.h.  The walk has exactly pb_index.index's rules: a
 * key is a varint of at most 10 bytes whose field number is 1 .. 2^29 - 1,
 * its wire type is one of varint, 64-bit, length-delimited and 32-bit and
 * the one the type table expects, and every length and fixed field fits in
 * the message.  Offsets are int64 and every length is compared with what is
 * left before it is added: nothing wraps, whatever the input.
 */
#include <string.h>

#include "nriscan.h"

#define MAX_FIELD ((1u << 29) - 1)

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

/* The varint at *pos, read before end and in at most 10 bytes. */
static int read_varint(const uint8_t *buf, int64_t *pos, int64_t end, uint64_t *value)
{
	int64_t p = *pos;
	int64_t stop = end - p > 10 ? p + 10 : end;
	uint64_t v = 0;
	unsigned int shift = 0;

	while (p < stop) {
		uint8_t byte = buf[p++];

		v |= (uint64_t)(byte & 0x7f) << shift;
		if (byte < 0x80) {
			*value = v;
			*pos = p;
			return 0;
		}
		shift += 7;
	}
	return -1;
}

struct walk_out {
	int64_t *rec;		/* (a, b) per wanted field */
	int32_t sub_field;	/* 0: none */
	int64_t sub_a, sub_b;	/* the last sub message's payload */
	int nsub;
};

static void set_absent(const struct nriscan_msg *m, int64_t *rec)
{
	for (int32_t k = 0; k < m->nwant; k++) {
		int32_t f = m->want[k];
		int varint = f < m->ntypes && m->types[f] == WT_VARINT;

		rec[2 * k] = 0;
		rec[2 * k + 1] = varint ? -1 : 0;
	}
}

/* Walk buf[pos .. end) as one message of type m: 0, or -1 if malformed. */
static int walk(const uint8_t *buf, int64_t pos, int64_t end, const struct nriscan_msg *m,
		struct walk_out *o)
{
	set_absent(m, o->rec);
	while (pos < end) {
		uint64_t key, value;
		uint32_t number;
		int wt, expected;
		int64_t a, b;

		if (read_varint(buf, &pos, end, &key))
			return -1;
		if ((key >> 3) == 0 || (key >> 3) > MAX_FIELD)
			return -1;
		number = (uint32_t)(key >> 3);
		wt = (int)(key & 7);
		expected = number < (uint32_t)m->ntypes ? m->types[number] : -1;
		if (expected >= 0 && expected != wt)
			return -1;
		switch (wt) {
		case WT_VARINT:
			if (read_varint(buf, &pos, end, &value))
				return -1;
			a = (int64_t)value;
			b = pos;
			break;
		case WT_LEN:
			if (read_varint(buf, &pos, end, &value))
				return -1;
			if (value > (uint64_t)(end - pos))
				return -1;
			a = pos;
			b = pos + (int64_t)value;
			break;
		case WT_FIXED64:
		case WT_FIXED32:
			value = wt == WT_FIXED64 ? 8 : 4;
			if (value > (uint64_t)(end - pos))
				return -1;
			a = pos;
			b = pos + (int64_t)value;
			break;
		default:	/* groups, 6 and 7 */
			return -1;
		}
		for (int32_t k = 0; k < m->nwant; k++) {
			if ((uint32_t)m->want[k] == number) {
				o->rec[2 * k] = a;
				o->rec[2 * k + 1] = b;
			}
		}
		if (o->sub_field > 0 && number == (uint32_t)o->sub_field && wt == WT_LEN) {
			o->nsub++;
			o->sub_a = a;
			o->sub_b = b;
		}
		pos = b;
	}
	return 0;
}

/* How common a byte is in the usual container's text: 0 rarest. */
static int commonness(uint8_t c)
{
	if (c >= 'A' && c <= 'Z')
		return 0;
	if (c == '_')
		return 1;
	if (c >= '0' && c <= '9')
		return 3;
	if (c >= 'a' && c <= 'z')
		return 5;
	if (c == '.' || c == '/' || c == '-' || c == ':' || c == '=')
		return 4;
	return 2;
}

/* Where in a marker to anchor its search: its rarest byte. */
static size_t anchor_of(const uint8_t *m, size_t n)
{
	size_t best = 0;

	for (size_t i = 1; i < n; i++)
		if (commonness(m[i]) < commonness(m[best]))
			best = i;
	return best;
}

/* Whether hay holds the marker: memchr for its anchor byte (much faster
 * than memmem for a short marker), then the whole marker around it. */
static int holds(const uint8_t *hay, size_t size, const uint8_t *m, size_t n, size_t anchor)
{
	const uint8_t *p, *end;

	if (n == 0)
		return 1;
	if (n > size)
		return 0;
	p = hay + anchor;
	end = hay + (size - n) + anchor + 1;	/* past the anchor's last place */
	while (p < end && (p = memchr(p, m[anchor], (size_t)(end - p)))) {
		if (!memcmp(p - anchor, m, n))
			return 1;
		p++;
	}
	return 0;
}

struct marker {
	const uint8_t *text;
	size_t len, anchor;
};

/* Whether hay holds one of the count markers from the k-th. */
static int holds_any(const struct marker *m, int32_t k, int32_t count, const uint8_t *hay,
		     size_t size)
{
	for (int32_t i = k; i < k + count; i++)
		if (holds(hay, size, m[i].text, m[i].len, m[i].anchor))
			return 1;
	return 0;
}

static int msg_ok(const struct nriscan_msg *m)
{
	if (m->ntypes < 0 || m->nwant < 0 || m->nwant > 64)
		return 0;
	if ((m->ntypes && !m->types) || (m->nwant && !m->want))
		return 0;
	for (int32_t k = 0; k < m->nwant; k++)
		if (m->want[k] <= 0)
			return 0;
	return 1;
}

static int scan_one(const uint8_t *buf, int64_t start, int64_t end,
		    const struct nriscan_plan *p, const struct marker *marker, int64_t *row)
{
	struct walk_out o = { .rec = row + 2, .sub_field = p->sub_field };
	int64_t *sub_rec = row + 2 + 2 * p->top.nwant;
	const uint8_t *hay = buf + start;
	size_t size = (size_t)(end - start);

	row[1] = holds_any(marker, 0, p->ncoarse, hay, size) &&
		 holds_any(marker, p->ncoarse, p->nraw, hay, size);
	if (walk(buf, start, end, &p->top, &o))
		return NRISCAN_MALFORMED;
	set_absent(&p->sub, sub_rec);
	if (o.nsub > 1)
		return NRISCAN_SUB_REPEATED;
	if (o.nsub == 1) {
		struct walk_out s = { .rec = sub_rec };

		if (walk(buf, o.sub_a, o.sub_b, &p->sub, &s))
			return NRISCAN_SUB_MALFORMED;
	}
	return NRISCAN_OK;
}

int nriscan_abi(void)
{
	return NRISCAN_ABI;
}

int nriscan_scan(const uint8_t *buf, int64_t len, const int64_t *spans, int64_t n,
		 const struct nriscan_plan *p, int64_t *out)
{
	struct marker marker[64];
	int64_t width, total = 0;
	int32_t nmarkers;

	if (!p || !msg_ok(&p->top) || !msg_ok(&p->sub) || p->sub_field < 0)
		return -1;
	if (p->ncoarse < 0 || p->nraw < 0 || p->ncoarse + p->nraw > 64)
		return -1;
	nmarkers = p->ncoarse + p->nraw;
	if (nmarkers && (!p->marker_len || !p->markers))
		return -1;
	for (int32_t i = 0; i < nmarkers; i++) {
		if (p->marker_len[i] < 0)
			return -1;
		marker[i].text = p->markers + total;
		marker[i].len = (size_t)p->marker_len[i];
		marker[i].anchor = anchor_of(marker[i].text, marker[i].len);
		total += p->marker_len[i];
	}
	if (len < 0 || n < 0 || (n && (!spans || !out)) || (len && !buf))
		return -1;
	width = NRISCAN_ROW(p);
	for (int64_t i = 0; i < n; i++) {
		int64_t start = spans[2 * i], end = spans[2 * i + 1];
		int64_t *row = out + i * width;

		memset(row, 0, (size_t)width * sizeof(*row));
		if (start < 0 || start > end || end > len) {
			row[0] = NRISCAN_BAD_SPAN;
			continue;
		}
		row[0] = scan_one(buf, start, end, p, marker, row);
	}
	return 0;
}
