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
 *
 * The parts: this file (the state, open, MEM, QUERY, the ioctl and close
 * entry points), fake_gsdev_sched.c (the compute schedule: SCHED and
 * FAKEGS_CTL); fake_gsdev.h is what they share.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uapi/gpushare.h>

#include "fake_gsdev.h"

struct state *st;
static int file_of[MAX_FDS];		/* fd -> file id + 1, 0: not ours */
struct gpushare_quota quotas[GPUSHARE_MAX_GPUS];
int nquotas;
const char *container = "fake";

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

int quota_index(uint32_t gpu)
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

uint32_t abi_version(void)
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
