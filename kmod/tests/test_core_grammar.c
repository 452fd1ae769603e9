// SPDX-License-Identifier: GPL-2.0-only
/*
 * test_core: numbers, container IDs and inst_ctl commands (gs_grammar.c).
 */
#include "test_core.h"

void test_numbers(void)
{
	char buf[32];
	u64 v = 7;

	CHECK(gs_parse_u64("0", &v) == 0 && v == 0);
	CHECK(gs_parse_u64("18446744073709551615", &v) == 0 && v == U64_MAX);
	CHECK(gs_parse_u64("18446744073709551616", &v) == -EINVAL);
	CHECK(gs_parse_u64("99999999999999999999", &v) == -EINVAL);
	CHECK(gs_parse_u64("", &v) == -EINVAL);
	CHECK(gs_parse_u64("-1", &v) == -EINVAL);
	CHECK(gs_parse_u64("+1", &v) == -EINVAL);
	CHECK(gs_parse_u64("0x10", &v) == -EINVAL);
	CHECK(gs_parse_u64("1 ", &v) == -EINVAL);
	CHECK(gs_parse_u64("12a", &v) == -EINVAL);
	/* kstrtou64() takes these; the grammar does not. */
	CHECK(gs_parse_u64("1\n", &v) == -EINVAL);
	CHECK(gs_parse_u64("+0", &v) == -EINVAL);
	CHECK(gs_parse_u64("\n", &v) == -EINVAL);
	CHECK(gs_parse_u64("007", &v) == 0 && v == 7);

	strscpy(buf, "42\n", sizeof(buf));
	CHECK(gs_parse_value(buf, &v) == 0 && v == 42);
	strscpy(buf, "42", sizeof(buf));
	CHECK(gs_parse_value(buf, &v) == 0 && v == 42);
	strscpy(buf, "42\n\n", sizeof(buf));
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
	strscpy(buf, "\n", sizeof(buf));
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
	strscpy(buf, " 42", sizeof(buf));
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
}

void test_ids(void)
{
	char id[GPUSHARE_ID_MAX + 2], line[GPUSHARE_ID_MAX + 8];
	struct gs_cmd cmd;
	int i;

	memset(id, 'a', sizeof(id));
	id[GPUSHARE_ID_MAX] = '\0';
	CHECK(gs_valid_id(id));
	/* The longest ID is copied whole (strscpy()'s bound). */
	snprintf(line, sizeof(line), "del %s", id);
	CHECK(gs_parse_cmd(line, &cmd) == 0 && !strcmp(cmd.id, id));
	id[GPUSHARE_ID_MAX] = 'a';
	id[GPUSHARE_ID_MAX + 1] = '\0';
	CHECK(!gs_valid_id(id));
	CHECK(gs_valid_id("a"));
	CHECK(gs_valid_id("Ab9_.-x"));
	CHECK(gs_valid_id("..."));
	CHECK(!gs_valid_id(""));
	CHECK(!gs_valid_id("."));
	CHECK(!gs_valid_id(".."));
	CHECK(!gs_valid_id("a/b"));
	CHECK(!gs_valid_id("a b"));
	CHECK(!gs_valid_id("a:b"));
	CHECK(!gs_valid_id("a\n"));
	CHECK(!gs_valid_id("free_weight"));
	CHECK(!gs_valid_id("max_inst"));
	CHECK(!gs_valid_id("nr_inst"));
	CHECK(!gs_valid_id("slice_us"));
	CHECK(gs_valid_id("slice_us2") && gs_valid_id("gputime"));
	CHECK(!gs_valid_id("drain_us") && !gs_valid_id("forced_ends"));
	CHECK(gs_valid_id("drain_us2") && gs_valid_id("forced_end"));
	for (i = 0; i < GS_GPU_NFILES; i++)
		CHECK(gs_gpu_files[i] && !gs_valid_id(gs_gpu_files[i]));
}

