// SPDX-License-Identifier: Apache-2.0
/* runc's command line (see args.h); runc_args.py is the reference. */
#include "args.h"

#include <string.h>

static const char *const global_value[] = { "log", "log-format", "root", "criu", "rootless", NULL };
static const char *const global_bool[] = { "debug", "systemd-cgroup", "help", "h", "version", "v",
					   NULL };
static const char *const commands[] = {
	"checkpoint", "create", "delete", "events", "exec", "features", "init", "kill", "list",
	"pause", "ps", "restore", "resume", "run", "spec", "start", "state", "update", "help", "h",
	NULL
};
static const char *const create_value[] = { "bundle", "b", "console-socket", "pid-file",
					    "preserve-fds", NULL };
static const char *const create_bool[] = { "no-pivot", "no-new-keyring", "help", "h", NULL };
static const char *const no_values[] = { NULL };
static const char *const delete_bool[] = { "force", "f", "help", "h", NULL };
static const char *const aliases[][2] = {
	{ "b", "bundle" }, { "f", "force" }, { "h", "help" }, { "v", "version" }, { NULL, NULL }
};

static int in(const char *const *set, const char *name, size_t len)
{
	for (; *set; set++)
		if (strlen(*set) == len && !memcmp(*set, name, len))
			return 1;
	return 0;
}

/* A Go flag token's name (aliases resolved) and value after '=' (NULL if none); 0 for an argument. */
static int flag(const char *token, const char **name, size_t *len, const char **value)
{
	const char *eq;
	int i;

	if (!token[0] || !token[1] || token[0] != '-')
		return 0;
	*name = token + (token[1] == '-' ? 2 : 1);
	eq = strchr(*name, '=');
	*len = eq ? (size_t)(eq - *name) : strlen(*name);
	*value = eq ? eq + 1 : NULL;
	for (i = 0; aliases[i][0]; i++) {
		if (strlen(aliases[i][0]) == *len && !memcmp(aliases[i][0], *name, *len)) {
			*name = aliases[i][1];
			*len = strlen(*name);
		}
	}
	return 1;
}

static int is_flag(const char *token)
{
	const char *n, *v;
	size_t l;

	return flag(token, &n, &l, &v);
}

static int add(struct opts *o, const char *name, size_t len, const char *value)
{
	if (o->n >= MAX_OPTS) {
		o->overflow = 1;
		return -1;
	}
	o->o[o->n].name = name;
	o->o[o->n].name_len = len;
	o->o[o->n].value = value;
	o->n++;
	return 0;
}

const char *opt_get(const struct opts *o, const char *name)
{
	size_t len = strlen(name);
	int i;

	for (i = o->n - 1; i >= 0; i--)
		if (o->o[i].name_len == len && !memcmp(o->o[i].name, name, len))
			return o->o[i].value;
	return NULL;
}

int parse_globals(int argc, char *const *args, struct opts *o)
{
	const char *name, *value, *following;
	size_t len;
	int i = 0, takes;

	memset(o, 0, sizeof(*o));
	while (i < argc) {
		if (!strcmp(args[i], "--"))
			return i + 1;
		if (!flag(args[i], &name, &len, &value))
			break;
		if (!value) {
			following = i + 1 < argc ? args[i + 1] : NULL;
			takes = in(global_value, name, len) ||
				(!in(global_bool, name, len) && following &&
				 !in(commands, following, strlen(following)) && !is_flag(following));
			if (takes && following)
				value = args[++i];
			else
				value = takes ? "" : "true";
		}
		add(o, name, len, value);
		i++;
	}
	return i;
}

/* One reading; 1 in *unknown when an option was not runc's. */
static int reading(int argc, char *const *args, const char *const *values,
		   const char *const *bools, int unknown_takes_value, struct opts *o,
		   char **argv_out, int *nargs, int *unknown)
{
	const char *name, *value;
	size_t len;
	int i = 0;

	memset(o, 0, sizeof(*o));
	*nargs = 0;
	*unknown = 0;
	while (i < argc) {
		if (!strcmp(args[i], "--")) {
			while (++i < argc)
				argv_out[(*nargs)++] = args[i];
			break;
		}
		if (!flag(args[i], &name, &len, &value)) {
			argv_out[(*nargs)++] = args[i++];
			continue;
		}
		if (!value) {
			if (in(values, name, len)) {
				if (i + 1 >= argc) {  /* runc says what is missing */
					memset(o, 0, sizeof(*o));
					*nargs = 0;
					*unknown = 0;
					return 0;
				}
				value = args[++i];
			} else if (in(bools, name, len)) {
				value = "true";
			} else {
				*unknown = 1;
				if (unknown_takes_value && i + 1 < argc && !is_flag(args[i + 1]))
					value = args[++i];
				else
					value = "true";
			}
		} else if (!in(values, name, len) && !in(bools, name, len)) {
			*unknown = 1;
		}
		if (add(o, name, len, value))
			return -1;
		i++;
	}
	return 0;
}

int parse_command(int argc, char *const *args, enum command_kind kind, struct opts *o,
		  char **argv_out, int *nargs)
{
	const char *const *values = kind == CMD_CREATE ? create_value : no_values;
	const char *const *bools = kind == CMD_CREATE ? create_bool : delete_bool;
	int unknown;

	if (reading(argc, args, values, bools, 0, o, argv_out, nargs, &unknown))
		return -1;
	if (unknown && *nargs != 1) {
		if (reading(argc, args, values, bools, 1, o, argv_out, nargs, &unknown) ||
		    *nargs != 1)
			return -1;
	}
	return 0;
}
