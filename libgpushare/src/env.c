// SPDX-License-Identifier: Apache-2.0
/* Parsing the injected environment (see env.h). */
#include <string.h>
#include <strings.h>

#include "env.h"

/*
 * The token at *p, spaces trimmed: its start and length in *start and
 * *len; *p moves past it and its comma.  False when it was the last one.
 */
static bool token(const char **p, const char **start, size_t *len)
{
	const char *s = *p, *end = strchrnul(s, ',');
	bool more = *end == ',';

	*p = more ? end + 1 : end;
	while (s < end && (*s == ' ' || *s == '\t'))
		s++;
	while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*start = s;
	*len = (size_t)(end - s);
	return more;
}

int gs_parse_uuids(const char *s, char out[][GS_UUID_MAX], int max)
{
	int n = 0;
	bool more = true;

	if (!s)
		return -1;
	while (more) {
		const char *start;
		size_t len;
		more = token(&s, &start, &len);
		if (len == 0 || len >= GS_UUID_MAX || n == max)
			return -1;
		for (size_t i = 0; i < len; i++)
			if (start[i] <= ' ' || start[i] > '~')
				return -1;
		memcpy(out[n], start, len);
		out[n++][len] = '\0';
	}
	return n;
}

int gs_parse_limits(const char *s, uint64_t *out, int max)
{
	int n = 0;
	bool more = true;

	if (!s)
		return -1;
	while (more) {
		const char *start;
		size_t len;
		uint64_t v = 0;
		more = token(&s, &start, &len);
		if (len == 0 || n == max)
			return -1;
		for (size_t i = 0; i < len; i++) {
			unsigned int d = (unsigned int)(start[i] - '0');
			if (d > 9 || v > (UINT64_MAX - d) / 10)
				return -1;
			v = v * 10 + d;
		}
		out[n++] = v;
	}
	return n;
}

int gs_parse_percents(const char *s, uint32_t *out, int max)
{
	uint64_t v[GS_MAX_GPUS];

	if (max > GS_MAX_GPUS)
		max = GS_MAX_GPUS;
	int n = gs_parse_limits(s, v, max);
	for (int i = 0; i < n; i++) {
		if (v[i] > 100)
			return -1;
		out[i] = (uint32_t)v[i];
	}
	return n;
}

bool gs_isolation_compute(const char *isolation)
{
	return !isolation || (strcasecmp(isolation, "memory") && strcasecmp(isolation, "none"));
}

int gs_config_parse(struct gs_config *c, const char *uuids, const char *limits,
		    const char *isolation)
{
	memset(c, 0, sizeof(*c));
	if (isolation && !strcasecmp(isolation, "none")) {
		c->off = true;
		return 0;
	}
	if (uuids && *uuids) {
		c->nuuids = gs_parse_uuids(uuids, c->uuids, GS_MAX_GPUS);
		if (c->nuuids < 0) {
			c->error = "GPUSHARE_GPU_UUIDS is not a list of at most 16 UUIDs";
			goto bad;
		}
	}
	if (limits && *limits) {
		c->nlimits = gs_parse_limits(limits, c->limits, GS_MAX_GPUS);
		if (c->nlimits < 0) {
			c->error = "GPUSHARE_MEMORY_LIMIT is not a list of at most 16 byte counts";
			goto bad;
		}
		if (c->nuuids && c->nlimits != c->nuuids) {
			c->error = "GPUSHARE_MEMORY_LIMIT and GPUSHARE_GPU_UUIDS differ in length";
			goto bad;
		}
	}
	return 0;
bad:
	c->nuuids = 0;
	c->nlimits = 0;
	return -1;
}

void gs_format_uuid(const unsigned char raw[16], char out[GS_UUID_MAX])
{
	static const char hex[] = "0123456789abcdef";
	char *p = out;

	memcpy(p, "GPU-", 4);
	p += 4;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[raw[i] >> 4];
		*p++ = hex[raw[i] & 15];
	}
	*p = '\0';
}

bool gs_uuid_equal(const char *a, const char *b)
{
	return a && b && !strcasecmp(a, b);
}

bool gs_env_true(const char *s)
{
	return s && (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") ||
		     !strcasecmp(s, "on"));
}
