/* SPDX-License-Identifier: Apache-2.0 */
/*
 * runc's command line, read as nri_gpushare/local/runc_args.py reads it (the
 * reference): global options, the subcommand, a subcommand's options (by
 * long name, anywhere, unknown ones tolerated) and arguments.  Pure.
 */
#ifndef GS_FRONT_ARGS_H
#define GS_FRONT_ARGS_H

#include <stddef.h>

#define MAX_OPTS 128

struct opt {
	const char *name;	/* not NUL-terminated: name_len bytes */
	size_t name_len;
	const char *value;	/* "true" for a switch */
};

struct opts {
	struct opt o[MAX_OPTS];
	int n;
	int overflow;		/* more than MAX_OPTS options: not read */
};

/* The value of the last option `name` given, or NULL. */
const char *opt_get(const struct opts *o, const char *name);

/* runc's global options into *o; the index in args of the subcommand (argc when none). */
int parse_globals(int argc, char *const *args, struct opts *o);

enum command_kind { CMD_CREATE, CMD_DELETE };

/*
 * A subcommand's options into *o and arguments into argv_out (room for argc
 * pointers), their count in *nargs.  -1 when the container ID cannot be told
 * (neither reading of unknown options leaves one argument), or on overflow.
 */
int parse_command(int argc, char *const *args, enum command_kind kind, struct opts *o,
		  char **argv_out, int *nargs);

#endif
