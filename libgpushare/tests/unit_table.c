// SPDX-License-Identifier: Apache-2.0
/* The allocation table: put/take/get, kinds apart, growth, threads, fork. */
#include <pthread.h>
#include <stdint.h>

#include "table.h"
#include "unit.h"

static struct gs_table shared = GS_TABLE_INIT;

/* Each thread puts and takes its own keys; the table ends empty. */
static void *worker(void *arg)
{
	uint64_t base = (uint64_t)(uintptr_t)arg << 32;
	for (int round = 0; round < 20; round++) {
		for (uint64_t i = 0; i < 500; i++)
			CHECK(gs_table_put(&shared, GS_KIND_MEM, base + i * 512, (int)(i % 4), i) == 0);
		for (uint64_t i = 0; i < 500; i++) {
			int dev = -1;
			uint64_t bytes = 0;
			CHECK(gs_table_take(&shared, GS_KIND_MEM, base + i * 512, &dev, &bytes));
			CHECK(dev == (int)(i % 4) && bytes == i);
		}
	}
	return NULL;
}

int main(void)
{
	struct gs_table t = GS_TABLE_INIT;
	int dev;
	uint64_t bytes;

	CHECK(!gs_table_take(&t, GS_KIND_MEM, 1, &dev, &bytes));	/* empty */
	CHECK(gs_table_put(&t, GS_KIND_MEM, 0x7f0000000000, 1, 4096) == 0);
	CHECK(gs_table_put(&t, GS_KIND_ARRAY, 0x7f0000000000, 2, 100) == 0);
	CHECK(gs_table_count(&t) == 2);				/* kinds apart */
	CHECK(gs_table_get(&t, GS_KIND_MEM, 0x7f0000000000, &dev, &bytes));
	CHECK(dev == 1 && bytes == 4096);
	CHECK(gs_table_get(&t, GS_KIND_ARRAY, 0x7f0000000000, &dev, &bytes));
	CHECK(dev == 2 && bytes == 100);
	CHECK(!gs_table_get(&t, GS_KIND_VMM, 0x7f0000000000, &dev, &bytes));
	/* Same key again replaces (a reused handle). */
	CHECK(gs_table_put(&t, GS_KIND_MEM, 0x7f0000000000, 3, 8192) == 0);
	CHECK(gs_table_count(&t) == 2);
	CHECK(gs_table_take(&t, GS_KIND_MEM, 0x7f0000000000, &dev, &bytes));
	CHECK(dev == 3 && bytes == 8192);
	CHECK(!gs_table_take(&t, GS_KIND_MEM, 0x7f0000000000, &dev, &bytes));	/* once */
	CHECK(gs_table_count(&t) == 1);
	/* Growth: many keys, all found, all removed. */
	for (uint64_t i = 0; i < 10000; i++)
		CHECK(gs_table_put(&t, GS_KIND_MEM, 0x10000 + i * 0x200000, (int)i, i * 3) == 0);
	CHECK(gs_table_count(&t) == 10001);
	for (uint64_t i = 0; i < 10000; i += 7) {
		CHECK(gs_table_take(&t, GS_KIND_MEM, 0x10000 + i * 0x200000, &dev, &bytes));
		CHECK(dev == (int)i && bytes == i * 3);
	}
	for (uint64_t i = 1; i < 10000; i += 7)
		CHECK(gs_table_get(&t, GS_KIND_MEM, 0x10000 + i * 0x200000, NULL, &bytes) &&
		      bytes == i * 3);
	gs_table_clear(&t);
	CHECK(gs_table_count(&t) == 0);
	CHECK(gs_table_put(&t, GS_KIND_POOL, 5, 0, 0) == 0);	/* usable after clear */
	CHECK(gs_table_take(&t, GS_KIND_POOL, 5, NULL, NULL));
	gs_table_clear(&t);

	/* Threads. */
	pthread_t th[8];
	for (uintptr_t i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, worker, (void *)(i + 1));
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	CHECK(gs_table_count(&shared) == 0);
	gs_table_clear(&shared);

	/* After fork: empty and usable (the old entries are left alone). */
	struct gs_table f = GS_TABLE_INIT;
	CHECK(gs_table_put(&f, GS_KIND_MEM, 1, 0, 1) == 0);
	struct gs_table copy = f;		/* the parent keeps its own */
	gs_table_forget_after_fork(&f);
	CHECK(gs_table_count(&f) == 0 && !gs_table_get(&f, GS_KIND_MEM, 1, NULL, NULL));
	CHECK(gs_table_put(&f, GS_KIND_MEM, 2, 0, 1) == 0);
	gs_table_clear(&f);
	gs_table_clear(&copy);
	return DONE("unit_table");
}
