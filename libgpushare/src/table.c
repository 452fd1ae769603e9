// SPDX-License-Identifier: Apache-2.0
/* The live allocation table (see table.h). */
#include <stdlib.h>

#include "table.h"

struct gs_node {
	struct gs_node *next;
	uint64_t key;
	uint64_t bytes;
	int kind;
	int dev;
	uint64_t refs;		/* VMM: mappings and holds */
	bool released;		/* VMM: out of the hash, alive while refs */
};

/* A VMM mapping [va, end) of @node's handle; @token: being unmapped. */
struct gs_map {
	uint64_t va, end;
	struct gs_node *node;
	uint64_t token;
};

/* splitmix64's finaliser: device pointers share their low bits. */
static size_t hash(int kind, uint64_t key)
{
	uint64_t x = key ^ ((uint64_t)kind << 56);
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (size_t)x;
}

/* The link that points at @key's node (or the end of its chain). */
static struct gs_node **find(struct gs_table *t, int kind, uint64_t key)
{
	struct gs_node **pp = &t->buckets[hash(kind, key) & (t->nbuckets - 1)];
	while (*pp && ((*pp)->kind != kind || (*pp)->key != key))
		pp = &(*pp)->next;
	return pp;
}

/* Double the buckets (from 0 to 64); false when out of memory. */
static bool grow(struct gs_table *t)
{
	size_t n = t->nbuckets ? t->nbuckets * 2 : 64;
	struct gs_node **b = calloc(n, sizeof(*b));
	if (!b)
		return false;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct gs_node *node = t->buckets[i], *next;
		for (; node; node = next) {
			next = node->next;
			size_t h = hash(node->kind, node->key) & (n - 1);
			node->next = b[h];
			b[h] = node;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
	return true;
}

int gs_table_put(struct gs_table *t, enum gs_kind kind, uint64_t key, int dev,
		 uint64_t bytes)
{
	int ret = -1;

	pthread_mutex_lock(&t->lock);
	/* Keep chains short: at most one entry per bucket on average. */
	if (t->count >= t->nbuckets && !grow(t) && !t->nbuckets)
		goto out;
	struct gs_node **pp = find(t, (int)kind, key);
	struct gs_node *node = *pp;
	if (node && node->refs) {
		/*
		 * A VMM handle still mapped, whose release we did not see, and
		 * whose value the driver hands out again: the old entry lives on
		 * as released, until its mappings go.
		 */
		struct gs_node *fresh = malloc(sizeof(*fresh));
		if (!fresh)
			goto out;
		*pp = node->next;
		node->released = true;
		fresh->next = *pp;
		*pp = node = fresh;
		node->kind = (int)kind;
		node->key = key;
	} else if (!node) {
		node = malloc(sizeof(*node));
		if (!node)
			goto out;
		node->next = NULL;
		node->kind = (int)kind;
		node->key = key;
		*pp = node;
		t->count++;
	}
	node->refs = 0;
	node->released = false;
	node->dev = dev;
	node->bytes = bytes;
	ret = 0;
out:
	pthread_mutex_unlock(&t->lock);
	return ret;
}

static bool lookup(struct gs_table *t, enum gs_kind kind, uint64_t key, int *dev,
		   uint64_t *bytes, bool remove)
{
	bool found = false;

	pthread_mutex_lock(&t->lock);
	if (t->nbuckets) {
		struct gs_node **pp = find(t, (int)kind, key);
		struct gs_node *node = *pp;
		if (node) {
			found = true;
			if (dev)
				*dev = node->dev;
			if (bytes)
				*bytes = node->bytes;
			if (remove) {
				*pp = node->next;
				t->count--;
				if (node->refs) {
					/* Still mapped: its mappings keep it, the
					 * bytes are the caller's now. */
					node->released = true;
					node->bytes = 0;
				} else {
					free(node);
				}
			}
		}
	}
	pthread_mutex_unlock(&t->lock);
	return found;
}

bool gs_table_take(struct gs_table *t, enum gs_kind kind, uint64_t key, int *dev,
		   uint64_t *bytes)
{
	return lookup(t, kind, key, dev, bytes, true);
}

bool gs_table_get(struct gs_table *t, enum gs_kind kind, uint64_t key, int *dev,
		  uint64_t *bytes)
{
	return lookup(t, kind, key, dev, bytes, false);
}

size_t gs_table_count(struct gs_table *t)
{
	pthread_mutex_lock(&t->lock);
	size_t n = t->count;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void gs_table_clear(struct gs_table *t)
{
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->nmaps; i++) {
		struct gs_node *node = t->maps[i].node;
		if (!--node->refs && node->released)
			free(node);
	}
	free(t->maps);
	t->maps = NULL;
	t->nmaps = t->capmaps = 0;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct gs_node *node = t->buckets[i], *next;
		for (; node; node = next) {
			next = node->next;
			free(node);
		}
	}
	free(t->buckets);
	t->buckets = NULL;
	t->nbuckets = 0;
	t->count = 0;
	pthread_mutex_unlock(&t->lock);
}

void gs_table_forget_after_fork(struct gs_table *t)
{
	pthread_mutex_init(&t->lock, NULL);
	t->buckets = NULL;
	t->nbuckets = 0;
	t->count = 0;
	t->maps = NULL;
	t->nmaps = t->capmaps = 0;
}

