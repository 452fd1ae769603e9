// SPDX-License-Identifier: GPL-2.0-only
/*
 * test_core: a GPU's accounting and admission (gs_core.c).
 */
#include "test_core.h"

void test_acct(void)
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
void test_admit(void)
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
void test_random(void)
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
