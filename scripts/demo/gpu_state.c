// SPDX-License-Identifier: Apache-2.0
/*
 * The demo's view of the tests' simulated GPU: reads the file that every
 * process naming FAKECUDA_GPU_STATE shares (libgpushare/tests/fake/fake_gpu.h,
 * the record the fake driver keeps per process) and prints, at one moment,
 *
 *   now <ns>                                  CLOCK_MONOTONIC, the fake's clock
 *   proc <pid> <device> <bytes> <executed-ns> per process and device it used
 *
 * executed-ns: the kernel time the device has run for the process by now
 * (queued work not yet run is not counted).
 *
 *   gpu_state FILE
 */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"

int main(int argc, char **argv)
{
	struct gpu_shared *g;
	struct timespec ts;
	struct stat sb;
	uint64_t now;
	int fd;

	if (argc != 2) {
		fprintf(stderr, "usage: gpu_state FILE\n");
		return 2;
	}
	fd = open(argv[1], O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) || (size_t)sb.st_size < sizeof(*g)) {
		fprintf(stderr, "gpu_state: %s: not a simulated GPU's file (yet)\n", argv[1]);
		return 1;
	}
	g = mmap(NULL, sizeof(*g), PROT_READ, MAP_SHARED, fd, 0);
	if (g == MAP_FAILED) {
		perror("gpu_state: mmap");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	printf("now %llu\n", (unsigned long long)now);
	for (int i = 0; i < FG_PROCS; i++) {
		struct fg_proc *p = &g->procs[i];
		int32_t pid = atomic_load(&p->pid);

		for (int d = 0; pid > 0 && d < FG_MAX_DEV; d++) {
			uint64_t mem = atomic_load(&p->mem[d]), e0, e1;

			if (!fg_executed(&p->dev[d], now, now, &e0, &e1))
				continue;	/* no consistent copy: its writer died mid-write */
			if (mem || e1 || (atomic_load(&p->ctx) & (1u << d)))
				printf("proc %d %d %llu %llu\n", pid, d, (unsigned long long)mem,
				       (unsigned long long)e1);
		}
	}
	return 0;
}