/* ---- VMM ---- */

/* Room for @more mappings; false when out of memory. */
static bool maps_room(struct gs_table *t, size_t more)
{
	if (t->nmaps + more <= t->capmaps)
		return true;
	size_t n = t->capmaps ? t->capmaps * 2 : 64;
	while (n < t->nmaps + more)
		n *= 2;
	struct gs_map *m = realloc(t->maps, n * sizeof(*m));
	if (!m)
		return false;
	t->maps = m;
	t->capmaps = n;
	return true;
}

struct gs_node *gs_vmm_hold(struct gs_table *t, uint64_t handle)
{
	struct gs_node *node = NULL;

	pthread_mutex_lock(&t->lock);
	if (t->nbuckets) {
		node = *find(t, GS_KIND_VMM, handle);
		if (node)
			node->refs++;
	}
	pthread_mutex_unlock(&t->lock);
	return node;
}

int gs_vmm_mapped(struct gs_table *t, struct gs_node *hold, uint64_t va, uint64_t size)
{
	int ret = -1;

	pthread_mutex_lock(&t->lock);
	if (maps_room(t, 1)) {
		struct gs_map *m = &t->maps[t->nmaps++];
		m->va = va;
		m->end = size > UINT64_MAX - va ? UINT64_MAX : va + size;
		m->node = hold;
		m->token = 0;
		ret = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}

/* Under the lock: one reference less; true if @node is to be freed. */
static bool unref(struct gs_node *node)
{
	return !--node->refs && node->released;
}

bool gs_vmm_drop(struct gs_table *t, struct gs_node *hold, int *dev, uint64_t *bytes)
{
	pthread_mutex_lock(&t->lock);
	bool last = unref(hold);
	pthread_mutex_unlock(&t->lock);
	if (!last)
		return false;
	if (dev)
		*dev = hold->dev;
	if (bytes)
		*bytes = hold->bytes;
	free(hold);
	return true;
}

struct gs_node *gs_vmm_release(struct gs_table *t, uint64_t handle)
{
	struct gs_node *node = NULL;

	pthread_mutex_lock(&t->lock);
	if (t->nbuckets) {
		struct gs_node **pp = find(t, GS_KIND_VMM, handle);
		node = *pp;
		if (node) {
			*pp = node->next;
			t->count--;
			node->released = true;
			node->refs++;
		}
	}
	pthread_mutex_unlock(&t->lock);
	return node;
}

void gs_vmm_unrelease(struct gs_table *t, struct gs_node *hold)
{
	pthread_mutex_lock(&t->lock);
	hold->refs--;
	/* No buckets only after a clear, and out of memory for new ones:
	 * the entry is then forgotten (and its bytes stay held). */
	if (t->nbuckets || grow(t)) {
		struct gs_node **pp = &t->buckets[hash(hold->kind, hold->key) & (t->nbuckets - 1)];
		hold->next = *pp;
		*pp = hold;
		t->count++;
		hold->released = false;
	}
	pthread_mutex_unlock(&t->lock);
}

uint64_t gs_vmm_unmap_begin(struct gs_table *t, uint64_t va, uint64_t size)
{
	uint64_t end = size > UINT64_MAX - va ? UINT64_MAX : va + size;
	bool marked = false;

	pthread_mutex_lock(&t->lock);
	uint64_t token = ++t->next_token ? t->next_token : ++t->next_token;
	/* Pieces split off are appended outside the range: passing over
	 * them changes nothing. */
	for (size_t i = 0; i < t->nmaps; i++) {
		struct gs_map m = t->maps[i];
		if (m.token || m.end <= va || m.va >= end)
			continue;
		size_t more = (m.va < va) + (m.end > end);
		if (!maps_room(t, more))
			continue;	/* left whole: it stays held */
		if (m.va < va)
			t->maps[t->nmaps++] = (struct gs_map){ m.va, va, m.node, 0 };
		if (m.end > end)
			t->maps[t->nmaps++] = (struct gs_map){ end, m.end, m.node, 0 };
		m.node->refs += more;
		t->maps[i].va = m.va < va ? va : m.va;
		t->maps[i].end = m.end > end ? end : m.end;
		t->maps[i].token = token;
		marked = true;
	}
	pthread_mutex_unlock(&t->lock);
	return marked ? token : 0;
}

void gs_vmm_unmap_end(struct gs_table *t, uint64_t token, bool ok,
		      void (*release)(int dev, uint64_t bytes))
{
	struct gs_node *gone = NULL;

	if (!token)
		return;
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->nmaps;) {
		struct gs_map *m = &t->maps[i];
		if (m->token != token) {
			i++;
		} else if (!ok) {
			m->token = 0;
			i++;
		} else {
			struct gs_node *node = m->node;
			*m = t->maps[--t->nmaps];
			if (unref(node)) {
				/* Released, so out of the hash: next is free. */
				node->next = gone;
				gone = node;
			}
		}
	}
	pthread_mutex_unlock(&t->lock);
	while (gone) {
		struct gs_node *next = gone->next;
		if (release)
			release(gone->dev, gone->bytes);
		free(gone);
		gone = next;
	}
}

size_t gs_vmm_count_maps(struct gs_table *t)
{
	pthread_mutex_lock(&t->lock);
	size_t n = t->nmaps;
	pthread_mutex_unlock(&t->lock);
	return n;
}
