// SPDX-License-Identifier: GPL-2.0-only
/*
 * GPUSHARE_IOC_QUERY from C, through the uapi header, as the in-container
 * interposer will do it.  Prints "<id> <cgroup-id> <gpu>:<mem>:<weight>:<prio>..."
 * and exits 0, or prints the error and exits 2 (ENOENT) or 1 (other).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <gpushare.h>

int main(void)
{
	struct gpushare_query q;
	unsigned int i;
	int fd, ret;

	fd = open("/dev/" GPUSHARE_DEV_NAME, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		perror("open /dev/" GPUSHARE_DEV_NAME);
		return 1;
	}
	memset(&q, 0xff, sizeof(q));
	ret = ioctl(fd, GPUSHARE_IOC_QUERY, &q);
	close(fd);
	if (ret) {
		printf("%s\n", strerror(errno));
		return errno == ENOENT ? 2 : 1;
	}
	if (q.abi_version != GPUSHARE_ABI_VERSION || q.count > GPUSHARE_MAX_GPUS) {
		printf("bad answer: abi %u count %u\n", q.abi_version, q.count);
		return 1;
	}
	printf("%s %llu", q.id, (unsigned long long)q.cgroup_id);
	for (i = 0; i < q.count; i++)
		printf(" %u:%llu:%u:%u", q.quotas[i].gpu,
		       (unsigned long long)q.quotas[i].memsize,
		       q.quotas[i].weight, q.quotas[i].highprio);
	printf("\n");
	return 0;
}
