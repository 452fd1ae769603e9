/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * The deep-queue acceptance tests (test_deep.c: the matrix, S1-S4;
 * deep_legacy.c: S10; deep_cases.c: S5-S9 and S11) on the model of sim.h.
 */
#ifndef _GS_TEST_DEEP_H
#define _GS_TEST_DEEP_H

#include <stdio.h>

#include "sim.h"

#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))
#endif
#ifndef __printf
#define DEEP_ATTR(x)	__attribute__(x)
#define __printf(a, b)	DEEP_ATTR((format(printf, a, b)))
#endif

extern int deep_passed, deep_failed;

/* A check; @fmt... says which run when it fails. */
#define CHECK(cond, ...) \
	deep_check((cond), #cond, __FILE__, __LINE__, __VA_ARGS__)
__printf(5, 6)
void deep_check(bool ok, const char *what, const char *file, int line,
		const char *fmt, ...);

/*
 * A known finding, pinned as a strict expected failure: the check must
 * fail (counted, printed with @finding); if it passes, that is a failure
 * (the finding is fixed: make it a CHECK).  The criterion is unchanged.
 */
extern int deep_xfailed;
#define XFAIL(cond, finding, ...) \
	deep_xfail((cond), #cond, (finding), __FILE__, __LINE__, __VA_ARGS__)
__printf(6, 7)
void deep_xfail(bool ok, const char *what, const char *finding,
		const char *file, int line, const char *fmt, ...);

/* GS_DEEP_FULL=1: the study's lengths; GS_DEEP_SMALL=1: the reduced run. */
extern bool deep_full, deep_small;
extern u64 deep_warm, deep_len;

/* One configuration of the matrix. */
struct deep_conf {
	const char *name;
	u32 policy, max_inst;
	int n;
	u32 weight[SIM_MAXP];
	double want[SIM_MAXP];	/* each share, percent of the GPU */
	bool fill;		/* the policy fills the GPU */
	int k;			/* others' slices in a row the rates imply */
};

#define DEEP_NCONF	7
extern const struct deep_conf deep_confs[DEEP_NCONF];
extern const u32 deep_q[4];
extern const u64 deep_d[5];

/* What a run measured. */
struct deep_res {
	double share[SIM_MAXP];
	double busy;
	double err;		/* worst |share - want| */
	u64 max_gap;		/* longest gap of a container, ns */
	u64 forced;		/* slices ended by force in the window */
};

double deep_abs(double x);
void deep_cell_of(int i, int *g, int *a, int *qi, int *di);
void deep_cfg(struct sim_cfg *c, const struct deep_conf *k,
	      enum sim_gpu gpu, enum sim_app app, u32 q, u64 d);
void deep_run(const struct sim_cfg *c, const struct deep_conf *k,
	      struct deep_res *r, const char *what);
const char *deep_cell(const struct sim_cfg *c);

/* deep_legacy.c: S10; the old gate's tenant share as 94b5eb2 gave it. */
void deep_s10(bool table);
void deep_legacy_matrix(void);
double deep_legacy_share(int conf, enum sim_gpu gpu, u32 q,
			 enum sim_evil evil);

/* deep_cases.c */
void deep_cases(void);

#endif /* _GS_TEST_DEEP_H */
