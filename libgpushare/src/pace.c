// SPDX-License-Identifier: Apache-2.0
/* The gate's pacer (pace.h has the model). */
#include "pace.h"

#define BOOT_MAX 64		/* launches between probes, chat unknown, at most */

/* Launches between probes: a quarter slice of estimated work. */
static uint64_t spacing(const struct gs_pace *p, uint64_t chat)
{
	uint64_t n;

	if (!chat)
		return atomic_load_explicit(&p->boot, memory_order_relaxed);
	n = atomic_load_explicit(&p->slice_ns, memory_order_relaxed) / 4 / chat;
	return n ? n : 1;
}

void gs_pace_init(struct gs_pace *p, uint64_t slice_ns, uint64_t now)
{
	*p = (struct gs_pace){ 0 };
	atomic_store(&p->slice_ns, slice_ns);
	atomic_store(&p->boot, 1);
	atomic_store(&p->vfin, now);
	atomic_store(&p->next_probe, 1);
}

void gs_pace_set_slice(struct gs_pace *p, uint64_t slice_ns)
{
	atomic_store_explicit(&p->slice_ns, slice_ns, memory_order_relaxed);
}

enum gs_pace_verdict gs_pace_launch(struct gs_pace *p, uint64_t now, uint64_t until)
{
	uint64_t chat = atomic_load_explicit(&p->chat, memory_order_relaxed);
	uint64_t v = atomic_load_explicit(&p->vfin, memory_order_relaxed), base, n;

	do {
		base = v > now ? v : now;
		/* Something queued, and this launch would end past the grant. */
		if (v > now && chat && base + chat > until)
			return GS_PACE_STOP;
	} while (!atomic_compare_exchange_weak_explicit(&p->vfin, &v, base + chat,
							memory_order_relaxed,
							memory_order_relaxed));
	n = atomic_fetch_add_explicit(&p->launches, 1, memory_order_relaxed) + 1;
	if (n < atomic_load_explicit(&p->next_probe, memory_order_relaxed))
		return GS_PACE_GO;
	atomic_store_explicit(&p->next_probe, n + spacing(p, chat), memory_order_relaxed);
	return GS_PACE_PROBE;
}

int gs_pace_probe_slot(struct gs_pace *p)
{
	unsigned int slot;
	uint64_t n = atomic_load_explicit(&p->launches, memory_order_relaxed);

	if (p->pending >= GS_PACE_PENDING)
		return -1;
	slot = (p->first + p->pending) % GS_PACE_SLOTS;
	/* Recorded before the launch that asked for it: the ones before. */
	p->probe[slot] = (struct gs_pace_probe){ .n = n ? n - 1 : 0,
						 .backlogged = p->pending > 0 };
	p->pending++;
	return (int)slot;
}

void gs_pace_probe_cancel(struct gs_pace *p)
{
	if (p->pending)
		p->pending--;
}

int gs_pace_tail_slot(struct gs_pace *p)
{
	unsigned int slot;

	if (p->pending >= GS_PACE_PENDING)
		return -1;
	slot = (p->first + p->pending) % GS_PACE_SLOTS;
	/* After every counted launch: it ends when the queue does. */
	p->probe[slot] = (struct gs_pace_probe){
		.n = atomic_load_explicit(&p->launches, memory_order_relaxed),
		.backlogged = p->pending > 0 };
	p->pending++;
	return (int)slot;
}

int gs_pace_oldest(const struct gs_pace *p)
{
	return p->pending ? (int)p->first : -1;
}

static struct gs_pace_probe pop(struct gs_pace *p)
{
	struct gs_pace_probe pr = p->probe[p->first];

	p->first = (p->first + 1) % GS_PACE_SLOTS;
	p->pending--;
	return pr;
}

void gs_pace_probe_done(struct gs_pace *p, uint64_t now, uint64_t elapsed_ns)
{
	struct gs_pace_probe pr;
	uint64_t chat, since, v, sample = 0;

	if (!p->pending)
		return;
	pr = pop(p);
	chat = atomic_load_explicit(&p->chat, memory_order_relaxed);
	if (p->have_last && elapsed_ns && pr.n > p->last_n) {
		sample = elapsed_ns / (pr.n - p->last_n);
		sample = sample ? sample : 1;
	}
	/*
	 * A fair sample when the GPU was busy from the last probe to this
	 * one.  Else idle time may have inflated it: an upper bound, which
	 * can only bring an over-estimate down (an over-estimate keeps the
	 * queue too short ever to give a backlogged sample again).
	 */
	if (sample && (pr.backlogged || (chat && sample < chat))) {
		chat = chat ? (chat + sample) / 2 : sample;
		atomic_store_explicit(&p->chat, chat, memory_order_relaxed);
	} else if (!chat && atomic_load_explicit(&p->boot, memory_order_relaxed) < BOOT_MAX) {
		/* Not busy yet: probe less often. */
		atomic_store_explicit(&p->boot, 2 * atomic_load_explicit(&p->boot,
									 memory_order_relaxed),
				      memory_order_relaxed);
	}
	p->have_last = true;
	p->last_n = pr.n;
	/* What is queued now: the launches since the probe. */
	since = atomic_load_explicit(&p->launches, memory_order_relaxed) - pr.n;
	v = atomic_load_explicit(&p->vfin, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(&p->vfin, &v, now + since * chat,
						      memory_order_relaxed,
						      memory_order_relaxed))
		;
}

void gs_pace_probe_lost(struct gs_pace *p)
{
	if (p->pending)
		pop(p);
	p->have_last = false;
}

void gs_pace_drained(struct gs_pace *p, uint64_t now)
{
	p->pending = 0;
	p->have_last = false;
	atomic_store_explicit(&p->vfin, now, memory_order_relaxed);
}
