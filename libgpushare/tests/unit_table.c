// SPDX-License-Identifier: Apache-2.0
/*
 * The allocation table: put/take/get, kinds apart, growth, threads, fork,
 * and VMM handles held until released and unmapped.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

static _Atomic uint64_t released_bytes[4];

static void on_release(int dev, uint64_t bytes)
{
	released_bytes[dev] += bytes;
}

/* Map @h at @va (as the cuMemMap wrapper does); false if not held. */
static bool map(struct gs_table *t, uint64_t h, uint64_t va, uint64_t size)
{
	struct gs_node *hold = gs_vmm_hold(t, h);
	return hold && gs_vmm_mapped(t, hold, va, size) == 0;
}

/* Unmap [va, va + size) with the driver's answer @ok. */
static void unmap(struct gs_table *t, uint64_t va, uint64_t size, bool ok)
{
	gs_vmm_unmap_end(t, gs_vmm_unmap_begin(t, va, size), ok, on_release);
}

/* cuMemRelease that the driver accepted: the bytes if they went at once. */
static uint64_t release(struct gs_table *t, uint64_t h)
{
	int dev;
	uint64_t bytes = 0;
	struct gs_node *hold = gs_vmm_release(t, h);
	if (hold && gs_vmm_drop(t, hold, &dev, &bytes))
		return bytes;
	return 0;
}

/* VMM: a handle's bytes go when it is released and its last mapping too. */
static void vmm(void)
{
	struct gs_table t = GS_TABLE_INIT;
	const uint64_t M = 1 << 20;
	int dev;
	uint64_t bytes;

	/* Released while mapped: held until the unmap. */
	CHECK(gs_table_put(&t, GS_KIND_VMM, 1, 1, 4 * M) == 0);
	CHECK(map(&t, 1, 100 * M, 4 * M));
	CHECK(release(&t, 1) == 0);
	CHECK(gs_table_count(&t) == 0 && !gs_table_get(&t, GS_KIND_VMM, 1, NULL, NULL));
	CHECK(!map(&t, 1, 200 * M, 4 * M));	/* released: not ours any more */
	unmap(&t, 50 * M, 10 * M, true);	/* elsewhere: nothing */
	CHECK(released_bytes[1] == 0 && gs_vmm_count_maps(&t) == 1);
	unmap(&t, 100 * M, 4 * M, false);	/* the driver refused */
	CHECK(released_bytes[1] == 0 && gs_vmm_count_maps(&t) == 1);
	unmap(&t, 100 * M, 4 * M, true);
	CHECK(released_bytes[1] == 4 * M && gs_vmm_count_maps(&t) == 0);

	/* Unmapped first: the release gives it back. */
	released_bytes[1] = 0;
	CHECK(gs_table_put(&t, GS_KIND_VMM, 2, 1, 2 * M) == 0);
	CHECK(map(&t, 2, 100 * M, 2 * M));
	unmap(&t, 100 * M, 2 * M, true);
	CHECK(released_bytes[1] == 0);
	CHECK(release(&t, 2) == 2 * M);

	/* Two handles side by side, two mappings of one, one unmap for all. */
	CHECK(gs_table_put(&t, GS_KIND_VMM, 3, 2, 2 * M) == 0);
	CHECK(gs_table_put(&t, GS_KIND_VMM, 4, 2, 6 * M) == 0);
	CHECK(map(&t, 3, 100 * M, 2 * M) && map(&t, 4, 102 * M, 6 * M));
	CHECK(map(&t, 3, 300 * M, 2 * M));
	CHECK(release(&t, 3) == 0 && release(&t, 4) == 0);
	unmap(&t, 100 * M, 8 * M, true);
	CHECK(released_bytes[2] == 6 * M);	/* 3 is mapped at 300 still */
	unmap(&t, 300 * M, 2 * M, true);
	CHECK(released_bytes[2] == 8 * M && gs_vmm_count_maps(&t) == 0);

	/* Part of a mapping: the rest keeps it held, every part must go. */
	CHECK(gs_table_put(&t, GS_KIND_VMM, 5, 3, 6 * M) == 0);
	CHECK(map(&t, 5, 100 * M, 6 * M));
	CHECK(release(&t, 5) == 0);
	unmap(&t, 102 * M, 2 * M, true);	/* the middle: two parts left */
	CHECK(gs_vmm_count_maps(&t) == 2 && released_bytes[3] == 0);
	unmap(&t, 102 * M, 2 * M, true);	/* again: nothing there */
	unmap(&t, 99 * M, 4 * M, true);		/* the head and more */
	CHECK(gs_vmm_count_maps(&t) == 1 && released_bytes[3] == 0);
	unmap(&t, 105 * M, 1 * M, false);	/* part of the tail, refused */
	CHECK(gs_vmm_count_maps(&t) == 2 && released_bytes[3] == 0);
	unmap(&t, 104 * M, 2 * M, true);
	CHECK(gs_vmm_count_maps(&t) == 0 && released_bytes[3] == 6 * M);

	/* A map the driver refused; a release it refused. */
	CHECK(gs_table_put(&t, GS_KIND_VMM, 6, 0, M) == 0);
	struct gs_node *hold = gs_vmm_hold(&t, 6);
	CHECK(hold && !gs_vmm_drop(&t, hold, NULL, NULL));
	hold = gs_vmm_release(&t, 6);
	CHECK(hold && !gs_table_get(&t, GS_KIND_VMM, 6, NULL, NULL));
	gs_vmm_unrelease(&t, hold);
	CHECK(gs_table_get(&t, GS_KIND_VMM, 6, &dev, &bytes) && dev == 0 && bytes == M);
	/* A release racing a map: the map's hold keeps the bytes. */
	hold = gs_vmm_hold(&t, 6);
	CHECK(release(&t, 6) == 0);
	CHECK(hold && gs_vmm_drop(&t, hold, &dev, &bytes) && bytes == M);

	/* The driver hands a still-mapped handle's value out again (we did
	 * not see its release): the old entry lives on for its mapping. */
	released_bytes[0] = 0;
	CHECK(gs_table_put(&t, GS_KIND_VMM, 7, 0, M) == 0);
	CHECK(map(&t, 7, 100 * M, M));
	CHECK(gs_table_put(&t, GS_KIND_VMM, 7, 0, 2 * M) == 0);
	CHECK(gs_table_count(&t) == 1);
	CHECK(release(&t, 7) == 2 * M);
	unmap(&t, 100 * M, M, true);
	CHECK(released_bytes[0] == M);

	/* Clear frees mappings and what they held. */
	CHECK(gs_table_put(&t, GS_KIND_VMM, 8, 0, M) == 0);
	CHECK(map(&t, 8, 100 * M, M) && map(&t, 8, 200 * M, M));
	CHECK(release(&t, 8) == 0);
	CHECK(gs_table_put(&t, GS_KIND_VMM, 9, 0, M) == 0);
	CHECK(map(&t, 9, 300 * M, M));
	gs_table_clear(&t);
	CHECK(gs_vmm_count_maps(&t) == 0 && gs_table_count(&t) == 0);
}

