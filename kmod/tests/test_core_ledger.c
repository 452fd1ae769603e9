// SPDX-License-Identifier: GPL-2.0-only
/*
 * test_core: the memory ledger (gs_core.c).
 */
#include "test_core.h"

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
void test_ledger(void)
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
void test_memsize_vs_used(void)
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
void test_orphaned(void)
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

void test_ledger_random(void)
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
