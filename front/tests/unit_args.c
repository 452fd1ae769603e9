// SPDX-License-Identifier: Apache-2.0
/* runc's command line as runc_args.py reads it (tests/unit/test_runc_args.py has the same cases). */
#include "args.h"
#include "unit.h"

static int globals(char **args, int n, struct opts *o)
{
	return parse_globals(n, args, o);
}

static void test_globals(void)
{
	struct opts o;
	char *a1[] = { "--root", "/r", "--log=/l", "-log-format", "json", "--debug", "create", "c" };
	char *a2[] = { "--root", "delete", "--log", "create" };  /* values that look like commands */
	char *a3[] = { "--newflag", "v", "--new-switch", "state" };
	char *a4[] = { "--", "state" };
	char *a5[] = { "-h" };
	char *a6[] = { "--newflag", "create" };

	CHECK(globals(a1, 8, &o) == 6);
	CHECK_STR(opt_get(&o, "root"), "/r");
	CHECK_STR(opt_get(&o, "log"), "/l");
	CHECK_STR(opt_get(&o, "log-format"), "json");
	CHECK_STR(opt_get(&o, "debug"), "true");
	CHECK(globals(a2, 4, &o) == 4);
	CHECK_STR(opt_get(&o, "root"), "delete");
	CHECK_STR(opt_get(&o, "log"), "create");
	CHECK(globals(a3, 4, &o) == 3);
	CHECK_STR(opt_get(&o, "newflag"), "v");
	CHECK_STR(opt_get(&o, "new-switch"), "true");
	CHECK(globals(a4, 2, &o) == 1 && o.n == 0);
	CHECK(globals(a5, 1, &o) == 1);
	CHECK_STR(opt_get(&o, "help"), "true");
	CHECK(globals(a6, 2, &o) == 1);  /* an unknown option does not take a subcommand */
	CHECK_STR(opt_get(&o, "newflag"), "true");
	CHECK(globals(a6, 0, &o) == 0 && o.n == 0);
}

static int command(char **args, int n, enum command_kind kind, struct opts *o, char **out)
{
	int nargs = -1;

	if (parse_command(n, args, kind, o, out, &nargs))
		return -1;
	return nargs;
}

static void test_create(void)
{
	struct opts o;
	char *out[16];
	char *a1[] = { "c1", "-b", ".", "--pid-file=pid", "--preserve-fds", "0" };
	char *a2[] = { "--bundle", "/b", "--new", "x", "c1" };	/* an unknown option's value */
	char *a3[] = { "--new", "c1", "--pid-file", "p" };	/* an unknown switch */
	char *a4[] = { "--new", "a", "b", "c" };		/* neither reading leaves one */
	char *a5[] = { "c1", "--pid-file" };			/* runc says what is missing */
	char *a6[] = { "--", "-c1" };
	char *a7[] = { "--no-pivot", "c1", "--console-socket", "/s" };

	CHECK(command(a1, 6, CMD_CREATE, &o, out) == 1);
	CHECK_STR(out[0], "c1");
	CHECK_STR(opt_get(&o, "bundle"), ".");
	CHECK_STR(opt_get(&o, "pid-file"), "pid");
	CHECK(command(a2, 5, CMD_CREATE, &o, out) == 1);
	CHECK_STR(out[0], "c1");
	CHECK_STR(opt_get(&o, "new"), "x");
	CHECK(command(a3, 4, CMD_CREATE, &o, out) == 1);
	CHECK_STR(out[0], "c1");
	CHECK_STR(opt_get(&o, "new"), "true");
	CHECK(command(a4, 4, CMD_CREATE, &o, out) == -1);
	CHECK(command(a5, 2, CMD_CREATE, &o, out) == 0 && o.n == 0);
	CHECK(command(a6, 2, CMD_CREATE, &o, out) == 1);
	CHECK_STR(out[0], "-c1");
	CHECK(command(a7, 4, CMD_CREATE, &o, out) == 1);
	CHECK_STR(opt_get(&o, "no-pivot"), "true");
	CHECK(!opt_get(&o, "pid-file"));
}

static void test_delete(void)
{
	struct opts o;
	char *out[8];
	char *a1[] = { "-f", "c1" };
	char *a2[] = { "--force=true", "c1", "c2" };
	char *a3[] = { "--help" };

	CHECK(command(a1, 2, CMD_DELETE, &o, out) == 1);
	CHECK_STR(opt_get(&o, "force"), "true");
	CHECK(command(a2, 3, CMD_DELETE, &o, out) == 2);
	CHECK(command(a3, 1, CMD_DELETE, &o, out) == 0);
	CHECK_STR(opt_get(&o, "help"), "true");
}

static void test_too_many_options(void)
{
	char *args[MAX_OPTS + 2];
	char *out[MAX_OPTS + 2];
	struct opts o;
	int i;

	for (i = 0; i < MAX_OPTS + 1; i++)
		args[i] = "--no-pivot";
	args[i] = "c1";
	CHECK(command(args, MAX_OPTS + 2, CMD_CREATE, &o, out) == -1);
	CHECK(parse_globals(MAX_OPTS + 1, args, &o) == MAX_OPTS + 1 && o.overflow);
}

int main(void)
{
	test_globals();
	test_create();
	test_delete();
	test_too_many_options();
	return failures != 0;
}
