// SPDX-License-Identifier: Apache-2.0
/*
 * nriscan's tests: the walk's rules case by case, then a fuzz over random
 * and mutated messages, each in a heap buffer of exactly its size (so that
 * ASan sees a read past it) and checked for rows that stay in bounds.
 * The Python tests compare the scan with the Python reader itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nriscan.h"

static int failures;

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                          \
		}                                                            \
	} while (0)

/* A container-like type: 1..3 strings, 4 and 12 varints, 11 the sub
 * message, whose 1..12 are all length-delimited and 5 wanted. */
static int8_t top_types[22];
static int8_t sub_types[13];
static const int32_t top_want[] = { 1, 2, 3, 4, 12 };
static const int32_t sub_want[] = { 5 };
static const uint8_t markers[] = "gpushare.io/GPUgpushare.io/ALIYUN_COM_GPU_";
static const int32_t marker_len[] = { 12, 3, 12, 15 };
static struct nriscan_plan plan;

#define WIDTH (2 + 2 * 6)

static void setup(void)
{
	for (int i = 0; i < 22; i++)
		top_types[i] = i ? 2 : -1;
	top_types[4] = top_types[12] = 0;
	for (int i = 0; i < 13; i++)
		sub_types[i] = i ? 2 : -1;
	plan = (struct nriscan_plan){
		.top = { top_types, 22, top_want, 5 },
		.sub_field = 11,
		.sub = { sub_types, 13, sub_want, 1 },
		.markers = markers,
		.marker_len = marker_len,
		.ncoarse = 2,
		.nraw = 2,
	};
}

struct msg {
	uint8_t b[4096];
	int64_t n;
};

