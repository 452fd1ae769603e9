// SPDX-License-Identifier: GPL-2.0-only
/*
 * gpushare core: the inst_ctl grammar (see kmod/README.md): commands,
 * container IDs and single-value procfs writes, parsed with kstrtou64()
 * and strsep().  Nothing here sleeps, allocates or touches kernel state.
 */
#include "gs_grammar.h"

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

/* The next word separated by blanks (strsep() leaves empty ones); NULL at the end. */
char *gs_token(char **s)
{
	char *word;

	do
		word = strsep(s, " \t");
	while (word && !*word);
	return word;
}

/* A number of at most @max: gs_parse_u64() and the bound. */
int gs_parse_u32(const char *s, u32 max, u32 *val)
{
	u64 v;

	if (gs_parse_u64(s, &v) || v > max)
		return -EINVAL;
	*val = v;
	return 0;
}

int gs_parse_id(const char *s, struct gs_cmd *cmd)
{
	if (!s || !gs_valid_id(s))
		return -EINVAL;
	strscpy(cmd->id, s, sizeof(cmd->id));
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
