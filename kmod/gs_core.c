// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare core: quota arithmetic and inst_ctl command parsing.
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

static bool gs_isdigit(char c)
{
	return c >= '0' && c <= '9';
}

/*
 * A decimal number, digits only, that fits in 64 bits.  kstrtou64() also
 * takes a leading '+' and a trailing newline, which the grammar does not:
 * the first and the last character must be digits.
 */
int gs_parse_u64(const char *s, u64 *val)
{
	size_t len = strlen(s);

	if (!len || !gs_isdigit(s[0]) || !gs_isdigit(s[len - 1]))
		return -EINVAL;
	return kstrtou64(s, 10, val) ? -EINVAL : 0;
}

/* The body of a single-value procfs write: a number, optionally '\n'. */
int gs_parse_value(char *buf, u64 *val)
{
	size_t len = strlen(buf);

	if (len && buf[len - 1] == '\n')
		buf[len - 1] = '\0';
	return gs_parse_u64(buf, val);
}

bool gs_valid_id(const char *id)
{
	size_t len = strlen(id);
	size_t i;

	if (len < 1 || len > GPUSHARE_ID_MAX)
		return false;
	if (!strcmp(id, ".") || !strcmp(id, ".."))
		return false;
	for (i = 0; i < len; i++) {
		char c = id[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' ||
		      c == '-'))
			return false;
	}
	for (i = 0; i < GS_GPU_NFILES; i++)
		if (!strcmp(id, gs_gpu_files[i]))
			return false;
	return true;
}

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

/* The next word separated by blanks (strsep() leaves empty ones); NULL at the end. */
static char *gs_token(char **s)
{
	char *word;

	do
		word = strsep(s, " \t");
	while (word && !*word);
	return word;
}

/* A number of at most @max: gs_parse_u64() and the bound. */
static int gs_parse_u32(const char *s, u32 max, u32 *val)
{
	u64 v;

	if (gs_parse_u64(s, &v) || v > max)
		return -EINVAL;
	*val = v;
	return 0;
}

static int gs_parse_id(const char *s, struct gs_cmd *cmd)
{
	if (!s || !gs_valid_id(s))
		return -EINVAL;
	strcpy(cmd->id, s);
	return 0;
}

/* <gpu>:<memsize>[:<weight>[:<highprio>]] */
static int gs_parse_quota(char *s, struct gs_quota *q)
{
	char *gpu = strsep(&s, ":");
	char *mem = strsep(&s, ":");
	char *weight = strsep(&s, ":");
	char *highprio = strsep(&s, ":");

	if (!mem || s)
		return -EINVAL;
	if (gs_parse_u32(gpu, GPUSHARE_MAX_GPUS - 1, &q->gpu) ||
	    gs_parse_u64(mem, &q->memsize))
		return -EINVAL;
	if (weight && gs_parse_u32(weight, GPUSHARE_WEIGHT_MAX, &q->weight))
		return -EINVAL;
	if (highprio && gs_parse_u32(highprio, 1, &q->highprio))
		return -EINVAL;
	return 0;
}

static int gs_parse_quotas(char *s, struct gs_cmd *cmd)
{
	u32 seen = 0;
	char *item;

	if (!s)
		return -EINVAL;
	while ((item = strsep(&s, ","))) {
		struct gs_quota *q = &cmd->quota[cmd->nquota];

		if (cmd->nquota == GPUSHARE_MAX_GPUS || gs_parse_quota(item, q))
			return -EINVAL;
		if (seen & (1U << q->gpu))
			return -EINVAL;		/* the same GPU twice */
		seen |= 1U << q->gpu;
		cmd->nquota++;
	}
	return 0;
}

static int gs_parse_bind(char *s, struct gs_cmd *cmd)
{
	if (!s)
		return -EINVAL;
	if (s[0] == '/') {
		cmd->cgroup_path = s;
		return 0;
	}
	return gs_parse_u64(s, &cmd->cgroup_id);
}

/*
 * Parse one inst_ctl command (see kmod/README.md) in @buf, which is
 * modified: cmd->cgroup_path points into it.  Returns 0 or -EINVAL.
 */
