// SPDX-License-Identifier: Apache-2.0
/*
 * A stand-in for gpushare.ko's /dev/gpushare, for testing the interposer's
 * module mode without the module: preloaded before libgpushare.so, it
 * answers open("/dev/gpushare") and the QUERY, MEM and SCHED ioctls on it.
 *
 *   FAKEGS_QUOTAS     the registration: "gpu:memsize[:weight[:highprio]],..."
 *                     in the container's GPU order (unset: open fails with
 *                     ENOENT, no module); weight defaults to 0, highprio to 0
 *   FAKEGS_STATE      a file holding the memory ledger, shared by every
 *                     process of the container
 *   FAKEGS_CONTAINER  the container's name (default "fake"): its entity in
 *                     the compute schedule, and QUERY's id
 *   FAKEGS_SCHED      a file holding the compute schedule (the real core,
 *                     kmod/gs_sched.c: one struct gs_sched per GPU and
 *                     every container's entities), shared by all the
 *                     containers of a test; unset: this process alone
 *   FAKEGS_CTL        a control file, the stand-in for the module's procfs
 *                     settings, lines of
 *                       policy GPU N | prio_ratio GPU N | slice_us GPU N |
 *                       drain_us GPU N | max_inst GPU N | weight CONTAINER GPU N |
 *                       highprio CONTAINER GPU 0|1
 *                     applied (once, by whichever process sees it first)
 *                     whenever its inode, size or mtime changes: replace it
 *                     with rename() to change settings live
 *   FAKEGS_ABI        the ABI version it answers as (default the header's;
 *                     3: a module of before EXTEND, EARLY and drain_ns)
 *
 * SCHED: a blocked ACQUIRE sleeps on a futex in the schedule (the module's
 * wait queue) until another process's op kicks it or the retry time the
 * core gave comes, and asks again at least every POLL_NS; the schedule's
 * process-shared
 * mutex is robust, so a process killed inside it stalls nobody.  The core
 * keeps pointers between its structures, so the schedule is mapped at one
 * fixed address in every process.  A file's clients detach when it is
 * closed or when the process exits normally (a destructor; later SCHED
 * calls fail with ENOENT); a killed process's stay attached, which the
 * core's grace bounds to a slice for the others.
 *
 * Each open is a new file with its own reservations (as the module's are);
 * closing a descriptor keeps them (the kernel returns them at the last
 * close; tests here do not depend on it).  A release of more than the file
 * holds on a GPU is a bug in the interposer: abort.  So is a MEM call on
 * a file another process opened (a forked child must open its own).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
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

#define MAX_FILES 64
#define MAX_FDS 1024

struct state {
	uint64_t used[GPUSHARE_MAX_GPUS];	/* by GPU index */
	uint32_t next_file;
	uint64_t mine[MAX_FILES][GPUSHARE_MAX_GPUS];
	int32_t opener[MAX_FILES];		/* pid */
};

static struct state *st;
static int file_of[MAX_FDS];		/* fd -> file id + 1, 0: not ours */
static struct gpushare_quota quotas[GPUSHARE_MAX_GPUS];
static int nquotas;
static const char *container = "fake";

static void sched_setup(void);

__attribute__((constructor)) static void setup(void)
{
	const char *q = getenv("FAKEGS_QUOTAS"), *path = getenv("FAKEGS_STATE");
	if (!q || !path)
		return;
	for (char *s = (char *)q; *s && nquotas < GPUSHARE_MAX_GPUS; ) {
		quotas[nquotas].gpu = (uint32_t)strtoul(s, &s, 10);
		quotas[nquotas].memsize = strtoull(s + 1, &s, 10);
		if (*s == ':')
			quotas[nquotas].weight = (uint32_t)strtoul(s + 1, &s, 10);
		if (*s == ':')
			quotas[nquotas].highprio = (uint32_t)strtoul(s + 1, &s, 10);
		nquotas++;
		if (*s == ',')
			s++;
	}
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, sizeof(struct state)))
		abort();
	st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (st == MAP_FAILED)
		abort();
	close(fd);
	sched_setup();
}

static int (*real_open(void))(const char *, int, ...)
{
	return (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
}

static int gsdev_open(int flags)
{
	if (!nquotas) {
		errno = ENOENT;
		return -1;
	}
	int fd = real_open()("/dev/null", O_RDWR | (flags & O_CLOEXEC));
	if (fd < 0 || fd >= MAX_FDS)
		abort();
	file_of[fd] = (int)__atomic_add_fetch(&st->next_file, 1, __ATOMIC_SEQ_CST);
	if (file_of[fd] > MAX_FILES)
		abort();
	st->opener[file_of[fd] - 1] = (int32_t)getpid();
	return fd;
}

__attribute__((visibility("default"))) int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	if (!strcmp(path, "/dev/" GPUSHARE_DEV_NAME))
		return gsdev_open(flags);
	return real_open()(path, flags, mode);
}

