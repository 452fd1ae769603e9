// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare core: quota arithmetic (a GPU's accounting, admission, the
 * memory ledger) and the bounds of every value.  The grammars that feed
 * it are in gs_grammar.c (inst_ctl) and gs_state.c (the upgrade state).
 *
 * Nothing here sleeps, allocates or touches kernel state: callers hold
 * whatever lock protects the accounting they pass in.
 */
#include "gs_core.h"

const char *const gs_gpu_files[GS_GPU_NFILES] = {
	[GS_GPU_FREE_WEIGHT] = "free_weight",
	[GS_GPU_MAJOR] = "major",
	[GS_GPU_MAX_INST] = "max_inst",
	[GS_GPU_POLICY] = "policy",
	[GS_GPU_PRIO_RATIO] = "prio_ratio",
	[GS_GPU_TOTAL_MEMSIZE] = "total_memsize",
	[GS_GPU_FREE_MEMSIZE] = "free_memsize",
	[GS_GPU_NR_INST] = "nr_inst",
	[GS_GPU_ORPHANED_MEMSIZE] = "orphaned_memsize",
	[GS_GPU_SLICE_US] = "slice_us",
	[GS_GPU_DRAIN_US] = "drain_us",
	[GS_GPU_FORCED_ENDS] = "forced_ends",
};

int gs_check_weight(u64 val)
{
	return val <= GPUSHARE_WEIGHT_MAX ? 0 : -EINVAL;
}

int gs_check_highprio(u64 val)
{
	return val <= 1 ? 0 : -EINVAL;
}

int gs_check_policy(u64 val)
{
	return val <= GPUSHARE_POLICY_MAX ? 0 : -EINVAL;
}

int gs_check_prio_ratio(u64 val)
{
	return val >= GPUSHARE_PRIO_RATIO_MIN &&
	       val <= GPUSHARE_PRIO_RATIO_MAX ? 0 : -EINVAL;
}

/* A GPU's scheduling slice, microseconds. */
int gs_check_slice_us(u64 val)
{
	return val >= GPUSHARE_SLICE_US_MIN &&
	       val <= GPUSHARE_SLICE_US_MAX ? 0 : -EINVAL;
}

/* A holder's longest drain past its slice, microseconds. */
int gs_check_drain_us(u64 val)
{
	return val >= GPUSHARE_DRAIN_US_MIN &&
	       val <= GPUSHARE_DRAIN_US_MAX ? 0 : -EINVAL;
}

void gs_acct_init(struct gs_acct *a, u64 total_mem)
{
	memset(a, 0, sizeof(*a));
	a->total_mem = total_mem;
	a->max_inst = GPUSHARE_MAX_INST_DEFAULT;
}

u64 gs_acct_free_mem(const struct gs_acct *a)
{
	return a->total_mem - a->used_mem - a->orphaned_mem;
}

u32 gs_acct_free_weight(const struct gs_acct *a)
{
	return GPUSHARE_WEIGHT_MAX - a->used_weight;
}

/* Would one more container with @mem and @weight fit?  0 or -ENOSPC. */
int gs_acct_fits(const struct gs_acct *a, u64 mem, u32 weight)
{
	if (a->ninst >= a->max_inst || mem > gs_acct_free_mem(a) ||
	    weight > gs_acct_free_weight(a))
		return -ENOSPC;
	return 0;
}

/*
 * Change one container's share of this GPU to @mem and @weight, if it
 * still fits; otherwise leave everything as it was.  0 or -ENOSPC.
 */
int gs_acct_change(struct gs_acct *a, struct gs_quota *q, u64 mem, u32 weight)
{
	if (mem > gs_acct_free_mem(a) + q->memsize ||
	    weight > gs_acct_free_weight(a) + q->weight)
		return -ENOSPC;
	a->used_mem = a->used_mem - q->memsize + mem;
	a->used_weight = a->used_weight - q->weight + weight;
	q->memsize = mem;
	q->weight = weight;
	return 0;
}

int gs_acct_set_total(struct gs_acct *a, u64 total_mem)
{
	if (!total_mem)
		return -EINVAL;
	/* No overflow: the sum is at most the current total_mem. */
	if (total_mem < a->used_mem + a->orphaned_mem)
		return -ENOSPC;
	a->total_mem = total_mem;
	return 0;
}