int gs_parse_cmd(char *buf, struct gs_cmd *cmd)
{
	size_t len = strlen(buf);
	char *s = buf;
	char *verb;
	int ret;

	memset(cmd, 0, sizeof(*cmd));
	if (len && buf[len - 1] == '\n')
		buf[len - 1] = '\0';
	verb = gs_token(&s);
	if (!verb)
		return -EINVAL;

	if (!strcmp(verb, "gpu")) {
		cmd->op = GS_OP_GPU;
		ret = -EINVAL;
		verb = gs_token(&s);
		if (verb && !gs_parse_u32(verb, GPUSHARE_MAX_GPUS - 1, &cmd->gpu)) {
			verb = gs_token(&s);
			if (verb && !gs_parse_u64(verb, &cmd->total_mem) &&
			    cmd->total_mem)
				ret = 0;
		}
	} else if (!strcmp(verb, "add")) {
		cmd->op = GS_OP_ADD;
		ret = gs_parse_id(gs_token(&s), cmd);
		if (!ret)
			ret = gs_parse_quotas(gs_token(&s), cmd);
	} else if (!strcmp(verb, "del")) {
		cmd->op = GS_OP_DEL;
		ret = gs_parse_id(gs_token(&s), cmd);
	} else if (!strcmp(verb, "bind")) {
		cmd->op = GS_OP_BIND;
		ret = gs_parse_id(gs_token(&s), cmd);
		if (!ret)
			ret = gs_parse_bind(gs_token(&s), cmd);
	} else {
		ret = -EINVAL;
	}
	if (!ret && gs_token(&s))
		ret = -EINVAL;			/* trailing words */
	return ret;
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

/* ---- the upgrade state (see gs_core.h and kmod/README.md) ---- */

const char *const gs_setting_names[GS_SET_N] = {
	[GS_SET_DEFAULT_MEMSIZE] = "default_memsize",
	[GS_SET_MAX_INST] = "max_inst",
	[GS_SET_POLICY] = "policy",
	[GS_SET_PRIO_RATIO] = "prio_ratio",
	[GS_SET_SLICE_US] = "slice_us",
	[GS_SET_DRAIN_US] = "drain_us",
};

const char *const gs_upgrade_states[GS_UPGRADE_NSTATES] = {
	[GS_UPGRADE_LIVE] = "live",
	[GS_UPGRADE_EXPORTED] = "exported",
	[GS_UPGRADE_IMPORTING] = "importing",
};

/* A module version: 1..GS_VERSION_MAX characters of [A-Za-z0-9._+~-]. */
bool gs_valid_version(const char *version)
{
	size_t len = strlen(version);
	size_t i;

	if (len < 1 || len > GS_VERSION_MAX)
		return false;
	for (i = 0; i < len; i++) {
		char c = version[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      gs_isdigit(c) || c == '.' || c == '_' || c == '+' ||
		      c == '~' || c == '-'))
			return false;
	}
	return true;
}

/* A value a setting may take (max_inst's count is checked by the caller). */
int gs_check_setting(enum gs_setting setting, u64 val)
{
	switch (setting) {
	case GS_SET_DEFAULT_MEMSIZE:
		return 0;
	case GS_SET_MAX_INST:
		return val >= GPUSHARE_MAX_INST_MIN &&
		       val <= GPUSHARE_MAX_INST_MAX ? 0 : -EINVAL;
	case GS_SET_POLICY:
		return gs_check_policy(val);
	case GS_SET_PRIO_RATIO:
		return gs_check_prio_ratio(val);
	case GS_SET_SLICE_US:
		return gs_check_slice_us(val);
	case GS_SET_DRAIN_US:
		return gs_check_drain_us(val);
	default:
		return -EINVAL;
	}
}

/*
 * The first line of a state to import (modified, without its newline):
 * "gpushare-upgrade <format> <version> exported".  Only an exported
 * module's state is final (its registry was frozen before it was read),
 * so nothing else is taken.  0, -EPROTO (another format) or -EINVAL.
 */
int gs_parse_state_header(char *line)
{
	char *s = line;
	char *magic = gs_token(&s);
	char *format = gs_token(&s);
	char *version = gs_token(&s);
	char *state = gs_token(&s);
	u32 fmt;

	if (!magic || strcmp(magic, "gpushare-upgrade") || !state ||
	    gs_token(&s) || gs_parse_u32(format, U32_MAX, &fmt) ||
	    !gs_valid_version(version) ||
	    strcmp(state, gs_upgrade_states[GS_UPGRADE_EXPORTED]))
		return -EINVAL;
	return fmt == GS_STATE_FORMAT ? 0 : -EPROTO;
}

