// SPDX-License-Identifier: GPL-2.0-only
/*
 * GPUSHARE_IOC_QUERY from C, through the uapi header, as the in-container
 * interposer will do it.  Prints "<id> <cgroup-id> <gpu>:<mem>:<weight>:<prio>..."
 * and exits 0, or prints the error and exits 2 (ENOENT, from open() or the
 * ioctl: no registration for this caller) or 1 (other).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <gpushare.h>

int main(void)
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
