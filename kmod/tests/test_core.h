/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What tests/test_core*.c share: their checks and the tests main() runs.
 */
#ifndef _TEST_CORE_H
#define _TEST_CORE_H

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "gs_core.h"

int parse(const char *text, struct gs_cmd *cmd);

/* test_core_grammar.c */
void test_numbers(void);
void test_ids(void);
void test_parse_ok(void);
void test_parse_bad(void);

/* test_core_acct.c */
void test_acct(void);
void test_admit(void);
void test_random(void);

/* test_core_ledger.c */
void test_ledger(void);
void test_memsize_vs_used(void);
void test_orphaned(void);
void test_ledger_random(void);

/* test_core_state.c */
void test_state_header(void);
void test_state_lines(void);
void test_state_check(void);

#endif /* _TEST_CORE_H */
