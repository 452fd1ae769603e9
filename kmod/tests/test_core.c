// SPDX-License-Identifier: GPL-2.0-only
/*
 * User-space unit tests of gs_core.c, the quota arithmetic and inst_ctl
 * parsing that gpushare.ko runs.  Prints "N passed, M failed" and exits
 * non-zero on any failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gs_core.h"

static int passed, failed;

#define CHECK(cond) check((cond), #cond, __LINE__)

static void check(bool ok, const char *what, int line)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
	fprintf(stderr, "test_core.c:%d: FAILED: %s\n", line, what);
}

/* Parse a copy of @text; the command lands in @cmd. */
static int parse(const char *text, struct gs_cmd *cmd)
{
	static char buf[GPUSHARE_CMD_MAX + 1];

	snprintf(buf, sizeof(buf), "%s", text);
	return gs_parse_cmd(buf, cmd);
}

static void test_numbers(void)
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

	strcpy(buf, "42\n");
	CHECK(gs_parse_value(buf, &v) == 0 && v == 42);
	strcpy(buf, "42");
	CHECK(gs_parse_value(buf, &v) == 0 && v == 42);
	strcpy(buf, "42\n\n");
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
	strcpy(buf, "\n");
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
	strcpy(buf, " 42");
	CHECK(gs_parse_value(buf, &v) == -EINVAL);
}

