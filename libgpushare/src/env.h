/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The environment the plugin injects, parsed (pure: the values are passed
 * in, so it is unit-tested on its own):
 *
 *   GPUSHARE_GPU_UUIDS     the container's GPUs, comma-separated, in its
 *                          GPU order ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
 *   GPUSHARE_MEMORY_LIMIT  bytes per GPU, comma-separated, in the same order
 *                          (without UUIDs: by CUDA device ordinal)
 *   GPUSHARE_ISOLATION     full | memory | none (none: the interposer is off;
 *                          memory: launches are not gated)
 *   GPUSHARE_CORE_LIMIT    percent of each GPU's time, comma-separated, in
 *                          the same order (standalone compute mode)
 */
#ifndef GPUSHARE_ENV_H
#define GPUSHARE_ENV_H

#include <stdbool.h>
#include <stdint.h>

#define GS_MAX_GPUS 16		/* as the module's GPUSHARE_MAX_GPUS */
#define GS_UUID_MAX 64		/* room for a UUID string and its NUL */

struct gs_config {
	bool off;		/* isolation none: enforce nothing */
	int nuuids;		/* 0: no GPUSHARE_GPU_UUIDS */
	char uuids[GS_MAX_GPUS][GS_UUID_MAX];
	int nlimits;		/* 0: no GPUSHARE_MEMORY_LIMIT */
	uint64_t limits[GS_MAX_GPUS];
	const char *error;	/* why the environment was refused, or NULL */
};

/*
 * Read the three variables' values (NULL when unset).  Returns 0, or -1
 * with c->error set when a value is malformed: then the configuration is
 * empty (no UUIDs, no limits) and the caller decides what that means.
 */
int gs_config_parse(struct gs_config *c, const char *uuids, const char *limits,
		    const char *isolation);

/* Comma-separated lists; the count, or -1 if malformed or more than @max. */
int gs_parse_uuids(const char *s, char out[][GS_UUID_MAX], int max);
int gs_parse_limits(const char *s, uint64_t *out, int max);

/*
 * GPUSHARE_CORE_LIMIT: integers 0..100, comma-separated, spaces around
 * them allowed; the count, or -1 if malformed, over 100 or more than @max.
 */
int gs_parse_percents(const char *s, uint32_t *out, int max);

/* Whether GPUSHARE_ISOLATION (NULL when unset) asks for launches to be gated. */
bool gs_isolation_compute(const char *isolation);

/* The NVML form of 16 raw UUID bytes: "GPU-" and 8-4-4-4-12 lowercase hex. */
void gs_format_uuid(const unsigned char raw[16], char out[GS_UUID_MAX]);

/* Case-insensitive UUID comparison. */
bool gs_uuid_equal(const char *a, const char *b);

/* A yes/no variable: "1", "true", "yes", "on" (any case) is true. */
bool gs_env_true(const char *s);

#endif /* GPUSHARE_ENV_H */