int gs_acct_set_max_inst(struct gs_acct *a, u64 max_inst)
{
	if (max_inst < GPUSHARE_MAX_INST_MIN || max_inst > GPUSHARE_MAX_INST_MAX)
		return -EINVAL;
	if (max_inst < a->ninst)
		return -ENOSPC;
	a->max_inst = max_inst;
	return 0;
}

/*
 * Change a container's memsize on this GPU to @mem: not below what its
 * processes have reserved there (-EBUSY), and only if the GPU has room
 * (-ENOSPC).  Nothing changes on a refusal.
 */
int gs_acct_set_memsize(struct gs_acct *a, struct gs_quota *q,
			const struct gs_ledger *l, u64 mem)
{
	if (!mem)
		return -EINVAL;
	if (mem < l->used)
		return -EBUSY;
	return gs_acct_change(a, q, mem, q->weight);
}

/*
 * The memory ledger: GPUSHARE_IOC_MEM's arithmetic.  The caller holds the
 * lock that covers the ledger, @mine (what one open file holds on this
 * GPU) and the GPU's orphaned_mem.  Invariants: *mine <= l->used, and
 * l->used <= q->memsize while the container is registered.
 */

/* The quota a ledger answers with: memsize, or 0 once it is deleted. */
u64 gs_mem_quota(const struct gs_quota *q, const struct gs_ledger *l)
{
	return l->orphaned ? 0 : q->memsize;
}

/*
 * Reserve @bytes for the file that holds @mine, all or nothing: -ENOENT
 * once the container is deleted, -EDQUOT beyond its memsize.  Written so
 * that nothing overflows whatever the operands (bytes up to U64_MAX).
 */
int gs_mem_reserve(const struct gs_quota *q, struct gs_ledger *l, u64 *mine,
		   u64 bytes)
{
	if (l->orphaned)
		return -ENOENT;
	if (l->used > q->memsize || bytes > q->memsize - l->used)
		return -EDQUOT;
	l->used += bytes;
	*mine += bytes;		/* <= l->used <= memsize: no overflow */
	return 0;
}

/*
 * Give back @bytes of what the file holds (@mine): -EINVAL, releasing
 * nothing, if it holds less.  A deleted container's bytes leave the GPU's
 * orphaned_mem with them.
 */
int gs_mem_release(struct gs_acct *a, struct gs_ledger *l, u64 *mine,
		   u64 bytes)
{
	if (bytes > *mine || bytes > l->used)
		return -EINVAL;
	*mine -= bytes;
	l->used -= bytes;
	if (l->orphaned)
		a->orphaned_mem -= bytes;
	return 0;
}

/*
 * The container is deleted (its memsize already uncharged from @a): what
 * its files still hold stays charged to the GPU as orphaned memory, so
 * that memory in use is never promised to another container.  The sum
 * stays within total_mem: used <= memsize, which was just uncharged.
 */
void gs_mem_orphan(struct gs_acct *a, struct gs_ledger *l)
{
	if (l->orphaned)
		return;
	l->orphaned = true;
	a->orphaned_mem += l->used;
}

/* Give quotas that asked for memsize 0 the default; -EINVAL if none. */
int gs_resolve_default(struct gs_quota *q, u32 n, u64 default_mem)
{
	u32 i;

	for (i = 0; i < n; i++) {
		if (q[i].memsize)
			continue;
		if (!default_mem)
			return -EINVAL;
		q[i].memsize = default_mem;
	}
	return 0;
}

/*
 * Would every quota fit on its GPU?  Checks all before anything is
 * charged, so a refusal leaves nothing to roll back.  The GPUs in @q are
 * distinct (gs_parse_cmd refuses duplicates).  0, -ENXIO (a GPU is not
 * declared) or -ENOSPC.
 */
int gs_admit(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
	     const struct gs_quota *q, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (q[i].gpu >= GPUSHARE_MAX_GPUS || !accts[q[i].gpu])
			return -ENXIO;
	for (i = 0; i < n; i++)
		if (gs_acct_fits(accts[q[i].gpu], q[i].memsize, q[i].weight))
			return -ENOSPC;
	return 0;
}

void gs_charge(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
	       const struct gs_quota *q, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++) {
		struct gs_acct *a = accts[q[i].gpu];

		a->used_mem += q[i].memsize;
		a->used_weight += q[i].weight;
		a->ninst++;
	}
}

void gs_uncharge(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
		 const struct gs_quota *q, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++) {
		struct gs_acct *a = accts[q[i].gpu];

		a->used_mem -= q[i].memsize;
		a->used_weight -= q[i].weight;
		a->ninst--;
	}
}
