// SPDX-License-Identifier: Apache-2.0
/* The reply reader: the daemon's replies, then hostile ones, then random mutations (ASan). */
#include <stdlib.h>

#include "reply.h"
#include "unit.h"

static int parse(const char *s, struct reply *r)
{
	return reply_parse(s, strlen(s), r);
}

static void test_replies(void)
{
	struct reply r;

	CHECK(!parse("{\"ok\":true,\"plan\":null}\n", &r) && r.ok == 1 && !r.plan && !r.error);
	reply_free(&r);
	CHECK(!parse("{\"namespace\":\"default\",\"ok\":true,\"plan\":{\"devices\":[{\"path\":"
		     "\"/dev/nvidia0\",\"minor\":0,\"mode\":438}],\"env\":{\"A\":\"\\u00e9\"},"
		     "\"x\":[1,-2.5e+3,true,false,null,\"s\"]}}", &r));
	CHECK(r.ok == 1 && r.plan == 1);
	CHECK_STR(r.namespace, "default");
	reply_free(&r);
	CHECK(!parse("{\"error\":\"gpushare: \\\"no\\\" \\u00e9\\u2603\\ud83d\\ude00\\n\\/\","
		     "\"ok\":false,\"reason\":\"capacity\"}", &r));
	CHECK(r.ok == 0);
	CHECK_STR(r.error, "gpushare: \"no\" \xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80\n/");
	CHECK_STR(r.reason, "capacity");
	reply_free(&r);
	CHECK(!parse(" { \"ok\" : true , \"released\" : true , \"error\" : \"\" } ", &r));
	CHECK_STR(r.error, "");
	reply_free(&r);
	/* The last of equal keys wins, as in Python's json. */
	CHECK(!parse("{\"ok\":false,\"ok\":true,\"reason\":\"a\",\"reason\":\"b\"}", &r));
	CHECK(r.ok == 1);
	CHECK_STR(r.reason, "b");
	reply_free(&r);
	CHECK(!parse("{\"ok\":true,\"plan\":{},\"plan\":null}", &r) && !r.plan);
	reply_free(&r);
}

static void test_not_replies(void)
{
	static const char *const bad[] = {
		"", "{", "}", "[]", "null", "{}", "{\"ok\":1}", "{\"ok\":\"true\"}",
		"{\"ok\":true", "{\"ok\":true}x", "{\"ok\":true,}", "{\"ok\" true}",
		"{\"ok\":tru}", "{\"ok\":true,\"plan\":[]}", "{\"ok\":true,\"plan\":1}",
		"{\"ok\":true,\"error\":1}", "{\"ok\":true,\"namespace\":null}",
		"{\"ok\":true,\"x\":01}", "{\"ok\":true,\"x\":1.}", "{\"ok\":true,\"x\":-}",
		"{\"ok\":true,\"x\":+1}", "{\"ok\":true,\"x\":1e}", "{'ok':true}",
		"{\"ok\":false,\"error\":\"a\\u0000b\"}",	/* a NUL */
		"{\"ok\":false,\"error\":\"\\ud800\"}",		/* a lone surrogate */
		"{\"ok\":false,\"error\":\"\\udc00\\ud800\"}",
		"{\"ok\":false,\"error\":\"\\ud800\\u0041\"}",
		"{\"ok\":false,\"error\":\"\\u12g4\"}", "{\"ok\":false,\"error\":\"\\u12\"}",
		"{\"ok\":false,\"error\":\"\\x\"}", "{\"ok\":false,\"error\":\"a\nb\"}",
		"{\"ok\":false,\"error\":\"\xff\"}", "{\"ok\":false,\"error\":\"\xc0\xaf\"}",
		"{\"ok\":false,\"error\":\"\xed\xa0\x80\"}", "{\"ok\":false,\"error\":\"abc",
		"{\"ok\":false,\"error\":\"abc\\", "{\"ok\":true,\"x\":[1,2}",
		"{\"ok\":true,\"x\":{\"a\"}}", "{\"ok\":true,\"x\":{1:2}}",
	};
	struct reply r;
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		if (!parse(bad[i], &r)) {
			fprintf(stderr, "read as a reply: %s\n", bad[i]);
			failures++;
			reply_free(&r);
		}
	}
}

static void test_depth(void)
{
	char deep[400];
	struct reply r;
	int i, n = 0;

	n += sprintf(deep, "{\"ok\":true,\"x\":");
	for (i = 0; i < 100; i++)
		deep[n++] = '[';
	for (i = 0; i < 100; i++)
		deep[n++] = ']';
	strcpy(deep + n, "}");
	CHECK(parse(deep, &r) == -1);  /* deeper than the reader goes */
	n = sprintf(deep, "{\"ok\":true,\"x\":[[[[[[[[]]]]]]]]}");
	CHECK(parse(deep, &r) == 0);
	reply_free(&r);
}

/* Random mutations of real replies: whatever comes out, no crash, no leak (ASan). */
static void test_mutations(void)
{
	static const char *const seeds[] = {
		"{\"error\":\"gpushare: no \\u00e9\\ud83d\\ude00\",\"ok\":false,\"reason\":\"x\"}",
		"{\"namespace\":\"default\",\"ok\":true,\"plan\":{\"env\":{\"A\":\"1\"},\"d\":[1,2.5]}}",
	};
	char buf[256];
	struct reply r;
	unsigned seed = 12345;
	size_t len;
	int i, k;

	for (i = 0; i < 200000; i++) {
		const char *s = seeds[i % 2];

		len = strlen(s);
		memcpy(buf, s, len);
		for (k = 0; k < 1 + i % 4; k++) {
			seed = seed * 1103515245 + 12345;
			buf[(seed >> 8) % len] = (char)(seed >> 16);
		}
		if (i % 3 == 0)
			len = (seed >> 4) % (len + 1);
		if (!reply_parse(buf, len, &r))
			reply_free(&r);
	}
}

int main(void)
{
	test_replies();
	test_not_replies();
	test_depth();
	test_mutations();
	return failures != 0;
}
