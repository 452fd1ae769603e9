// SPDX-License-Identifier: Apache-2.0
/*
 * /dev/gpushare's stand-in (see fake_gsdev.c): the compute schedule, the
 * real core (kmod/gs_sched.c) in a file shared by the containers of a test
 * (FAKEGS_SCHED), its settings from FAKEGS_CTL, and the SCHED ioctl.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include <uapi/gpushare.h>

#include "gs_sched.h"
#include "fake_gsdev.h"

#define MAX_CONTAINERS 32
#define POLL_NS 2000000ull			/* a blocked ACQUIRE asks again */
#define SCHED_MAGIC 0x67737363u
#define SCHED_ADDR ((void *)0x6e5700000000ull)	/* the same in every process */

struct fcontainer {
	char name[GPUSHARE_ID_MAX + 1];
	int32_t weight[GPUSHARE_MAX_GPUS];	/* FAKEGS_CTL's, -1: the quota's */
	int32_t highprio[GPUSHARE_MAX_GPUS];
	struct gs_sched_ent ent[GPUSHARE_MAX_GPUS];
};

struct sched_state {
	uint32_t magic;
	pthread_mutex_t mu;		/* robust, process-shared */
	uint64_t ctl_key[3];		/* the control file last applied */
	struct gs_sched gpu[GPUSHARE_MAX_GPUS];
	uint32_t ncont;
	struct fcontainer cont[MAX_CONTAINERS];
	_Atomic uint32_t gen;		/* moves at every change: a futex */
};

static struct sched_state *ss;
static const char *ctl_path;
static struct gs_sched_client clients[MAX_FILES][GPUSHARE_MAX_GPUS];	/* by file */
static bool gone;			/* exiting: the clients are detached */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sched_setup(void)
{
	const char *path = getenv("FAKEGS_SCHED"), *name = getenv("FAKEGS_CONTAINER");
	int fd = -1, flags = MAP_FIXED_NOREPLACE;
	struct stat sb;

	if (name && *name)
		container = name;
	ctl_path = getenv("FAKEGS_CTL");
	if (path && *path) {
		/* flock: the first process initialises, the others wait for it. */
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || flock(fd, LOCK_EX) || fstat(fd, &sb) ||
		    ((size_t)sb.st_size < sizeof(*ss) && ftruncate(fd, sizeof(*ss)))) {
			perror("fake_gsdev: FAKEGS_SCHED");
			abort();
		}
		flags |= MAP_SHARED;
	} else {
		flags |= MAP_PRIVATE | MAP_ANONYMOUS;
	}
	ss = mmap(SCHED_ADDR, sizeof(*ss), PROT_READ | PROT_WRITE, flags, fd, 0);
	if (ss != SCHED_ADDR) {
		fprintf(stderr, "fake_gsdev: cannot map the schedule at %p\n", SCHED_ADDR);
		abort();
	}
	if (ss->magic != SCHED_MAGIC) {
		pthread_mutexattr_t a;
		uint64_t now = now_ns();
		pthread_mutexattr_init(&a);
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
		pthread_mutex_init(&ss->mu, &a);
		for (int g = 0; g < GPUSHARE_MAX_GPUS; g++)
			gs_sched_init(&ss->gpu[g], now);
		ss->magic = SCHED_MAGIC;
	}
	if (fd >= 0) {
		flock(fd, LOCK_UN);
		close(fd);
	}
}

static void sched_lock(void)
{
	if (pthread_mutex_lock(&ss->mu) == EOWNERDEAD)
		pthread_mutex_consistent(&ss->mu);
}

static void sched_unlock(void)
{
	pthread_mutex_unlock(&ss->mu);
}