void test_parse_ok(void)
{
	struct gs_cmd c;

	CHECK(parse("gpu 3 16000000000\n", &c) == 0);
	CHECK(c.op == GS_OP_GPU && c.gpu == 3 && c.total_mem == 16000000000ULL);
	CHECK(parse("  gpu\t15   1  ", &c) == 0 && c.gpu == 15 && c.total_mem == 1);

	CHECK(parse("add c1 0:1024", &c) == 0);
	CHECK(c.op == GS_OP_ADD && !strcmp(c.id, "c1") && c.nquota == 1);
	CHECK(c.quota[0].gpu == 0 && c.quota[0].memsize == 1024);
	CHECK(c.quota[0].weight == 0 && c.quota[0].highprio == 0);

	CHECK(parse("add c2 2:100:30:1,0:0:100,15:5:0:0\n", &c) == 0);
	CHECK(c.nquota == 3);
	CHECK(c.quota[0].gpu == 2 && c.quota[0].memsize == 100 &&
	      c.quota[0].weight == 30 && c.quota[0].highprio == 1);
	CHECK(c.quota[1].gpu == 0 && c.quota[1].memsize == 0 &&
	      c.quota[1].weight == 100 && c.quota[1].highprio == 0);
	CHECK(c.quota[2].gpu == 15 && c.quota[2].memsize == 5);

	CHECK(parse("add c3 0:1,1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1,10:1,11:1,12:1,13:1,14:1,15:1",
		    &c) == 0 && c.nquota == 16);

	CHECK(parse("del c1\n", &c) == 0 && c.op == GS_OP_DEL && !strcmp(c.id, "c1"));

	CHECK(parse("bind c1 4242", &c) == 0);
	CHECK(c.op == GS_OP_BIND && c.cgroup_id == 4242 && !c.cgroup_path);
	CHECK(parse("bind c1 0", &c) == 0 && c.cgroup_id == 0);
	CHECK(parse("bind c1 /k8s.io/abc\n", &c) == 0);
	CHECK(c.cgroup_path && !strcmp(c.cgroup_path, "/k8s.io/abc"));
	CHECK(parse("bind c1 /", &c) == 0 && !strcmp(c.cgroup_path, "/"));
	CHECK(parse("bind c1 //a//b/", &c) == 0 && !strcmp(c.cgroup_path, "//a//b/"));
	CHECK(parse("\tdel\t\tc1\t", &c) == 0 && !strcmp(c.id, "c1"));
}

void test_parse_bad(void)
{
	static const char *const bad[] = {
		"", "\n", " ", "nop", "GPU 0 1", "gpu", "gpu 0", "gpu 0 0",
		"gpu 16 1", "gpu -1 1", "gpu 0 1 2", "gpu 0 1x", "gpu 0 1\n\n",
		"add", "add c1", "add c1 0", "add c1 0:", "add c1 :5", "add c1 0:5:",
		"add c1 0:5:101", "add c1 0:5:1:2", "add c1 0:5:1:1:0",
		"add c1 16:5", "add c1 0:5,0:6", "add c1 0:5,", "add c1 ,0:5",
		"add c1 0:5,,1:5", "add c1 0:5 1:5", "add c1 0:-5",
		"add c1 0:18446744073709551616", "add . 0:1", "add a/b 0:1",
		"add policy 0:1",
		"add c1 0:1,1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1,10:1,11:1,12:1,13:1,14:1,15:1,16:1",
		"del", "del c1 c2", "del ..", "bind", "bind c1", "bind c1 x",
		"bind c1 -1", "bind c1 /a /b", "bind c1 12 3", "add c1 0:5\nadd c2 0:5",
		"del c1\r\n", "gpu 0 +1", "gpu +0 1", "add c1 0:+5", "add c1 0:5:+1",
		"bind c1 +12", "gpu 0 1\n\n", "add c1 0:5\n:1",
	};
	struct gs_cmd c;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		int ret = parse(bad[i], &c);

		if (ret != -EINVAL)
			fprintf(stderr, "accepted: \"%s\"\n", bad[i]);
		CHECK(ret == -EINVAL);
	}
}
