// SPDX-License-Identifier: Apache-2.0
/*
 * A stand-in for gpushare.ko's /dev/gpushare, for testing the interposer's
 * module mode without the module: preloaded before libgpushare.so, it
 * answers open("/dev/gpushare") and the QUERY and MEM ioctls on it.
 *
 *   FAKEGS_QUOTAS  the registration: "gpu:memsize,..." in the container's
 *                  GPU order (unset: open fails with ENOENT, no module)
 *   FAKEGS_STATE   a file holding the ledger, shared by every process of
 *                  the test (the "container")
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
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uapi/gpushare.h>

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

__attribute__((constructor)) static void setup(void)
{
	const char *q = getenv("FAKEGS_QUOTAS"), *path = getenv("FAKEGS_STATE");
	if (!q || !path)
		return;
	for (char *s = (char *)q; *s && nquotas < GPUSHARE_MAX_GPUS; ) {
		quotas[nquotas].gpu = (uint32_t)strtoul(s, &s, 10);
		quotas[nquotas].memsize = strtoull(s + 1, &s, 10);
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

static int query(struct gpushare_query *q)
{
	if (q->size < GPUSHARE_QUERY_SIZE_VER0 || q->quota_size < GPUSHARE_QUOTA_SIZE_VER0 ||
	    !q->abi_version || q->flags)
		return errno = EINVAL, -1;
	q->abi_version = GPUSHARE_ABI_VERSION;
	q->count = (uint32_t)nquotas;
	q->cgroup_id = 1;
	strcpy(q->id, "fake");
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
		return errno = ENOTTY, -1;
	}
	int (*real)(int, unsigned long, ...) =
		(int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	return real(fd, req, arg);
}

__attribute__((visibility("default"))) int close(int fd)
{
	if (fd >= 0 && fd < MAX_FDS)
		file_of[fd] = 0;
	int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "close");
	return real(fd);
}
