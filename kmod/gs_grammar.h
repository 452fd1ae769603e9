/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gpushare core: what the two grammars (gs_grammar.c: inst_ctl,
 * gs_state.c: the upgrade state) share.  Internal to them.
 */
#ifndef _GS_GRAMMAR_H
#define _GS_GRAMMAR_H

#include "gs_core.h"

static inline bool gs_isdigit(char c)
{
	return c >= '0' && c <= '9';
}

char *gs_token(char **s);
int gs_parse_u32(const char *s, u32 max, u32 *val);
int gs_parse_id(const char *s, struct gs_cmd *cmd);

#endif /* _GS_GRAMMAR_H */
