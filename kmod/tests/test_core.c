// SPDX-License-Identifier: GPL-2.0-only
/*
 * User-space unit tests of gs_core.c, the quota arithmetic and inst_ctl
 * parsing that gpushare.ko runs.  Prints "N passed, M failed" and exits
 * non-zero on any failure.  The tests are in test_core_*.c.
 */
#include "test_core.h"

/* Parse a copy of @text; the command lands in @cmd. */
int parse(const char *text, struct gs_cmd *cmd)
{
	static char buf[GPUSHARE_CMD_MAX + 1];

	snprintf(buf, sizeof(buf), "%s", text);
	return gs_parse_cmd(buf, cmd);
}

int main(void)
{
	test_numbers();
	test_ids();
	test_parse_ok();
	test_parse_bad();
	test_acct();
	test_admit();
	test_random();
	test_ledger();
	test_memsize_vs_used();
	test_orphaned();
	test_ledger_random();
	test_state_header();
	test_state_lines();
	test_state_check();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