static void put_varint(struct msg *m, uint64_t v)
{
	while (v >= 0x80) {
		m->b[m->n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	m->b[m->n++] = (uint8_t)v;
}

static void put_bytes(struct msg *m, const void *p, size_t n)
{
	memcpy(m->b + m->n, p, n);
	m->n += (int64_t)n;
}

static void put_str(struct msg *m, uint32_t field, const char *s)
{
	put_varint(m, field << 3 | 2);
	put_varint(m, strlen(s));
	put_bytes(m, s, strlen(s));
}

static void put_uint(struct msg *m, uint32_t field, uint64_t v)
{
	put_varint(m, field << 3);
	put_varint(m, v);
}

static void put_msg(struct msg *m, uint32_t field, const struct msg *sub)
{
	put_varint(m, field << 3 | 2);
	put_varint(m, (uint64_t)sub->n);
	put_bytes(m, sub->b, (size_t)sub->n);
}

/* Scan m as one message in an exact heap copy; the row into row. */
static int64_t scan(const struct msg *m, int64_t *row)
{
	uint8_t *buf = malloc(m->n ? (size_t)m->n : 1);
	int64_t spans[2] = { 0, m->n };

	memcpy(buf, m->b, (size_t)m->n);
	CHECK(nriscan_scan(buf, m->n, spans, 1, &plan, row) == 0);
	free(buf);
	return row[0];
}

static int eq(const struct msg *m, const int64_t *ab, const char *s)
{
	return ab[1] - ab[0] == (int64_t)strlen(s) && !memcmp(m->b + ab[0], s, strlen(s));
}

static void usual(struct msg *m)
{
	struct msg lx = { .n = 0 };

	m->n = 0;
	put_str(m, 1, "c0ffee");
	put_str(m, 2, "pod-1");
	put_str(m, 3, "web");
	put_uint(m, 4, 2);
	put_str(m, 5, "label");
	put_str(&lx, 1, "ns");
	put_str(&lx, 5, "kubepods.slice:cri:c0ffee");
	put_msg(m, 11, &lx);
	put_uint(m, 12, 4242);
	put_uint(m, 30, 1ull << 62);
}

static void test_usual(void)
{
	struct msg m;
	int64_t row[WIDTH];

	usual(&m);
	CHECK(scan(&m, row) == NRISCAN_OK);
	CHECK(row[1] == 0);
	CHECK(eq(&m, row + 2, "c0ffee"));
	CHECK(eq(&m, row + 4, "pod-1"));
	CHECK(eq(&m, row + 6, "web"));
	CHECK(row[8] == 2);
	CHECK(row[10] == 4242);
	CHECK(eq(&m, row + 12, "kubepods.slice:cri:c0ffee"));
}

static void test_absent_and_last_wins(void)
{
	struct msg m = { .n = 0 };
	int64_t row[WIDTH];

	put_str(&m, 3, "first");
	put_str(&m, 3, "second");
	put_uint(&m, 4, 1);
	put_uint(&m, 4, 0);
	CHECK(scan(&m, row) == NRISCAN_OK);
	CHECK(eq(&m, row + 6, "second"));
	CHECK(row[2] == 0 && row[3] == 0);	/* absent string */
	CHECK(row[8] == 0 && row[9] == m.n);	/* state 0, present */
	CHECK(row[10] == 0 && row[11] == -1);	/* absent varint */
	CHECK(row[12] == 0 && row[13] == 0);	/* no linux */
	m.n = 0;
	CHECK(scan(&m, row) == NRISCAN_OK);	/* the empty message */
}

static void test_varints(void)
{
	struct msg m = { .n = 0 };
	int64_t row[WIDTH];
	static const uint8_t ten[] = { 0x60, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
				       0xff, 0xff, 0x01 };
	static const uint8_t eleven[] = { 0x60, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					  0xff, 0xff, 0x81, 0x00 };

	put_bytes(&m, ten, sizeof(ten));	/* 12: a 10-byte varint */
	CHECK(scan(&m, row) == NRISCAN_OK);
	CHECK(row[10] == -1);	/* 2^64 - 1 */
	m.n = 0;
	put_bytes(&m, eleven, sizeof(eleven));
	CHECK(scan(&m, row) == NRISCAN_MALFORMED);
	m.n = 0;
	put_bytes(&m, ten, 5);	/* truncated */
	CHECK(scan(&m, row) == NRISCAN_MALFORMED);
	m.n = 0;
	put_varint(&m, (uint64_t)((1u << 29) - 1) << 3);	/* the largest field */
	put_varint(&m, 7);
	CHECK(scan(&m, row) == NRISCAN_OK);
	m.n = 0;
	put_varint(&m, (uint64_t)(1u << 29) << 3);
	put_varint(&m, 7);
	CHECK(scan(&m, row) == NRISCAN_MALFORMED);
}

static void test_malformed(void)
{
	static const uint8_t cases[][12] = {
		{ 2, 0x00, 0x00 },		/* field 0 */
		{ 2, 0x08, 0x01 },		/* 1 as a varint */
		{ 2, 0x22, 0x00 },		/* 4 length-delimited */
		{ 3, 0xf3, 0x01, 0x00 },	/* 30 a group */
		{ 3, 0xf6, 0x01, 0x00 },	/* wire type 6 */
		{ 3, 0x0a, 0x02, 0x41 },	/* a string past the end */
		{ 4, 0xf1, 0x01, 0x00, 0x00 },	/* fixed64 past the end */
		{ 11, 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x41 },
		{ 1, 0x0a },			/* a key, no length */
	};
	struct msg m;
	int64_t row[WIDTH];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		m.n = 0;
		put_bytes(&m, cases[i] + 1, cases[i][0]);
		CHECK(scan(&m, row) == NRISCAN_MALFORMED);
	}
	m.n = 0;
	put_varint(&m, 30 << 3 | 5);	/* unknown fixed fields are fine */
	put_bytes(&m, "abcd", 4);
	put_varint(&m, 31 << 3 | 1);
	put_bytes(&m, "abcdefgh", 8);
	CHECK(scan(&m, row) == NRISCAN_OK);
}

static void test_sub(void)
{
	struct msg m, sub = { .n = 0 };
	int64_t row[WIDTH];

	usual(&m);
	put_str(&sub, 5, "again");
	put_msg(&m, 11, &sub);
	CHECK(scan(&m, row) == NRISCAN_SUB_REPEATED);
	usual(&m);
	sub.n = 0;
	put_uint(&sub, 5, 1);	/* cgroups_path as a varint */
	put_msg(&m, 11, &sub);
	CHECK(scan(&m, row) == NRISCAN_SUB_REPEATED);
	m.n = 0;
	put_msg(&m, 11, &sub);
	CHECK(scan(&m, row) == NRISCAN_SUB_MALFORMED);
	m.n = 0;
	sub.n = 0;
	put_msg(&m, 11, &sub);	/* an empty linux */
	CHECK(scan(&m, row) == NRISCAN_OK && row[12] == 0 && row[13] == 0);
}

static void test_markers(void)
{
	static const char *texts[] = { "GPU", "gpushare.io/x", "ALIYUN_COM_GPU_MEM", "ALIYUN_COM_GP" };
	static const int asks[] = { 0, 1, 1, 0 };
	struct msg m;
	int64_t row[WIDTH];

	for (int i = 0; i < 4; i++) {
		usual(&m);
		put_str(&m, 8, texts[i]);
		CHECK(scan(&m, row) == NRISCAN_OK && row[1] == asks[i]);
	}
}

/* A marker counts at either end of a message, not cut by its end. */
static void test_marker_edges(void)
{
	static const uint8_t buf[] = "GPU\x3a\x08gpushare.io/";	/* 7: "gpushare", then junk */
	int64_t spans[] = { 0, 17, 0, 16, 3, 17 };
	int64_t out[3 * WIDTH];

	CHECK(nriscan_scan(buf, 17, spans, 3, &plan, out) == 0);
	CHECK(out[0] == NRISCAN_MALFORMED && out[1] == 1);
	CHECK(out[WIDTH + 1] == 0);
	CHECK(out[2 * WIDTH] == NRISCAN_MALFORMED && out[2 * WIDTH + 1] == 1);
}

static void test_spans_and_plan(void)
{
	static const uint8_t buf[] = { 0x20, 0x01, 0x20, 0x02 };
	int64_t spans[] = { 0, 2, 2, 4, 3, 2, -1, 2, 0, 5 };
	int64_t out[5 * WIDTH];
	struct nriscan_plan bad = plan;

	CHECK(nriscan_scan(buf, 4, spans, 5, &plan, out) == 0);
	CHECK(out[0] == NRISCAN_OK && out[8] == 1 && out[9] == 2);
	CHECK(out[WIDTH] == NRISCAN_OK && out[WIDTH + 8] == 2 && out[WIDTH + 9] == 4);
	for (int i = 2; i < 5; i++)
		CHECK(out[i * WIDTH] == NRISCAN_BAD_SPAN);
	bad.ncoarse = -1;
	CHECK(nriscan_scan(buf, 4, spans, 1, &bad, out) == -1);
	bad = plan;
	bad.top.nwant = 65;
	CHECK(nriscan_scan(buf, 4, spans, 1, &bad, out) == -1);
	CHECK(nriscan_scan(NULL, 0, NULL, 0, &plan, NULL) == 0);
	CHECK(nriscan_scan(buf, 4, spans, 1, NULL, out) == -1);
}

/* A row of a scan of buf[start .. end) keeps to it. */
static void check_row(const int64_t *row, int64_t start, int64_t end)
{
	CHECK(row[0] >= NRISCAN_OK && row[0] <= NRISCAN_SUB_REPEATED);
	CHECK(row[1] == 0 || row[1] == 1);
	if (row[0] != NRISCAN_OK)
		return;
	for (int k = 0; k < 6; k++) {
		const int64_t *ab = row + 2 + 2 * k;

		if (k == 3 || k == 4)	/* varints: the position after */
			CHECK(ab[1] == -1 || (ab[1] > start && ab[1] <= end));
		else
			CHECK((ab[0] == 0 && ab[1] == 0) ||
			      (start <= ab[0] && ab[0] <= ab[1] && ab[1] <= end));
	}
}

static void fuzz(unsigned int seed, int rounds)
{
	struct msg base, m;
	int64_t out[3 * WIDTH];

	srand(seed);
	usual(&base);
	for (int r = 0; r < rounds; r++) {
		uint8_t *buf;
		int64_t spans[6];

		if (r % 4 == 0) {	/* random bytes */
			m.n = rand() % 64;
			for (int64_t i = 0; i < m.n; i++)
				m.b[i] = (uint8_t)rand();
		} else {	/* the usual container, a few bytes changed */
			m = base;
			for (int k = 1 + rand() % 4; k > 0; k--) {
				int64_t at = rand() % m.n;

				switch (rand() % 4) {
				case 0:
					m.b[at] ^= (uint8_t)(1u << (rand() % 8));
					break;
				case 1:
					m.b[at] = (uint8_t)rand();
					break;
				case 2:
					m.n = at;	/* cut short */
					break;
				default:
					m.b[at] = (uint8_t)(0x7f + rand() % 3);
				}
				if (!m.n)
					break;
			}
		}
		buf = malloc(m.n ? (size_t)m.n : 1);
		memcpy(buf, m.b, (size_t)m.n);
		spans[0] = 0;
		spans[1] = m.n;
		spans[2] = m.n ? rand() % m.n : 0;
		spans[3] = m.n;
		spans[4] = spans[2] / 2;
		spans[5] = spans[2];
		CHECK(nriscan_scan(buf, m.n, spans, 3, &plan, out) == 0);
		for (int i = 0; i < 3; i++)
			check_row(out + i * WIDTH, spans[2 * i], spans[2 * i + 1]);
		free(buf);
	}
}

int main(void)
{
	setup();
	CHECK(nriscan_abi() == NRISCAN_ABI);
	test_usual();
	test_absent_and_last_wins();
	test_varints();
	test_malformed();
	test_sub();
	test_markers();
	test_marker_edges();
	test_spans_and_plan();
	fuzz(14, 200000);
	if (failures) {
		fprintf(stderr, "nriscan: %d failure(s)\n", failures);
		return 1;
	}
	printf("nriscan: all tests passed\n");
	return 0;
}
