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
	if (!node) {
		node = malloc(sizeof(*node));
		if (!node)
			goto out;
		node->next = NULL;
		node->kind = (int)kind;
		node->key = key;
		*pp = node;
		t->count++;
	}
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
				free(node);
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
}