/* Threads mapping, releasing and unmapping handles of their own. */
static void *vmm_worker(void *arg)
{
	uint64_t base = (uint64_t)(uintptr_t)arg << 40;
	for (uint64_t i = 0; i < 2000; i++) {
		uint64_t h = base + i, va = base + i * 4096;
		CHECK(gs_table_put(&shared, GS_KIND_VMM, h, 0, 1) == 0);
		CHECK(map(&shared, h, va, 2048) && map(&shared, h, va + 2048, 2048));
		if (i % 2)
			CHECK(release(&shared, h) == 0);
		unmap(&shared, va, 4096, true);
		if (!(i % 2))
			CHECK(release(&shared, h) == 1);
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

	vmm();
	for (uintptr_t i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, vmm_worker, (void *)(i + 1));
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	CHECK(gs_table_count(&shared) == 0 && gs_vmm_count_maps(&shared) == 0);
	gs_table_clear(&shared);

	/* After fork: empty and usable (the old entries are left alone). */
	struct gs_table f = GS_TABLE_INIT;
	CHECK(gs_table_put(&f, GS_KIND_MEM, 1, 0, 1) == 0);
	CHECK(gs_table_put(&f, GS_KIND_VMM, 1, 0, 1) == 0 && map(&f, 1, 4096, 4096));
	struct gs_table copy = f;		/* the parent keeps its own */
	gs_table_forget_after_fork(&f);
	CHECK(gs_table_count(&f) == 0 && !gs_table_get(&f, GS_KIND_MEM, 1, NULL, NULL));
	CHECK(gs_vmm_count_maps(&f) == 0);
	CHECK(gs_table_put(&f, GS_KIND_MEM, 2, 0, 1) == 0);
	gs_table_clear(&f);
	gs_table_clear(&copy);
	return DONE("unit_table");
}