static void test_ids(void)
{
	char id[GPUSHARE_ID_MAX + 2];
	int i;

	memset(id, 'a', sizeof(id));
	id[GPUSHARE_ID_MAX] = '\0';
	CHECK(gs_valid_id(id));
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

static void test_parse_ok(void)
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

static void test_parse_bad(void)
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

static void test_acct(void)
{
	struct gs_acct a;
	struct gs_quota q = { .memsize = 600, .weight = 30 };

	gs_acct_init(&a, 1000);
	CHECK(a.max_inst == GPUSHARE_MAX_INST_DEFAULT);
	CHECK(gs_acct_free_mem(&a) == 1000 && gs_acct_free_weight(&a) == 100);
	CHECK(gs_acct_fits(&a, 1000, 100) == 0);
	CHECK(gs_acct_fits(&a, 1001, 0) == -ENOSPC);
	CHECK(gs_acct_fits(&a, U64_MAX, 0) == -ENOSPC);
	CHECK(gs_acct_fits(&a, 0, 101) == -ENOSPC);

	a.used_mem = 600;
	a.used_weight = 30;
	a.ninst = 1;
	CHECK(gs_acct_fits(&a, 400, 70) == 0);
	CHECK(gs_acct_fits(&a, 401, 70) == -ENOSPC);
	CHECK(gs_acct_fits(&a, 400, 71) == -ENOSPC);

	/* Resize the one container in place. */
	CHECK(gs_acct_change(&a, &q, 1000, 100) == 0);
	CHECK(a.used_mem == 1000 && a.used_weight == 100);
	CHECK(q.memsize == 1000 && q.weight == 100);
	CHECK(gs_acct_change(&a, &q, 1001, 100) == -ENOSPC);
	CHECK(gs_acct_change(&a, &q, 1000, 101) == -ENOSPC);
	CHECK(gs_acct_change(&a, &q, U64_MAX, 0) == -ENOSPC);
	CHECK(a.used_mem == 1000 && q.memsize == 1000 && q.weight == 100);
	CHECK(gs_acct_change(&a, &q, 1, 0) == 0);
	CHECK(a.used_mem == 1 && a.used_weight == 0);

	CHECK(gs_acct_set_total(&a, 0) == -EINVAL);
	CHECK(gs_acct_set_total(&a, 1) == 0 && a.total_mem == 1);
	a.used_mem = 2;
	CHECK(gs_acct_set_total(&a, 1) == -ENOSPC);

	CHECK(gs_acct_set_max_inst(&a, 0) == -EINVAL);
	CHECK(gs_acct_set_max_inst(&a, 26) == -EINVAL);
	CHECK(gs_acct_set_max_inst(&a, 25) == 0 && a.max_inst == 25);
	CHECK(gs_acct_set_max_inst(&a, 1) == 0 && a.max_inst == 1);
	CHECK(gs_acct_fits(&a, 0, 0) == -ENOSPC);	/* one instance, taken */
	a.ninst = 2;
	CHECK(gs_acct_set_max_inst(&a, 1) == -ENOSPC && a.max_inst == 1);

	CHECK(gs_check_weight(100) == 0 && gs_check_weight(101) == -EINVAL);
	CHECK(gs_check_highprio(1) == 0 && gs_check_highprio(2) == -EINVAL);
	CHECK(gs_check_policy(5) == 0 && gs_check_policy(6) == -EINVAL);
	CHECK(gs_check_prio_ratio(19) == -EINVAL && gs_check_prio_ratio(20) == 0);
	CHECK(gs_check_prio_ratio(99) == 0 && gs_check_prio_ratio(100) == -EINVAL);
	CHECK(gs_check_slice_us(GPUSHARE_SLICE_US_MIN - 1) == -EINVAL);
	CHECK(gs_check_slice_us(GPUSHARE_SLICE_US_MIN) == 0);
	CHECK(gs_check_slice_us(GPUSHARE_SLICE_US_DEFAULT) == 0);
	CHECK(gs_check_slice_us(GPUSHARE_SLICE_US_MAX) == 0);
	CHECK(gs_check_slice_us(GPUSHARE_SLICE_US_MAX + 1) == -EINVAL);
	CHECK(gs_check_slice_us(U64_MAX) == -EINVAL);
	CHECK(gs_check_slice_us(0) == -EINVAL);
	CHECK(gs_check_drain_us(GPUSHARE_DRAIN_US_MIN - 1) == -EINVAL);
	CHECK(gs_check_drain_us(GPUSHARE_DRAIN_US_MIN) == 0);
	CHECK(gs_check_drain_us(GPUSHARE_DRAIN_US_DEFAULT) == 0);
	CHECK(gs_check_drain_us(GPUSHARE_DRAIN_US_MAX) == 0);
	CHECK(gs_check_drain_us(GPUSHARE_DRAIN_US_MAX + 1) == -EINVAL);
	CHECK(gs_check_drain_us(U64_MAX) == -EINVAL);
	CHECK(gs_check_drain_us(0) == -EINVAL);
	CHECK(gs_check_setting(GS_SET_DRAIN_US, GPUSHARE_DRAIN_US_MAX) == 0);
	CHECK(gs_check_setting(GS_SET_DRAIN_US, 999) == -EINVAL);
}

/* acceptance cases 4, 5 and 7 (docs/acceptance-cases.md): all-or-nothing over several GPUs. */
static void test_admit(void)
{
	struct gs_acct g0, g2, *accts[GPUSHARE_MAX_GPUS] = { 0 };
	struct gs_quota q[3] = {
		{ .gpu = 0, .memsize = 20 }, { .gpu = 2, .memsize = 20 },
	};

	gs_acct_init(&g0, 32);
	gs_acct_init(&g2, 32);
	accts[0] = &g0;
	accts[2] = &g2;

	CHECK(gs_admit(accts, q, 2) == 0);
	gs_charge(accts, q, 2);
	CHECK(g0.used_mem == 20 && g2.used_mem == 20 && g0.ninst == 1);

	/* 20 + 40 on the second GPU: refused, the first untouched. */
	q[0].memsize = 10;
	q[1].memsize = 40;
	CHECK(gs_admit(accts, q, 2) == -ENOSPC);
	CHECK(g0.used_mem == 20 && g0.ninst == 1);

	q[2].gpu = 1;
	q[2].memsize = 1;
	CHECK(gs_admit(accts, q, 3) == -ENXIO);

	/* Compute: 25 + 25 + 50 fills the GPU, 10 more is refused. */
	q[0].memsize = 1;
	q[0].weight = 25;
	CHECK(gs_admit(accts, q, 1) == 0);
	gs_charge(accts, q, 1);
	gs_charge(accts, q, 1);
	q[0].weight = 50;
	gs_charge(accts, q, 1);
	CHECK(g0.used_weight == 100 && gs_acct_free_weight(&g0) == 0);
	q[0].weight = 10;
	CHECK(gs_admit(accts, q, 1) == -ENOSPC);
	q[0].weight = 0;
	CHECK(gs_admit(accts, q, 1) == 0);

	q[0].weight = 25;
	gs_uncharge(accts, q, 1);
	CHECK(g0.used_weight == 75 && g0.ninst == 3);

	q[0].memsize = 0;
	q[1].memsize = 7;
	CHECK(gs_resolve_default(q, 2, 0) == -EINVAL);
	CHECK(gs_resolve_default(q, 2, 5) == 0);
	CHECK(q[0].memsize == 5 && q[1].memsize == 7);
}

/* Random charges and releases never over-commit and always balance. */
static void test_random(void)
{
	struct gs_acct g[4], *accts[GPUSHARE_MAX_GPUS] = { 0 };
	struct gs_quota live[64][4];
	u32 nlive[64] = { 0 };
	bool ok = true;
	int i, j, k;

	srand(1234);
	for (i = 0; i < 4; i++) {
		gs_acct_init(&g[i], 1000);
		accts[i] = &g[i];
	}
	for (i = 0; i < 20000; i++) {
		int slot = rand() % 64;

		if (nlive[slot]) {
			gs_uncharge(accts, live[slot], nlive[slot]);
			nlive[slot] = 0;
		} else {
			u32 n = 1 + rand() % 4, first = rand() % 4;

			for (j = 0; j < (int)n; j++) {
				live[slot][j].gpu = (first + j) % 4;
				live[slot][j].memsize = rand() % 400;
				live[slot][j].weight = rand() % 60;
			}
			if (!gs_admit(accts, live[slot], n)) {
				gs_charge(accts, live[slot], n);
				nlive[slot] = n;
			}
		}
		for (j = 0; j < 4; j++) {
			u64 mem = 0;
			u32 weight = 0, ninst = 0;

			for (k = 0; k < 64; k++) {
				u32 m;

				for (m = 0; m < nlive[k]; m++) {
					if (live[k][m].gpu != (u32)j)
						continue;
					mem += live[k][m].memsize;
					weight += live[k][m].weight;
					ninst++;
				}
			}
			ok = ok && mem == g[j].used_mem && mem <= g[j].total_mem &&
			     weight == g[j].used_weight && weight <= 100 &&
			     ninst == g[j].ninst && ninst <= g[j].max_inst;
		}
	}
	CHECK(ok);
}

/* One container's share: its quota, ledger and two files' holdings. */
struct share {
	struct gs_quota q;
	struct gs_ledger l;
	u64 mine[2];
};

static bool share_is(const struct share *s, u64 used, u64 a, u64 b)
{
	return s->l.used == used && s->mine[0] == a && s->mine[1] == b;
}

/* Reserve and release at the boundaries: 0, the quota, quota + 1, U64_MAX. */
static void test_ledger(void)
{
	struct gs_acct a;
	struct share s = { .q = { .memsize = 1000 } };

	gs_acct_init(&a, 4000);
	CHECK(gs_mem_quota(&s.q, &s.l) == 1000);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 0) == 0 && share_is(&s, 0, 0, 0));
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 1001) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], U64_MAX) == -EDQUOT);
	CHECK(share_is(&s, 0, 0, 0));
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 1000) == 0 && share_is(&s, 1000, 1000, 0));
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 1) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 0) == 0 && share_is(&s, 1000, 1000, 0));
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], 1001) == -EINVAL);
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 1) == -EINVAL);	/* not its bytes */
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], U64_MAX) == -EINVAL);
	CHECK(share_is(&s, 1000, 1000, 0));

	/* Two files share the quota: 600 + 400, then one byte more is refused. */
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], 400) == 0 && share_is(&s, 600, 600, 0));
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 401) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 400) == 0 && share_is(&s, 1000, 600, 400));
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 500) == -EINVAL);	/* more than it holds */
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 400) == 0 && share_is(&s, 600, 600, 0));

	/* used + bytes wraps around 2^64: a naive sum would say it fits. */
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], U64_MAX - 500) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], U64_MAX - 599) == -EDQUOT);
	CHECK(share_is(&s, 600, 600, 0));
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], 600) == 0 && share_is(&s, 0, 0, 0));
	CHECK(a.orphaned_mem == 0);

	/* A quota of U64_MAX bytes: all of it, then nothing more. */
	s.q.memsize = U64_MAX;
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], U64_MAX - 1) == 0);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 2) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], U64_MAX) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 1) == 0);
	CHECK(share_is(&s, U64_MAX, U64_MAX - 1, 1));
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 1) == -EDQUOT);
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], U64_MAX) == -EINVAL);
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], U64_MAX - 1) == 0);
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 1) == 0 && share_is(&s, 0, 0, 0));

	/* A ledger found above its quota (never, by construction) refuses all. */
	s.q.memsize = 10;
	s.l.used = 11;
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 0) == -EDQUOT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], U64_MAX) == -EDQUOT);
}