__attribute__((visibility("default"))) int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	return open(path, flags, mode);
}

static int quota_index(uint32_t gpu)
{
	for (int i = 0; i < nquotas; i++)
		if (quotas[i].gpu == gpu)
			return i;
	return -1;
}

static int mem(int file, struct gpushare_mem *m)
{
	int i = quota_index(m->gpu);
	uint64_t *mine;

	if (m->size < GPUSHARE_MEM_SIZE_VER0 || m->flags || m->op > GPUSHARE_MEM_RELEASE)
		return errno = EINVAL, -1;
	if (i < 0)
		return errno = ENXIO, -1;
	if (st->opener[file - 1] != (int32_t)getpid()) {
		fprintf(stderr, "fake_gsdev: pid %d uses the file pid %d opened\n", (int)getpid(),
			(int)st->opener[file - 1]);
		abort();
	}
	mine = &st->mine[file - 1][m->gpu];
	m->quota = quotas[i].memsize;
	if (m->op == GPUSHARE_MEM_RESERVE) {
		uint64_t old = __atomic_load_n(&st->used[m->gpu], __ATOMIC_SEQ_CST);
		do {
			if (m->bytes > m->quota || old > m->quota - m->bytes) {
				m->used = old;
				m->mine = *mine;
				return errno = EDQUOT, -1;
			}
		} while (!__atomic_compare_exchange_n(&st->used[m->gpu], &old, old + m->bytes, 0,
						      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
		*mine += m->bytes;
	} else if (m->op == GPUSHARE_MEM_RELEASE) {
		if (m->bytes > *mine) {
			fprintf(stderr, "fake_gsdev: release of %llu bytes, file holds %llu\n",
				(unsigned long long)m->bytes, (unsigned long long)*mine);
			abort();
		}
		*mine -= m->bytes;
		__atomic_sub_fetch(&st->used[m->gpu], m->bytes, __ATOMIC_SEQ_CST);
	}
	m->used = __atomic_load_n(&st->used[m->gpu], __ATOMIC_SEQ_CST);
	m->mine = *mine;
	return 0;
}

static uint32_t abi_version(void)
{
	const char *v = getenv("FAKEGS_ABI");

	return v && *v ? (uint32_t)strtoul(v, NULL, 10) : GPUSHARE_ABI_VERSION;
}

static int query(struct gpushare_query *q)
{
	if (q->size < GPUSHARE_QUERY_SIZE_VER0 || q->quota_size < GPUSHARE_QUOTA_SIZE_VER0 ||
	    !q->abi_version || q->flags)
		return errno = EINVAL, -1;
	q->abi_version = abi_version();
	q->count = (uint32_t)nquotas;
	q->cgroup_id = 1;
	snprintf(q->id, sizeof(q->id), "%s", container);
	for (uint32_t i = 0; i < q->quota_cap && i < (uint32_t)nquotas; i++)
		memcpy((char *)(uintptr_t)q->quotas + i * q->quota_size, &quotas[i],
		       sizeof(quotas[i]));
	if (q->quota_cap < (uint32_t)nquotas)
		return errno = EOVERFLOW, -1;
	return 0;
}

/* ---- the compute schedule (GPUSHARE_IOC_SCHED) ---- */

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

static void sched_setup(void)
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

static int sched(int file, struct gpushare_sched *a)
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
static void sched_close(int file)
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

__attribute__((visibility("default"))) int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (fd >= 0 && fd < MAX_FDS && file_of[fd]) {
		if (req == GPUSHARE_IOC_QUERY)
			return query(arg);
		if (req == GPUSHARE_IOC_MEM)
			return mem(file_of[fd], arg);
		if (req == GPUSHARE_IOC_SCHED)
			return sched(file_of[fd], arg);
		return errno = ENOTTY, -1;
	}
	int (*real)(int, unsigned long, ...) =
		(int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	return real(fd, req, arg);
}

__attribute__((visibility("default"))) int close(int fd)
{
	if (fd >= 0 && fd < MAX_FDS && file_of[fd]) {
		sched_close(file_of[fd]);
		file_of[fd] = 0;
	}
	int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "close");
	return real(fd);
}
