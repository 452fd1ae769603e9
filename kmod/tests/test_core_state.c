// SPDX-License-Identifier: GPL-2.0-only
/*
 * test_core: the upgrade state's grammar and check (gs_state.c).
 */
#include "test_core.h"

static int header(const char *text)
{
	static char buf[256];

	snprintf(buf, sizeof(buf), "%s", text);
	return gs_parse_state_header(buf);
}

static int state_line(const char *text, struct gs_state_line *l)
{
	static char buf[GS_STATE_MAX + 1];

	snprintf(buf, sizeof(buf), "%s", text);
	return gs_parse_state_line(buf, l);
}

void test_state_header(void)
{
	static const char *const bad[] = {
		"", "gpushare-upgrade", "gpushare-upgrade 1", "gpushare-upgrade 1 0.1.0",
		"gpushare-upgrade 1 0.1.0 live", "gpushare-upgrade 1 0.1.0 importing",
		"gpushare-upgrade 1 0.1.0 exported x", "gpushare-upgrade x 0.1.0 exported",
		"gpushare-upgrade -1 0.1.0 exported", "gpushare-upgrade +1 0.1.0 exported",
		"gpushare-upgrade 1 0.1/0 exported", "gpushare-upgrade 1 0.1$0 exported",
		"gpushare-upgrade 1 012345678901234567890123456789012 exported",
		"gpushare-upgrade 4294967296 0.1.0 exported", "GPUSHARE-UPGRADE 1 0.1.0 exported",
		"gpushare-upgrade 1 0.1.0 EXPORTED", "gpushare-upgrade 1 0.1.0 exported\n",
	};
	size_t i;

	CHECK(header("gpushare-upgrade 1 0.1.0 exported") == 0);
	CHECK(header("gpushare-upgrade\t1  0.2.0-rc1+g1~x_y exported") == 0);
	CHECK(header("gpushare-upgrade 1 01234567890123456789012345678901 exported") == 0);
	CHECK(header("gpushare-upgrade 2 0.3.0 exported") == -EPROTO);
	CHECK(header("gpushare-upgrade 0 0.3.0 exported") == -EPROTO);
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		if (header(bad[i]) != -EINVAL)
			fprintf(stderr, "accepted header: \"%s\"\n", bad[i]);
		CHECK(header(bad[i]) == -EINVAL);
	}
	CHECK(gs_valid_version("0.1.0") && !gs_valid_version("") &&
	      !gs_valid_version("a b") && !gs_valid_version("\"x"));
}

void test_state_lines(void)
{
	static const char *const bad[] = {
		"", " ", "set", "set default_memsize", "set default_memsize -1",
		"set default_memsize 1 2", "set default_memsize x", "set max_inst 5",
		"set 0 max_inst 26", "set 0 max_inst 0", "set 0 policy 6",
		"set 0 prio_ratio 19", "set 0 prio_ratio 100", "set 0 slice_us 999",
		"set 0 slice_us 1000001", "set 16 policy 1", "set 0 bogus 1",
		"set 0 default_memsize 1", "set 0 policy 1 2", "set 0 policy",
		"set -0 policy 1", "sets 0 policy 1", "gputime", "gputime c1",
		"gputime c1 0", "gputime c1 16 5", "gputime c1 0 -1", "gputime c1 0 1 2",
		"gputime ../x 0 1", "gputime policy 0 1", "gputimes c1 0 1", "del c1",
		"bind c1 /a", "bind c1 0", "bind c1", "add c1 0:5\n", "gpu 0 1\n",
		"set 0 policy 1\n", "gputime c1 0 1\n", "nop", "gpushare-upgrade 1 0.1.0 exported",
		"set 0 policy 18446744073709551616", "end ", " end", "end\n", "END",
		"end 1", "ends", "set 0 drain_us 999", "set 0 drain_us 10000001",
		"set 0 drain_us 0", "set 0 drain_us", "set drain_us 5000",
		"set 0 drain_us 5000 1", "set 0 forced_ends 1", "set 0 drain_ms 5",
	};
	struct gs_state_line l;
	size_t i;

	CHECK(state_line("set default_memsize 0", &l) == 0 && l.kind == GS_LINE_SET &&
	      l.setting == GS_SET_DEFAULT_MEMSIZE && l.value == 0);
	CHECK(state_line("set 3 slice_us 1000", &l) == 0 && l.kind == GS_LINE_SET &&
	      l.setting == GS_SET_SLICE_US && l.cmd.gpu == 3 && l.value == 1000);
	CHECK(state_line("set\t15 max_inst 25", &l) == 0 && l.setting == GS_SET_MAX_INST);
	CHECK(state_line("set 0 policy 5", &l) == 0 && l.setting == GS_SET_POLICY);
	CHECK(state_line("set 0 prio_ratio 99", &l) == 0 && l.setting == GS_SET_PRIO_RATIO);
	CHECK(state_line("set 2 drain_us 1000", &l) == 0 && l.kind == GS_LINE_SET &&
	      l.setting == GS_SET_DRAIN_US && l.cmd.gpu == 2 && l.value == 1000);
	CHECK(state_line("set 0 drain_us\t10000000", &l) == 0 &&
	      l.setting == GS_SET_DRAIN_US && l.value == GPUSHARE_DRAIN_US_MAX);
	CHECK(state_line("gputime c-1 2 18446744073709551615", &l) == 0 &&
	      l.kind == GS_LINE_GPUTIME && !strcmp(l.cmd.id, "c-1") && l.cmd.gpu == 2 &&
	      l.value == U64_MAX);
	CHECK(state_line("gpu 1 100", &l) == 0 && l.kind == GS_LINE_CMD &&
	      l.cmd.op == GS_OP_GPU && l.cmd.total_mem == 100);
	CHECK(state_line("add c1 0:5:10:1", &l) == 0 && l.cmd.op == GS_OP_ADD &&
	      l.cmd.quota[0].weight == 10);
	CHECK(state_line("end", &l) == 0 && l.kind == GS_LINE_END);
	CHECK(state_line("bind c1 77", &l) == 0 && l.cmd.op == GS_OP_BIND &&
	      l.cmd.cgroup_id == 77 && !l.cmd.cgroup_path);
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		if (state_line(bad[i], &l) != -EINVAL)
			fprintf(stderr, "accepted line: \"%s\"\n", bad[i]);
		CHECK(state_line(bad[i], &l) == -EINVAL);
	}
}

