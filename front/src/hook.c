// SPDX-License-Identifier: Apache-2.0
/*
 * The CDI spec's OCI hooks, compiled (hook.py is the reference and the
 * fallback): the OCI state on stdin goes to the daemon as text (the `hook`
 * op); the daemon parses it, reads the bundle and asks.  create-runtime
 * fails the container (exit 1, the reason on stderr) on a refusal or a
 * daemon that does not answer; poststop always exits 0.  Anything odd (other
 * arguments, a daemon that cannot be reached, a state or bundle the daemon
 * would not read) becomes `nri-gpushare hook` with the same arguments and
 * the same stdin.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "fallback.h"
#include "front.h"

#define MAX_STATE (4 << 20)
#define START_DAEMON \
	"start it (`systemctl start nri-gpushare`, or `nri-gpushare run --config FILE`) " \
	"and create the container again"

static void say(const char *message)
{
	if (strncmp(message, "gpushare:", 9))
		fputs("gpushare: ", stderr);
	fputs(message, stderr);
	fputc('\n', stderr);
	fflush(stderr);
}

/* stdin, at most MAX_STATE + 1 bytes; -1 when it cannot be read. */
static int read_state(struct buf *b)
{
	char chunk[65536];
	ssize_t n;

	while (b->len <= MAX_STATE) {
		n = read(STDIN_FILENO, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		buf_add(b, chunk, (size_t)n);
		if (b->failed)
			return -1;
	}
	return 0;
}

/*
 * `nri-gpushare hook` in our place; when even that cannot run, a poststop
 * hook (the first argument that is no option) still exits 0: it must never
 * fail a delete.
 */
static int python(int nargs, char **args, const char *state, size_t len)
{
	int i;

	fallback_hook(nargs, args, state, len);
	for (i = 0; i < nargs; i++) {
		if (!strcmp(args[i], "--socket") || !strcmp(args[i], "--timeout"))
			i++;  /* its value, which may not start with '-' */
		else if (args[i][0] != '-')
			break;
	}
	return i < nargs && !strcmp(args[i], "poststop") ? 0 : 127;
}

int hook_main(int nargs, char **args)
{
	const char *action = NULL, *socket = api_socket();
	struct buf state = { 0 }, req = { 0 }, why = { 0 };
	enum api_result res;
	struct reply r = { 0 };
	int i, code = -1, creating;

	for (i = 0; i < nargs; i++) {
		if (!strcmp(args[i], "--socket") && i + 1 < nargs && args[i + 1][0])
			socket = args[++i];
		else if (!strncmp(args[i], "--socket=", 9) && args[i][9])
			socket = args[i] + 9;
		else if (!action && (!strcmp(args[i], "create-runtime") || !strcmp(args[i], "poststop")))
			action = args[i];
		else
			return python(nargs, args, NULL, 0);  /* usage, --help, --timeout */
	}
	if (!action || isatty(STDIN_FILENO))
		return python(nargs, args, NULL, 0);
	if (read_state(&state) || !state.len || state.len > MAX_STATE)
		goto python;
	creating = !strcmp(action, "create-runtime");
	buf_addf(&req, "{\"v\":1,\"op\":\"hook\",\"hook\":\"%s\",\"state\":", action);
	if (json_string(&req, state.p, state.len))
		goto python;
	buf_adds(&req, "}\n");
	if (api_call(socket, &req, &r, &why, &res)) {
		if (res != API_TIMEOUT)
			goto python;
		buf_free(&req);
		if (creating)
			buf_addf(&req, "the nri-gpushare daemon is not running or not answering (%s); "
				 "this container was given a GPU through its CDI spec and is not "
				 "started unguarded: " START_DAEMON, why.p);
		else
			buf_addf(&req, "could not release the container's GPU share: %s", why.p);
		say(req.p ? req.p : "the nri-gpushare daemon did not answer");
		code = creating;
	} else if (r.ok) {
		code = 0;
	} else if (creating && r.reason && strcmp(r.reason, "bundle") &&
		   strcmp(r.reason, "protocol") && strcmp(r.reason, "internal")) {
		if (r.error && r.error[0]) {
			say(r.error);
		} else {
			buf_free(&why);
			buf_addf(&why, "the nri-gpushare daemon refused the container (%s)", r.reason);
			say(why.p ? why.p : "the nri-gpushare daemon refused the container");
		}
		code = 1;
	}
python:
	reply_free(&r);
	buf_free(&req);
	buf_free(&why);
	if (code < 0)
		code = python(nargs, args, state.p ? state.p : "", state.len);
	buf_free(&state);
	return code;
}
