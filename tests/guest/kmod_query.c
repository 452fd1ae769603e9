// SPDX-License-Identifier: GPL-2.0-only
/*
 * /dev/gpushare from C, through the uapi header, as the in-container
 * interposer does it.
 *
 * kmod_query
 *	GPUSHARE_IOC_QUERY.  Prints "<id> <cgroup-id> <gpu>:<mem>:<weight>:<prio>..."
 *	and exits 0, or prints the error and exits 2 (ENOENT, from open() or
 *	the ioctl: no registration for this caller) or 1 (other).
 *
 * kmod_query sched-load <gpu> <seconds> [work_us]
 *	A busy simulated GPU client for <seconds>: ACQUIRE (blocking), "run
 *	work" by sleeping until the grant's end (or in chunks of work_us, the
 *	last of which may run past it), then renew with a NOWAIT ACQUIRE, or,
 *	when somebody else is due, RELEASE with the time it slept and ACQUIRE
 *	again.  Prints "grants <n> renewals <n> held_ns <ns> first_grant <ns>
 *	first_wait_ns <ns> eintr <n>" (first_grant: CLOCK_MONOTONIC of the
 *	first grant; first_wait_ns: how long it waited for it) and exits 0; 1
 *	on any unexpected error.  The module's gputime is the authority on
 *	what it was charged; held_ns is what it believes it used.
 *
 * kmod_query sched-intr <gpu> <ms>
 *	A blocking ACQUIRE interrupted by SIGALRM after <ms> (a handler
 *	without SA_RESTART).  Prints "<OK, EINTR, ENOENT or E<n>> <waited ns>
 *	<gputime_ns>" and exits 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <gpushare.h>

static int query(void)
{
	struct gpushare_quota quotas[GPUSHARE_MAX_GPUS];
	struct gpushare_query q;
	unsigned int i;
	int fd, ret;

	fd = open("/dev/" GPUSHARE_DEV_NAME, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		printf("%s\n", strerror(errno));
		return errno == ENOENT ? 2 : 1;
	}
	memset(&q, 0, sizeof(q));
	memset(quotas, 0xff, sizeof(quotas));
	q.size = sizeof(q);
	q.abi_version = GPUSHARE_ABI_VERSION;
	q.quota_size = sizeof(quotas[0]);
	q.quotas = (uintptr_t)quotas;
	q.quota_cap = GPUSHARE_MAX_GPUS;
	ret = ioctl(fd, GPUSHARE_IOC_QUERY, &q);
	close(fd);
	if (ret) {
		printf("%s\n", strerror(errno));
		return errno == ENOENT ? 2 : 1;
	}
	if (q.abi_version != GPUSHARE_ABI_VERSION || q.count > q.quota_cap) {
		printf("bad answer: abi %u count %u\n", q.abi_version, q.count);
		return 1;
	}
	printf("%s %llu", q.id, (unsigned long long)q.cgroup_id);
	for (i = 0; i < q.count; i++)
		printf(" %u:%llu:%u:%u", quotas[i].gpu,
		       (unsigned long long)quotas[i].memsize,
		       quotas[i].weight, quotas[i].highprio);
	printf("\n");
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = t / 1000000000ull,
			       .tv_nsec = t % 1000000000ull };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int sched(int fd, struct gpushare_sched *s, uint32_t op, uint32_t gpu,
		 uint32_t flags, uint64_t used_ns)
{
	memset(s, 0, sizeof(*s));
	s->size = sizeof(*s);
	s->op = op;
	s->gpu = gpu;
	s->flags = flags;
	s->used_ns = used_ns;
	return ioctl(fd, GPUSHARE_IOC_SCHED, s) ? errno : 0;
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* SIGALRM interrupts system calls (no SA_RESTART). */
static void arm_alarm(uint64_t after_ns)
{
	struct sigaction sa;
	struct itimerval it;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	memset(&it, 0, sizeof(it));
	it.it_value.tv_sec = after_ns / 1000000000ull;
	it.it_value.tv_usec = after_ns % 1000000000ull / 1000 + 1;
	setitimer(ITIMER_REAL, &it, NULL);
}