/* set default_memsize <bytes> | set <gpu> <name> <value> */
static int gs_parse_set(char *s, struct gs_state_line *l)
{
	char *a = gs_token(&s);
	char *b = gs_token(&s);
	char *c = gs_token(&s);
	u32 i;

	if (!a || !b || gs_token(&s))
		return -EINVAL;
	l->kind = GS_LINE_SET;
	if (!c) {
		l->setting = GS_SET_DEFAULT_MEMSIZE;
		if (strcmp(a, gs_setting_names[GS_SET_DEFAULT_MEMSIZE]))
			return -EINVAL;
		return gs_parse_u64(b, &l->value);
	}
	if (gs_parse_u32(a, GPUSHARE_MAX_GPUS - 1, &l->cmd.gpu))
		return -EINVAL;
	for (i = GS_SET_MAX_INST; i < GS_SET_N; i++)
		if (!strcmp(b, gs_setting_names[i]))
			break;
	if (i == GS_SET_N || gs_parse_u64(c, &l->value))
		return -EINVAL;
	l->setting = i;
	return gs_check_setting(i, l->value);
}

/* gputime <id> <gpu> <ns> */
static int gs_parse_gputime(char *s, struct gs_state_line *l)
{
	char *gpu;

	l->kind = GS_LINE_GPUTIME;
	if (gs_parse_id(gs_token(&s), &l->cmd))
		return -EINVAL;
	gpu = gs_token(&s);
	if (!gpu || gs_parse_u32(gpu, GPUSHARE_MAX_GPUS - 1, &l->cmd.gpu))
		return -EINVAL;
	gpu = gs_token(&s);
	if (!gpu || gs_parse_u64(gpu, &l->value) || gs_token(&s))
		return -EINVAL;
	return 0;
}

/*
 * One line of a state to import after its header (modified, without its
 * newline): gpu, add, bind by cgroup id, set, gputime or end.  0 or -EINVAL.
 */
int gs_parse_state_line(char *line, struct gs_state_line *l)
{
	size_t word = strcspn(line, " \t");
	int ret;

	memset(l, 0, sizeof(*l));
	if (!strcmp(line, "end")) {
		l->kind = GS_LINE_END;
		return 0;
	}
	if (word == 3 && !strncmp(line, "set", 3))
		return gs_parse_set(line + 3, l);
	if (word == 7 && !strncmp(line, "gputime", 7))
		return gs_parse_gputime(line + 7, l);
	if (strchr(line, '\n'))
		return -EINVAL;	/* one line: gs_parse_cmd() would take a '\n' */
	ret = gs_parse_cmd(line, &l->cmd);
	l->kind = GS_LINE_CMD;
	if (!ret && (l->cmd.op == GS_OP_DEL ||
		     (l->cmd.op == GS_OP_BIND &&
		      (l->cmd.cgroup_path || !l->cmd.cgroup_id))))
		ret = -EINVAL;	/* only what a state holds */
	return ret;
}

/* The add line of @id among the first @n lines, or NULL. */
static const struct gs_state_line *
gs_state_added(const struct gs_state_line *lines, u32 n, const char *id)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (lines[i].kind == GS_LINE_CMD &&
		    lines[i].cmd.op == GS_OP_ADD && !strcmp(lines[i].cmd.id, id))
			return &lines[i];
	return NULL;
}

/* Whether one of the first @n lines has @kind, @op (for a command) and @id. */
static bool gs_state_has(const struct gs_state_line *lines, u32 n,
			 enum gs_line_kind kind, enum gs_op op, const char *id,
			 u32 gpu)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (lines[i].kind == kind &&
		    (kind != GS_LINE_CMD || lines[i].cmd.op == op) &&
		    !strcmp(lines[i].cmd.id, id) && lines[i].cmd.gpu == gpu)
			return true;
	return false;
}

