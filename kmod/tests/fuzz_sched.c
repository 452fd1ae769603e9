// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Random sequences of every call the compute scheduler's core takes, in
 * forward time, under ASan and UBSan: what tenants can do (ACQUIRE, EARLY
 * renewals, EXTEND heartbeats, RELEASE with any report, close), what the
 * operator's writes do live (weight, highprio, policy, prio_ratio,
 * max_inst, slice, drain) and containers deleted and added.  After every
 * call, no entity's gs_sched_used() may have gone down: GPU time is a
 * counter (the bug a95829c fixed dropped it 6027 times in 2M steps).
 *
 * u64 is __u64 (gs_sched.h), unsigned long long: printed with %llu.
 *
 * Runs for GS_FUZZ_MS milliseconds (3000), each run of STEPS steps seeded
 * by the seed and its number; GS_FUZZ_SEED replays a seed (printed first,
 * else taken from the clock), GS_FUZZ_RUN one run of it.  Exits 1 on the
 * first break, naming the seed, the run and the step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gs_sched.h"

#define MS		1000000ull
#define NE		4		/* entities (containers) */
#define NC		8		/* clients (open files), NC / NE each */
#define STEPS		20000

struct fuzz {
	u64 rng;
	u64 now;
	struct gs_sched s;
	struct gs_sched_ent e[NE];
	struct gs_sched_client c[NC];
	bool attached[NC];
	u64 seen[NE];		/* each entity's gputime at the last check */
};

/* xorshift64: the sequence is the seed's, on every machine. */
static u64 rnd(struct fuzz *f)
{
	f->rng ^= f->rng << 13;
	f->rng ^= f->rng >> 7;
	f->rng ^= f->rng << 17;
	return f->rng;
}

static u64 wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (u64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static u32 any_weight(struct fuzz *f)
{
	return rnd(f) % 3 ? 5 * (rnd(f) % 21) : 0;
}

/* What a process reports after its work: nothing, lies or its time. */
static u64 any_report(struct fuzz *f)
{
	switch (rnd(f) % 5) {
	case 0:
		return 0;
	case 1:
		return ~0ull;
	case 2:
		return rnd(f) % (100 * MS);
	default:
		return rnd(f) % (5 * MS);
	}
}

/* del and add again, as inst_ctl does: its clients closed first. */
static void readd(struct fuzz *f, int i)
{
	int k;

	for (k = i; k < NC; k += NE) {
		if (f->attached[k])
			gs_sched_detach(&f->s, &f->c[k], f->now);
		f->attached[k] = false;
	}
	gs_sched_del(&f->s, &f->e[i], f->now);
	memset(&f->e[i], 0, sizeof(f->e[i]));
	gs_sched_add(&f->s, &f->e[i], any_weight(f), rnd(f) % 4 == 0, f->now);
	f->seen[i] = 0;
}

/* A procfs write of one of the GPU's settings, within its bounds. */
static void setting(struct fuzz *f)
{
	struct gs_sched *s = &f->s;

	switch (rnd(f) % 5) {
	case 0:
		gs_sched_set_policy(s, rnd(f) % 6, f->now);
		break;
	case 1:
		gs_sched_set_slice(s, (1 + rnd(f) % 100) * MS, f->now);
		break;
	case 2:
		gs_sched_set_drain(s, rnd(f) % 50 * MS, f->now);
		break;
	case 3:
		gs_sched_set_prio_ratio(s, 20 + rnd(f) % 80, f->now);
		break;
	default:
		gs_sched_set_max_inst(s, 1 + rnd(f) % 25, f->now);
		break;
	}
}

static void step(struct fuzz *f)
{
	int k = rnd(f) % NC, i = rnd(f) % NE, op = rnd(f) % 100;
	struct gs_sched_client *c = &f->c[k];
	struct gs_sched *s = &f->s;
	u64 until;

	f->now += rnd(f) % 4 == 0 ? 0 : rnd(f) % (3 * MS);
	if (!f->attached[k]) {
		gs_sched_attach(s, c, &f->e[k % NE], f->now);
		f->attached[k] = true;
	} else if (op < 35) {
		gs_sched_acquire(s, c, f->now, &until);
	} else if (op < 45) {
		gs_sched_renew(s, c, f->now, &until);
	} else if (op < 55) {
		gs_sched_extend(s, c, f->now, &until);
	} else if (op < 84) {
		gs_sched_release(s, c, any_report(f), f->now);
	} else if (op < 87) {
		gs_sched_detach(s, c, f->now);
		f->attached[k] = false;
	} else if (op < 93) {
		gs_sched_set_weight(s, &f->e[i], any_weight(f), f->now);
	} else if (op < 96) {
		gs_sched_set_highprio(s, &f->e[i], rnd(f) % 2, f->now);
	} else if (op < 99) {
		setting(f);
	} else {
		readd(f, i);
	}
}

/* One run; 0, or 1 after printing the first break. */
static int fuzz_run(u64 seed, u64 nr)
{
	static struct fuzz f;
	long t;
	int i;

	memset(&f, 0, sizeof(f));
	f.rng = (seed ^ 0x9e3779b97f4a7c15ull * (nr + 1)) | 1;
	f.now = 1000 * MS;
	gs_sched_init(&f.s, f.now);
	gs_sched_set_policy(&f.s, rnd(&f) % 6, f.now);
	gs_sched_set_slice(&f.s, (1 + rnd(&f) % 20) * MS, f.now);
	for (i = 0; i < NE; i++)
		gs_sched_add(&f.s, &f.e[i], any_weight(&f), rnd(&f) % 4 == 0,
			     f.now);
	for (t = 0; t < STEPS; t++) {
		step(&f);
		for (i = 0; i < NE; i++) {
			u64 used = gs_sched_used(&f.s, &f.e[i], f.now);

			if (used < f.seen[i]) {
				printf("FAIL seed %llu run %llu step %ld: ", seed,
				       nr, t);
				printf("entity %d gputime %llu -> %llu\n", i,
				       f.seen[i], used);
				return 1;
			}
			f.seen[i] = used;
		}
	}
	return 0;
}

static u64 env_u64(const char *name, u64 dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

int main(void)
{
	u64 seed = env_u64("GS_FUZZ_SEED", (u64)time(NULL));
	u64 budget = env_u64("GS_FUZZ_MS", 3000);
	u64 only = env_u64("GS_FUZZ_RUN", ~0ull);
	u64 start = wall_ms(), nr = 0;

	printf("fuzz_sched: seed %llu (GS_FUZZ_SEED to replay)\n", seed);
	if (only != ~0ull)
		return fuzz_run(seed, only);
	do {
		if (fuzz_run(seed, nr))
			return 1;
		nr++;
	} while (wall_ms() - start < budget);
	printf("fuzz_sched: %llu runs of %d steps, gputime never went down\n",
	       nr, STEPS);
	return 0;
}