/* Something changed: the waiters ask again (the module's kick). */
static void sched_kick(void)
{
	atomic_fetch_add(&ss->gen, 1);
	syscall(SYS_futex, &ss->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleep until @t (CLOCK_MONOTONIC ns) or a kick after generation @seen. */
static void sched_sleep(uint32_t seen, uint64_t now, uint64_t t)
{
	struct timespec ts = { (time_t)((t - now) / 1000000000u),
			       (long)((t - now) % 1000000000u) };

	syscall(SYS_futex, &ss->gen, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* Under the lock: @name's slot, made if new; NULL when full. */
static struct fcontainer *cont_get(const char *name)
{
	struct fcontainer *c;
	for (uint32_t i = 0; i < ss->ncont; i++)
		if (!strcmp(ss->cont[i].name, name))
			return &ss->cont[i];
	if (ss->ncont == MAX_CONTAINERS)
		return NULL;
	c = &ss->cont[ss->ncont++];
	snprintf(c->name, sizeof(c->name), "%s", name);
	for (int g = 0; g < GPUSHARE_MAX_GPUS; g++)
		c->weight[g] = c->highprio[g] = -1;
	return c;
}

/* Under the lock: apply FAKEGS_CTL if it changed since it was last applied. */
static void ctl_apply(uint64_t now)
{
	char line[256], what[32], name[GPUSHARE_ID_MAX + 1];
	unsigned int gpu, v;
	struct stat sb;
	FILE *f;

	if (!ctl_path || stat(ctl_path, &sb))
		return;
	uint64_t key[3] = { (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
			    (uint64_t)sb.st_mtim.tv_sec * 1000000000u +
			    (uint64_t)sb.st_mtim.tv_nsec };
	if (!memcmp(key, ss->ctl_key, sizeof(key)) || !(f = fopen(ctl_path, "re")))
		return;
	memcpy(ss->ctl_key, key, sizeof(key));
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%31s %64s %u %u", what, name, &gpu, &v) == 4) {
			struct fcontainer *c = cont_get(name);
			if (!c || gpu >= GPUSHARE_MAX_GPUS)
				continue;
			struct gs_sched_ent *e = &c->ent[gpu];
			if (!strcmp(what, "weight")) {
				c->weight[gpu] = (int32_t)v;
				if (e->added)
					gs_sched_set_weight(&ss->gpu[gpu], e, v, now);
			} else if (!strcmp(what, "highprio")) {
				c->highprio[gpu] = (int32_t)v;
				if (e->added)
					gs_sched_set_highprio(&ss->gpu[gpu], e, v, now);
			}
		} else if (sscanf(line, "%31s %u %u", what, &gpu, &v) == 3 &&
			   gpu < GPUSHARE_MAX_GPUS) {
			struct gs_sched *s = &ss->gpu[gpu];
			if (!strcmp(what, "policy"))
				gs_sched_set_policy(s, v, now);
			else if (!strcmp(what, "prio_ratio"))
				gs_sched_set_prio_ratio(s, v, now);
			else if (!strcmp(what, "slice_us"))
				gs_sched_set_slice(s, (uint64_t)v * 1000, now);
			else if (!strcmp(what, "drain_us"))
				gs_sched_set_drain(s, (uint64_t)v * 1000, now);
			else if (!strcmp(what, "max_inst"))
				gs_sched_set_max_inst(s, v, now);
		}
	}
	fclose(f);
}

/* Under the lock: this container's entity on @gpu (quota @qi), added if new. */
static struct gs_sched_ent *my_ent(int qi, uint32_t gpu, uint64_t now)
{
	struct fcontainer *c = cont_get(container);
	if (!c)
		return NULL;
	struct gs_sched_ent *e = &c->ent[gpu];
	if (!e->added) {
		uint32_t w = c->weight[gpu] >= 0 ? (uint32_t)c->weight[gpu] : quotas[qi].weight;
		uint32_t hp = c->highprio[gpu] >= 0 ? (uint32_t)c->highprio[gpu] :
			      quotas[qi].highprio;
		if (gs_sched_add(&ss->gpu[gpu], e, w, hp, now))
			return NULL;
	}
	return e;
}

int sched(int file, struct gpushare_sched *a)
{
	const char *tail = (const char *)a + sizeof(*a);
	int qi = quota_index(a->gpu), err = 0;
	u64 now = now_ns(), until = 0;

	/* FAKEGS_ABI=3: a module of before EXTEND and EARLY. */
	bool abi3 = abi_version() < 4;
	uint32_t ops = abi3 ? GPUSHARE_SCHED_RELEASE : GPUSHARE_SCHED_EXTEND;
	uint32_t flags = GPUSHARE_SCHED_NOWAIT | (abi3 ? 0 : GPUSHARE_SCHED_EARLY);

	if (a->size < GPUSHARE_SCHED_SIZE_VER0 || a->op > ops || a->flags & ~flags)
		return errno = EINVAL, -1;
	for (uint32_t i = sizeof(*a); i < a->size; i++)
		if (tail[i - sizeof(*a)])
			return errno = E2BIG, -1;
	if (qi < 0 || a->gpu >= GPUSHARE_MAX_GPUS)
		return errno = ENXIO, -1;
	if (gone)
		return errno = ENOENT, -1;
	struct gs_sched *s = &ss->gpu[a->gpu];
	struct gs_sched_client *c = &clients[file - 1][a->gpu];
	sched_lock();
	ctl_apply(now);
	struct gs_sched_ent *e = my_ent(qi, a->gpu, now);
	if (!e) {
		sched_unlock();
		return errno = ENOENT, -1;
	}
	a->out_flags = 0;
	if (a->op == GPUSHARE_SCHED_ACQUIRE && (a->flags & GPUSHARE_SCHED_EARLY)) {
		if (!c->ent || gs_sched_renew(s, c, now, &until) != GS_SCHED_GRANT)
			err = EAGAIN;
		if (!err && s->policy == 5)
			a->out_flags = GPUSHARE_SCHED_NATIVE;
	} else if (a->op == GPUSHARE_SCHED_EXTEND) {
		if (!c->ent || !gs_sched_extend(s, c, now, &until))
			err = EAGAIN;
	} else if (a->op == GPUSHARE_SCHED_ACQUIRE) {
		if (!c->ent)
			gs_sched_attach(s, c, e, now);
		while (gs_sched_acquire(s, c, now, &until) != GS_SCHED_GRANT) {
			if (a->flags & GPUSHARE_SCHED_NOWAIT) {
				err = EAGAIN;
				break;
			}
			uint32_t seen = atomic_load(&ss->gen);
			sched_unlock();
			uint64_t t = until < now + POLL_NS ? until : now + POLL_NS;
			if (t < now + 20000)
				t = now + 20000;
			sched_sleep(seen, now, t);
			now = now_ns();
			sched_lock();
			ctl_apply(now);
		}
		if (!err && s->policy == 5)
			a->out_flags = GPUSHARE_SCHED_NATIVE;
	} else if (a->op == GPUSHARE_SCHED_RELEASE && c->ent) {
		gs_sched_release(s, c, a->used_ns, now);
	}
	if (a->op != GPUSHARE_SCHED_INFO && a->op != GPUSHARE_SCHED_EXTEND)
		sched_kick();
	a->until = until;
	a->slice_ns = s->slice_ns;
	a->gputime_ns = gs_sched_used(s, e, now);
	a->policy = s->policy;
	a->weight = e->weight;
	a->highprio = e->highprio;
	if (!abi3 && a->size >= GPUSHARE_SCHED_SIZE_VER1) {
		a->drain_ns = s->drain_ns;
		a->forced_ends = s->forced_ends;
	}
	sched_unlock();
	return err ? (errno = err, -1) : 0;
}

/*
 * The file's clients leave the schedule, as the module's file release: in
 * the process that opened it only (the module releases a file at its last
 * close; a forked child's copy of it, closed or at exit, is not that).
 */
void sched_close(int file)
{
	if (!ss || !st || st->opener[file - 1] != (int32_t)getpid())
		return;
	sched_lock();
	for (int g = 0; g < GPUSHARE_MAX_GPUS; g++)
		if (clients[file - 1][g].ent)
			gs_sched_detach(&ss->gpu[g], &clients[file - 1][g], now_ns());
	sched_kick();
	sched_unlock();
}

__attribute__((destructor)) static void sched_exit(void)
{
	for (int f = 1; f <= MAX_FILES; f++)
		sched_close(f);
	gone = true;
}