/* Whether one of the first @n lines binds a container to @cgroup_id. */
static bool gs_state_bound(const struct gs_state_line *lines, u32 n,
			   u64 cgroup_id)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (lines[i].kind == GS_LINE_CMD &&
		    lines[i].cmd.op == GS_OP_BIND &&
		    lines[i].cmd.cgroup_id == cgroup_id)
			return true;
	return false;
}

/* A GPU as the state so far has it, for gs_check_state(). */
struct gs_state_sim {
	struct gs_acct acct[GPUSHARE_MAX_GPUS];
	struct gs_acct *accts[GPUSHARE_MAX_GPUS];
	u64 default_mem;
};

static int gs_check_state_line(struct gs_state_line *lines, u32 i,
			       struct gs_state_sim *sim)
{
	struct gs_state_line *l = &lines[i];
	const struct gs_state_line *add;
	struct gs_acct *a;
	u32 k;
	int ret;

	if (l->kind == GS_LINE_SET) {
		if (l->setting == GS_SET_DEFAULT_MEMSIZE) {
			sim->default_mem = l->value;
			return 0;
		}
		a = sim->accts[l->cmd.gpu];
		if (!a)
			return -ENXIO;
		if (l->setting == GS_SET_MAX_INST)
			return gs_acct_set_max_inst(a, l->value);
		return gs_check_setting(l->setting, l->value);
	}
	if (l->kind == GS_LINE_GPUTIME) {
		add = gs_state_added(lines, i, l->cmd.id);
		if (!add)
			return -ENOENT;
		for (k = 0; k < add->cmd.nquota; k++)
			if (add->cmd.quota[k].gpu == l->cmd.gpu)
				break;
		if (k == add->cmd.nquota)
			return -ENXIO;
		return gs_state_has(lines, i, GS_LINE_GPUTIME, GS_OP_GPU,
				    l->cmd.id, l->cmd.gpu) ? -EINVAL : 0;
	}
	switch (l->cmd.op) {
	case GS_OP_GPU:
		if (sim->accts[l->cmd.gpu])
			return -EINVAL;		/* declared twice */
		gs_acct_init(&sim->acct[l->cmd.gpu], l->cmd.total_mem);
		sim->accts[l->cmd.gpu] = &sim->acct[l->cmd.gpu];
		return 0;
	case GS_OP_ADD:
		if (gs_state_added(lines, i, l->cmd.id))
			return -EEXIST;
		ret = gs_resolve_default(l->cmd.quota, l->cmd.nquota,
					 sim->default_mem);
		if (!ret)
			ret = gs_admit(sim->accts, l->cmd.quota, l->cmd.nquota);
		if (!ret)
			gs_charge(sim->accts, l->cmd.quota, l->cmd.nquota);
		return ret;
	case GS_OP_BIND:
		if (!gs_state_added(lines, i, l->cmd.id))
			return -ENOENT;
		if (gs_state_has(lines, i, GS_LINE_CMD, GS_OP_BIND, l->cmd.id,
				 0))
			return -EINVAL;		/* bound twice */
		return gs_state_bound(lines, i, l->cmd.cgroup_id) ? -EBUSY : 0;
	default:
		return -EINVAL;
	}
}

/*
 * Would the parsed lines of a state (in their order) rebuild a module
 * whose registry is empty, every one of them taken, and is the state
 * whole (its last line, and only that, is "end")?  The same checks as
 * the commands' own, on a model of the GPUs: each GPU declared once and
 * before its settings and containers, each ID added once and bound and
 * timed after its add, nothing over-committed.  Quotas that ask for the
 * default memsize get it (as add would).  0, or the first refusal's errno
 * with *@bad its line's index.
 */
int gs_check_state(struct gs_state_line *lines, u32 n, u32 *bad)
{
	struct gs_state_sim sim;
	u32 i;
	int ret;

	memset(&sim, 0, sizeof(sim));
	for (i = 0; i < n; i++) {
		if (lines[i].kind == GS_LINE_END)
			ret = i + 1 == n ? 0 : -EINVAL;
		else
			ret = gs_check_state_line(lines, i, &sim);
		if (ret) {
			*bad = i;
			return ret;
		}
	}
	/* No end line: a first piece of a state, or one cut short. */
	if (!n || lines[n - 1].kind != GS_LINE_END) {
		*bad = n;
		return -EINVAL;
	}
	return 0;
}