static int open_dev(void)
{
	int fd = open("/dev/" GPUSHARE_DEV_NAME, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		fprintf(stderr, "open: %s\n", strerror(errno));
	return fd;
}

static int sched_load(uint32_t gpu, double seconds, uint64_t work_ns)
{
	uint64_t start = now_ns(), end, grant, t, held = 0;
	uint64_t grants = 0, renewals = 0, eintr = 0;
	uint64_t first_grant = 0, first_wait = 0;
	struct gpushare_sched s;
	int fd, err;

	fd = open_dev();
	if (fd < 0)
		return 1;
	end = start + (uint64_t)(seconds * 1e9);
	arm_alarm(end - start);	/* ends a blocking ACQUIRE at the end */
	while (now_ns() < end) {
		err = sched(fd, &s, GPUSHARE_SCHED_ACQUIRE, gpu, 0, 0);
		if (err == EINTR) {
			eintr++;
			continue;
		}
		if (err) {
			fprintf(stderr, "acquire: %s\n", strerror(err));
			return 1;
		}
		grant = now_ns();
		if (!grants++) {
			first_grant = grant;
			first_wait = grant - start;
		}
		for (;;) {
			/* Submit until the grant's end, then wait for the work. */
			do {
				t = now_ns();
				if (work_ns)
					sleep_until(t + work_ns);
				else
					sleep_until(s.until);
			} while (work_ns && now_ns() < s.until);
			if (now_ns() >= end)
				break;
			/* Renew without draining, if nobody else is due. */
			err = sched(fd, &s, GPUSHARE_SCHED_ACQUIRE, gpu,
				    GPUSHARE_SCHED_NOWAIT, 0);
			if (err == EAGAIN)
				break;
			if (err) {
				fprintf(stderr, "renew: %s\n", strerror(err));
				return 1;
			}
			renewals++;
		}
		t = now_ns() - grant;
		err = sched(fd, &s, GPUSHARE_SCHED_RELEASE, gpu, 0, t);
		if (err) {
			fprintf(stderr, "release: %s\n", strerror(err));
			return 1;
		}
		held += t;
	}
	printf("grants %llu renewals %llu held_ns %llu first_grant %llu first_wait_ns %llu eintr %llu\n",
	       (unsigned long long)grants, (unsigned long long)renewals,
	       (unsigned long long)held, (unsigned long long)first_grant,
	       (unsigned long long)first_wait, (unsigned long long)eintr);
	close(fd);
	return 0;
}

static int sched_intr(uint32_t gpu, uint64_t ms)
{
	struct gpushare_sched s;
	uint64_t start;
	char name[16];
	int fd, err;

	fd = open_dev();
	if (fd < 0)
		return 1;
	start = now_ns();
	arm_alarm(ms * 1000000ull);
	err = sched(fd, &s, GPUSHARE_SCHED_ACQUIRE, gpu, 0, 0);
	if (!err)
		strcpy(name, "OK");
	else if (err == EINTR)
		strcpy(name, "EINTR");
	else if (err == ENOENT)
		strcpy(name, "ENOENT");
	else
		snprintf(name, sizeof(name), "E%d", err);
	printf("%s %llu %llu\n", name, (unsigned long long)(now_ns() - start),
	       (unsigned long long)s.gputime_ns);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 1)
		return query();
	if (argc >= 4 && !strcmp(argv[1], "sched-load"))
		return sched_load(strtoul(argv[2], NULL, 10), atof(argv[3]),
				  argc > 4 ? strtoull(argv[4], NULL, 10) * 1000 : 0);
	if (argc == 4 && !strcmp(argv[1], "sched-intr"))
		return sched_intr(strtoul(argv[2], NULL, 10),
				  strtoull(argv[3], NULL, 10));
	fprintf(stderr, "usage: kmod_query [sched-load <gpu> <seconds> [work_us] | sched-intr <gpu> <ms>]\n");
	return 1;
}