/* gs_check_state() over @text's lines: its answer, the bad line in *@bad. */
static int check_state(const char *const *text, u32 n, u32 *bad)
{
	static struct gs_state_line lines[32];
	static char buf[32][256];
	u32 i;

	*bad = U32_MAX;
	for (i = 0; i < n; i++) {
		snprintf(buf[i], sizeof(buf[i]), "%s", text[i]);
		if (gs_parse_state_line(buf[i], &lines[i]))
			return -1000;
	}
	return gs_check_state(lines, n, bad);
}

/* gs_check_state() over @t answers @want at line @line (if it refuses). */
static void state_is(int want, int line, const char *const *t, u32 n, int at)
{
	u32 bad;
	int got = check_state(t, n, &bad);
	bool ok = got == want && (!got || bad == (u32)line);

	if (!ok)
		fprintf(stderr, "state: %d at %u, want %d at %d\n", got, bad,
			want, line);
	check(ok, "gs_check_state", __FILE__, at);
}

#define CHECK_STATE(want, line, ...) do {				\
	static const char *const t[] = { __VA_ARGS__ };			\
	state_is(want, line, t, ARRAY_SIZE(t), __LINE__);		\
} while (0)

void test_state_check(void)
{
	/* What gs_dump_state() writes after its header. */
	CHECK_STATE(0, 0, "set default_memsize 0", "gpu 0 100", "set 0 max_inst 2",
		    "set 0 policy 3", "set 0 prio_ratio 50", "set 0 slice_us 2000",
		    "set 0 drain_us 100000", "gpu 1 100",
		    "add a 0:60:50:0,1:10:0:1", "add b 0:40:50:1", "bind a 7",
		    "bind b 8", "gputime a 0 5", "gputime a 1 6", "gputime b 0 0",
		    "end");
	CHECK_STATE(0, 0, "gpu 0 100", "end");
	CHECK_STATE(0, 0, "end");
	CHECK_STATE(0, 0, "set default_memsize 5", "gpu 0 100", "add a 0:0", "end");
	/* Not whole: no end line, or lines after it (a state cut or split). */
	CHECK_STATE(-EINVAL, 0);
	CHECK_STATE(-EINVAL, 1, "gpu 0 100");
	CHECK_STATE(-EINVAL, 3, "set default_memsize 5", "gpu 0 100", "add a 0:1");
	CHECK_STATE(-EINVAL, 1, "gpu 0 100", "end", "add a 0:1");
	CHECK_STATE(-EINVAL, 0, "end", "end");
	CHECK_STATE(-EINVAL, 1, "gpu 0 100", "add a 0:0");
	CHECK_STATE(-ENXIO, 0, "add a 0:1");
	CHECK_STATE(-ENXIO, 1, "gpu 0 100", "add a 0:1,1:1");
	CHECK_STATE(-ENXIO, 0, "set 0 policy 1", "gpu 0 100");
	CHECK_STATE(-ENXIO, 1, "gpu 0 100", "set 1 drain_us 5000", "gpu 1 100");
	/* A state of before drain_us (the default stays): taken whole. */
	CHECK_STATE(0, 0, "gpu 0 100", "set 0 slice_us 2000", "end");
	CHECK_STATE(-EINVAL, 1, "gpu 0 100", "gpu 0 200");
	CHECK_STATE(-EEXIST, 2, "gpu 0 100", "add a 0:1", "add a 0:1");
	CHECK_STATE(-ENOSPC, 2, "gpu 0 100", "add a 0:60", "add b 0:41");
	CHECK_STATE(-ENOSPC, 2, "gpu 0 100", "add a 0:1:60", "add b 0:1:41");
	CHECK_STATE(-ENOSPC, 3, "gpu 0 100", "set 0 max_inst 1", "add a 0:1", "add b 0:1");
	CHECK_STATE(-ENOSPC, 3, "gpu 0 100", "add a 0:1", "add b 0:1", "set 0 max_inst 1");
	CHECK_STATE(0, 0, "gpu 0 100", "add a 0:1", "add b 0:1", "set 0 max_inst 2", "end");
	CHECK_STATE(-ENOENT, 1, "gpu 0 100", "bind a 7", "add a 0:1");
	CHECK_STATE(-EINVAL, 3, "gpu 0 100", "add a 0:1", "bind a 7", "bind a 8");
	CHECK_STATE(-EBUSY, 4, "gpu 0 100", "add a 0:1", "add b 0:1", "bind a 7", "bind b 7");
	CHECK_STATE(-ENOENT, 1, "gpu 0 100", "gputime a 0 1");
	CHECK_STATE(-ENXIO, 3, "gpu 0 100", "gpu 1 100", "add a 0:1", "gputime a 1 1");
	CHECK_STATE(-EINVAL, 3, "gpu 0 100", "add a 0:1", "gputime a 0 1", "gputime a 0 2");
	CHECK_STATE(0, 0, "gpu 0 100", "add a 0:100:100:1", "gputime a 0 1", "end");
}
