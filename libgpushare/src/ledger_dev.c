// SPDX-License-Identifier: Apache-2.0
/* The ledger's module backend (ledger_dev.h): /dev/gpushare. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <uapi/gpushare.h>

#include "env.h"
#include "ledger_dev.h"

static int fd = -1;			/* /dev/gpushare */
static uint32_t module_gpu[GS_MAX_GPUS];	/* the module's GPU index */
static uint32_t weight[GS_MAX_GPUS];	/* compute weight */

int gs_dev_mem(uint32_t op, int slot, uint64_t bytes, struct gpushare_mem *m)
{
	memset(m, 0, sizeof(*m));
	m->size = sizeof(*m);
	m->op = op;
	m->gpu = module_gpu[slot];
	m->bytes = bytes;
	return ioctl(fd, GPUSHARE_IOC_MEM, m);
}

int gs_dev_connect(uint64_t quota[GS_MAX_GPUS])
{
	struct gpushare_quota q[GS_MAX_GPUS];
	struct gpushare_query query;
	struct gpushare_mem m;
	int count;

	fd = open("/dev/" GPUSHARE_DEV_NAME, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 0;
	memset(q, 0, sizeof(q));
	memset(&query, 0, sizeof(query));
	query.size = sizeof(query);
	query.abi_version = GPUSHARE_ABI_VERSION;
	query.quota_size = sizeof(q[0]);
	query.quotas = (uint64_t)(uintptr_t)q;
	query.quota_cap = GS_MAX_GPUS;
	if (ioctl(fd, GPUSHARE_IOC_QUERY, &query) || query.count == 0)
		goto fail;
	count = (int)query.count;
	for (int i = 0; i < count; i++) {
		quota[i] = q[i].memsize;
		module_gpu[i] = q[i].gpu;
		weight[i] = q[i].weight;
	}
	if (gs_dev_mem(GPUSHARE_MEM_INFO, 0, 0, &m))	/* a module without the ledger */
		goto fail;
	return count;
fail:
	close(fd);
	fd = -1;
	return 0;
}

int gs_dev_reconnect(uint64_t quota[GS_MAX_GPUS], int *count)
{
	int old = fd, n;
	uint64_t q[GS_MAX_GPUS];
	uint32_t g[GS_MAX_GPUS], w[GS_MAX_GPUS];

	memcpy(q, quota, sizeof(q));
	memcpy(g, module_gpu, sizeof(g));
	memcpy(w, weight, sizeof(w));
	fd = -1;
	n = gs_dev_connect(quota);
	if (!n) {
		fd = old;	/* still the deleted registration's: ENOENT */
		memcpy(quota, q, sizeof(q));
		memcpy(module_gpu, g, sizeof(g));
		memcpy(weight, w, sizeof(w));
		return -1;
	}
	/*
	 * The new file takes the old one's number (closing the old file), so
	 * that a call that read the number before cannot reach a file opened
	 * meanwhile by something else.
	 */
	if (old >= 0 && dup3(fd, old, O_CLOEXEC) == old) {
		close(fd);
		fd = old;
	} else if (old >= 0) {
		close(old);
	}
	*count = n;
	return 0;
}

void gs_dev_forget(void)
{
	if (fd >= 0)
		close(fd);	/* the parent's file: its reservations */
	fd = -1;
}

uint32_t gs_dev_gpu(int slot)
{
	return module_gpu[slot];
}

int gs_dev_fd(void)
{
	return fd;
}

int gs_dev_sched(int f, int slot, struct gpushare_sched *sc)
{
	sc->size = sizeof(*sc);
	sc->gpu = module_gpu[slot];
	return ioctl(f, GPUSHARE_IOC_SCHED, sc);
}

void gs_dev_weights(uint32_t *out, int n)
{
	memcpy(out, weight, (size_t)n * sizeof(*out));
}