/* memsize is never set below what the container's processes hold. */
static void test_memsize_vs_used(void)
{
	struct gs_acct a, *accts[GPUSHARE_MAX_GPUS] = { &a };
	struct share s = { .q = { .memsize = 600, .weight = 10 } };

	gs_acct_init(&a, 1000);
	gs_charge(accts, &s.q, 1);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 400) == 0);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 399) == -EBUSY);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 0) == -EINVAL);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 1001) == -ENOSPC);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, U64_MAX) == -ENOSPC);
	CHECK(s.q.memsize == 600 && a.used_mem == 600 && s.q.weight == 10);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 400) == 0);
	CHECK(s.q.memsize == 400 && a.used_mem == 400 && a.used_weight == 10);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 1) == -EDQUOT);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 1000) == 0 && a.used_mem == 1000);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 600) == 0);
	CHECK(gs_acct_set_memsize(&a, &s.q, &s.l, 999) == -EBUSY);
}

/*
 * A container deleted while its files hold 400 bytes: they stay charged
 * to the GPU as orphaned until released, and nothing more is reserved.
 */
static void test_orphaned(void)
{
	struct gs_acct a, *accts[GPUSHARE_MAX_GPUS] = { 0 };
	struct share s = { .q = { .memsize = 600 } };
	struct gs_quota other = { .memsize = 500 };

	gs_acct_init(&a, 1000);
	accts[0] = &a;
	gs_charge(accts, &s.q, 1);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 300) == 0);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[1], 100) == 0);
	CHECK(gs_acct_free_mem(&a) == 400);

	gs_uncharge(accts, &s.q, 1);
	gs_mem_orphan(&a, &s.l);
	CHECK(s.l.orphaned && a.orphaned_mem == 400 && a.used_mem == 0);
	gs_mem_orphan(&a, &s.l);			/* once only */
	CHECK(a.orphaned_mem == 400);
	CHECK(gs_acct_free_mem(&a) == 600);
	CHECK(gs_mem_quota(&s.q, &s.l) == 0);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 0) == -ENOENT);
	CHECK(gs_mem_reserve(&s.q, &s.l, &s.mine[0], 1) == -ENOENT);
	CHECK(share_is(&s, 400, 300, 100));

	/* Admission counts the orphaned bytes out. */
	CHECK(gs_acct_fits(&a, 601, 0) == -ENOSPC);
	CHECK(gs_admit(accts, &other, 1) == 0);
	other.memsize = 700;
	CHECK(gs_admit(accts, &other, 1) == -ENOSPC);
	CHECK(gs_acct_set_total(&a, 399) == -ENOSPC);
	CHECK(gs_acct_set_total(&a, 400) == 0 && gs_acct_free_mem(&a) == 0);
	CHECK(gs_acct_set_total(&a, 1000) == 0);

	/* Releases bounded by each file's holding; the GPU gets them back. */
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 101) == -EINVAL);
	CHECK(a.orphaned_mem == 400 && share_is(&s, 400, 300, 100));
	CHECK(gs_mem_release(&a, &s.l, &s.mine[0], 300) == 0);
	CHECK(a.orphaned_mem == 100 && gs_acct_free_mem(&a) == 900);
	CHECK(gs_admit(accts, &other, 1) == 0);
	CHECK(gs_mem_release(&a, &s.l, &s.mine[1], 100) == 0);
	CHECK(a.orphaned_mem == 0 && gs_acct_free_mem(&a) == 1000);
	CHECK(share_is(&s, 0, 0, 0));
}

