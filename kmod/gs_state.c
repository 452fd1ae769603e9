// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare core: the upgrade state's grammar (see gs_core.h and
 * kmod/README.md), and the check that a parsed state replays whole into
 * an empty module.  Nothing here sleeps, allocates or touches kernel
 * state.
 */
#include "gs_grammar.h"

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
