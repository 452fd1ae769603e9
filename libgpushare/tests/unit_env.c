// SPDX-License-Identifier: Apache-2.0
/* Parsing the injected environment. */
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "unit.h"

int main(void)
{
	struct gs_config c;
	char u[GS_MAX_GPUS][GS_UUID_MAX];
	uint64_t l[GS_MAX_GPUS];
	char s[GS_UUID_MAX];

	/* Limits: decimal bytes, spaces around tokens allowed. */
	CHECK(gs_parse_limits("1073741824", l, GS_MAX_GPUS) == 1 && l[0] == 1073741824);
	CHECK(gs_parse_limits("1, 2 ,3", l, GS_MAX_GPUS) == 3 && l[0] == 1 && l[1] == 2 &&
	      l[2] == 3);
	CHECK(gs_parse_limits("18446744073709551615", l, 1) == 1 && l[0] == UINT64_MAX);
	CHECK(gs_parse_limits("18446744073709551616", l, 1) == -1);	/* overflow */
	CHECK(gs_parse_limits("", l, 4) == -1);
	CHECK(gs_parse_limits("1,,2", l, 4) == -1);
	CHECK(gs_parse_limits("1,", l, 4) == -1);
	CHECK(gs_parse_limits("1G", l, 4) == -1);
	CHECK(gs_parse_limits("-1", l, 4) == -1);
	CHECK(gs_parse_limits("1,2,3", l, 2) == -1);			/* too many */
	CHECK(gs_parse_limits(NULL, l, 2) == -1);

	/* UUIDs. */
	CHECK(gs_parse_uuids("GPU-a,GPU-b", u, GS_MAX_GPUS) == 2 && !strcmp(u[0], "GPU-a") &&
	      !strcmp(u[1], "GPU-b"));
	CHECK(gs_parse_uuids(" GPU-a ", u, GS_MAX_GPUS) == 1 && !strcmp(u[0], "GPU-a"));
	CHECK(gs_parse_uuids("GPU-a,", u, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_uuids("GPU a", u, GS_MAX_GPUS) == -1);
	char long_one[100];
	memset(long_one, 'x', 99);
	long_one[99] = 0;
	CHECK(gs_parse_uuids(long_one, u, GS_MAX_GPUS) == -1);

	/* The UUID's NVML form, compared in any case. */
	unsigned char raw[16] = { 0xfa, 0xce, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f };
	gs_format_uuid(raw, s);
	CHECK(!strcmp(s, "GPU-face0000-0000-0000-0000-00000000001f"));
	CHECK(gs_uuid_equal(s, "GPU-FACE0000-0000-0000-0000-00000000001F"));
	CHECK(!gs_uuid_equal(s, "GPU-face0000-0000-0000-0000-000000000001"));
	CHECK(!gs_uuid_equal(s, NULL));

	/* The configuration as a whole. */
	CHECK(gs_config_parse(&c, NULL, NULL, NULL) == 0 && !c.off && !c.nuuids && !c.nlimits);
	CHECK(gs_config_parse(&c, "GPU-a,GPU-b", "10,20", "full") == 0 && c.nuuids == 2 &&
	      c.nlimits == 2 && c.limits[1] == 20 && !c.error);
	CHECK(gs_config_parse(&c, "GPU-a,GPU-b", "10,20", "none") == 0 && c.off);
	CHECK(gs_config_parse(&c, "GPU-a,GPU-b", "10,20", "NONE") == 0 && c.off);
	CHECK(gs_config_parse(&c, "", "10", NULL) == 0 && !c.nuuids && c.nlimits == 1);
	CHECK(gs_config_parse(&c, "GPU-a", NULL, "memory") == 0 && c.nuuids == 1 && !c.nlimits);
	CHECK(gs_config_parse(&c, "GPU-a,GPU-b", "10", NULL) == -1 && c.error &&
	      !c.nuuids && !c.nlimits);			/* lengths differ */
	CHECK(gs_config_parse(&c, "GPU-a", "ten", NULL) == -1 && c.error && !c.nlimits);
	CHECK(gs_config_parse(&c, ",", "1", NULL) == -1 && c.error);

	/* Hostile sizes: refused, within bounds (ASan), and the scan stops early. */
	size_t big = 1 << 20;
	char *huge = malloc(big + 1);
	memset(huge, 'A', big);
	huge[big] = 0;
	CHECK(gs_parse_uuids(huge, u, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_limits(huge, l, GS_MAX_GPUS) == -1);
	for (size_t i = 0; i + 2 <= big; i += 2)	/* "1,1,...": 524,288 entries */
		memcpy(huge + i, "1,", 2);
	huge[big - 1] = '1';
	CHECK(gs_parse_limits(huge, l, GS_MAX_GPUS) == -1);
	CHECK(gs_config_parse(&c, NULL, huge, NULL) == -1 && c.error && !c.nlimits);
	for (size_t i = 0; i + 6 <= big; i += 6)	/* "GPU-a,...": duplicates */
		memcpy(huge + i, "GPU-a,", 6);
	huge[big - 1 - big % 6] = 0;
	CHECK(gs_parse_uuids(huge, u, GS_MAX_GPUS) == -1);
	CHECK(gs_config_parse(&c, huge, "1", NULL) == -1 && c.error && !c.nuuids);
	free(huge);
	/* Duplicates within the bound parse (the ledger matches the last). */
	CHECK(gs_parse_uuids("GPU-a,GPU-a", u, GS_MAX_GPUS) == 2);

	/* GPUSHARE_CORE_LIMIT: percents 0..100. */
	uint32_t pc[GS_MAX_GPUS];
	CHECK(gs_parse_percents("30", pc, GS_MAX_GPUS) == 1 && pc[0] == 30);
	CHECK(gs_parse_percents("0, 100 ,50", pc, GS_MAX_GPUS) == 3 && pc[0] == 0 &&
	      pc[1] == 100 && pc[2] == 50);
	CHECK(gs_parse_percents("101", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("50,4294967346", pc, GS_MAX_GPUS) == -1);	/* 2^32 + 50 */
	CHECK(gs_parse_percents("18446744073709551616", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("-1", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("50%", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("0.5", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("10,,20", pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents(NULL, pc, GS_MAX_GPUS) == -1);
	CHECK(gs_parse_percents("1,2,3", pc, 2) == -1);			/* too many */
	CHECK(gs_parse_percents("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", pc, 100) == -1);	/* 17 */
	CHECK(gs_parse_percents("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", pc, 100) == 16);
	huge = malloc(big + 1);
	for (size_t i = 0; i + 3 <= big; i += 3)
		memcpy(huge + i, "50,", 3);
	huge[big - 1 - big % 3] = 0;
	CHECK(gs_parse_percents(huge, pc, GS_MAX_GPUS) == -1);
	free(huge);
	CHECK(gs_isolation_compute(NULL) && gs_isolation_compute("full") &&
	      gs_isolation_compute("FULL") && gs_isolation_compute(""));
	CHECK(!gs_isolation_compute("memory") && !gs_isolation_compute("Memory") &&
	      !gs_isolation_compute("none"));

	CHECK(gs_env_true("1") && gs_env_true("TRUE") && gs_env_true("yes"));
	CHECK(!gs_env_true("0") && !gs_env_true("") && !gs_env_true(NULL) && !gs_env_true("2"));
	return DONE("unit_env");
}