/*
 * Random reserves, releases, file closes, deletions and memsize writes on
 * one GPU, against a model: no container ever holds more than its
 * memsize, the GPU's books always balance, and everything ends at zero.
 */
#define NCTR	4
#define NFILE	3

static void test_ledger_random(void)
{
	static const u64 sizes[] = { 0, 1, 7, 100, 250, 999, U64_MAX, U64_MAX - 3 };
	struct gs_acct a, *accts[GPUSHARE_MAX_GPUS] = { 0 };
	struct share s[NCTR];
	u64 mine[NCTR][NFILE];
	bool live[NCTR];
	u64 model_used[NCTR] = { 0 };
	/* outcomes seen: reserved, EDQUOT, ENOENT, EINVAL, EBUSY, ENOSPC, re-added */
	int seen[7] = { 0 };
	bool ok = true;
	int i, c, f;

	srand(4321);
	gs_acct_init(&a, 2000);
	accts[0] = &a;
	memset(s, 0, sizeof(s));
	memset(mine, 0, sizeof(mine));
	for (c = 0; c < NCTR; c++) {
		s[c].q.memsize = 400;
		gs_charge(accts, &s[c].q, 1);
		live[c] = true;
	}
	for (i = 0; i < 50000; i++) {
		u64 bytes = sizes[rand() % ARRAY_SIZE(sizes)];
		int r = rand() % 100, ret, want;

		c = rand() % NCTR;
		f = rand() % NFILE;
		if (r < 45) {
			u64 room = live[c] ? s[c].q.memsize - model_used[c] : 0;

			want = !live[c] ? -ENOENT : bytes > room ? -EDQUOT : 0;
			ret = gs_mem_reserve(&s[c].q, &s[c].l, &mine[c][f], bytes);
			ok = ok && ret == want;
			seen[ret == -EDQUOT ? 1 : ret == -ENOENT ? 2 : 0]++;
			if (!ret)
				model_used[c] += bytes;
		} else if (r < 85) {
			if (rand() % 2)
				bytes = mine[c][f] ? (u64)rand() % (mine[c][f] + 1) : 0;
			want = bytes > mine[c][f] ? -EINVAL : 0;
			ret = gs_mem_release(&a, &s[c].l, &mine[c][f], bytes);
			ok = ok && ret == want;
			seen[3] += ret == -EINVAL;
			if (!ret)
				model_used[c] -= bytes;
		} else if (r < 90) {		/* close: return everything */
			bytes = mine[c][f];
			ok = ok && !gs_mem_release(&a, &s[c].l, &mine[c][f], bytes);
			model_used[c] -= bytes;
		} else if (r < 95 && live[c]) {
			u64 mem = 1 + rand() % 800;

			want = mem < model_used[c] ? -EBUSY :
			       mem > gs_acct_free_mem(&a) + s[c].q.memsize ? -ENOSPC : 0;
			ok = ok && gs_acct_set_memsize(&a, &s[c].q, &s[c].l, mem) == want;
			seen[4] += want == -EBUSY;
			seen[5] += want == -ENOSPC;
		} else if (r < 97 && live[c]) {	/* del */
			gs_uncharge(accts, &s[c].q, 1);
			gs_mem_orphan(&a, &s[c].l);
			live[c] = false;
		} else if (!live[c] && !s[c].l.used) {	/* add again: a fresh ledger */
			struct gs_quota q = { .memsize = 1 + rand() % 400 };

			if (!gs_admit(accts, &q, 1)) {
				memset(&s[c], 0, sizeof(s[c]));
				s[c].q = q;
				gs_charge(accts, &s[c].q, 1);
				live[c] = true;
				seen[6]++;
			}
		}
		{
			u64 held = 0, quotas = 0, orphaned = 0;

			for (c = 0; c < NCTR; c++) {
				u64 sum = 0;

				for (f = 0; f < NFILE; f++)
					sum += mine[c][f];
				ok = ok && sum == s[c].l.used && sum == model_used[c];
				ok = ok && (!live[c] || sum <= s[c].q.memsize);
				ok = ok && s[c].l.orphaned == !live[c];
				if (live[c])
					quotas += s[c].q.memsize;
				else
					orphaned += sum;
				held += sum;
			}
			ok = ok && a.used_mem == quotas && a.orphaned_mem == orphaned;
			ok = ok && quotas + orphaned <= a.total_mem && held <= a.total_mem;
		}
		if (!ok) {
			fprintf(stderr, "ledger model broken at step %d\n", i);
			break;
		}
	}
	for (c = 0; c < NCTR; c++)
		for (f = 0; f < NFILE; f++)
			ok = ok && !gs_mem_release(&a, &s[c].l, &mine[c][f], mine[c][f]);
	CHECK(ok);
	CHECK(a.orphaned_mem == 0);
	for (c = 0; c < NCTR; c++)
		CHECK(s[c].l.used == 0);
	for (i = 0; i < (int)ARRAY_SIZE(seen); i++)
		CHECK(seen[i] > 0);	/* every outcome, or the run proves little */
}

/* ---- the upgrade state ---- */

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

static void test_state_header(void)
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

static void test_state_lines(void)
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
	check(ok, "gs_check_state", at);
}

#define CHECK_STATE(want, line, ...) do {				\
	static const char *const t[] = { __VA_ARGS__ };			\
	state_is(want, line, t, ARRAY_SIZE(t), __LINE__);		\
} while (0)

static void test_state_check(void)
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

int main(void)
{
	test_numbers();
	test_ids();
	test_parse_ok();
	test_parse_bad();
	test_acct();
	test_admit();
	test_random();
	test_ledger();
	test_memsize_vs_used();
	test_orphaned();
	test_ledger_random();
	test_state_header();
	test_state_lines();
	test_state_check();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
