// SPDX-License-Identifier: Apache-2.0
/*
 * gpushare-runc, compiled (runc_wrapper.py is the reference and the
 * fallback).  Every subcommand but create, delete and exec becomes the real
 * runc at once.  create and delete are done here when the case is the
 * common one (a containerd shim's: --pid-file given, the daemon answering
 * the runc-create op); exec and everything odd become the Python wrapper,
 * with the same arguments, which says what it says.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "args.h"
#include "fallback.h"
#include "front.h"
#include "runc.h"
#include "tell.h"

struct call {
	int argc;
	char **argv;
	const char *real;
	const char *root;
	struct runc_log log;
};

static void error(struct call *c, const char *message)
{
	tell(message, "error", &c->log, 1);
}

/* On success runc's stderr is the container's: warnings go to the log when there is one. */
static void warn(struct call *c, const char *message)
{
	tell(message, "warning", &c->log, !c->log.path);
}

static int run(struct call *c)
{
	struct buf m = { 0 };
	int code = run_runc(c->real, c->argc, c->argv);

	if (code >= 0)
		return code;
	buf_addf(&m, "cannot run %s: %s", c->real, strerror(errno));
	error(c, m.p ? m.p : "cannot run runc");
	buf_free(&m);
	return 127;
}

/* A request {"v":1,"op":op,"namespace":ns,"id":id...}; its failed flag set when an ID is not UTF-8. */
static void request(struct buf *b, const char *op, const char *ns, const char *id)
{
	buf_addf(b, "{\"v\":1,\"op\":\"%s\"", op);
	if (ns) {
		buf_adds(b, ",\"namespace\":");
		if (json_string(b, ns, strlen(ns)))
			b->failed = 1;
	}
	buf_adds(b, ",\"id\":");
	if (json_string(b, id, strlen(id)))
		b->failed = 1;
}

/* Send a start or release, warning `what` on any problem. */
static void tell_daemon(struct call *c, struct buf *req, const char *what)
{
	struct buf why = { 0 }, m = { 0 };
	struct reply r;
	enum api_result res;
	int failed = 1;

	buf_adds(req, "}\n");
	if (req->failed) {
		buf_adds(&why, "id: not a containerd name");
	} else if (!api_call(api_socket(), req, &r, &why, &res)) {
		failed = !r.ok;
		if (!r.ok)
			buf_adds(&why, r.error ? r.error : "");
		reply_free(&r);
	}
	if (failed) {
		buf_addf(&m, "%s: %s", what, why.p);
		warn(c, m.p ? m.p : what);
	}
	buf_free(&why);
	buf_free(&m);
}

static void release(struct call *c, const char *ns, const char *cid)
{
	struct buf req = { 0 }, what = { 0 };

	request(&req, "release", ns, cid);
	buf_addf(&what, "could not release container %s's GPU share", cid);
	tell_daemon(c, &req, what.p ? what.p : "could not release a GPU share");
	buf_free(&req);
	buf_free(&what);
}

static void bind(struct call *c, const char *ns, const char *cid, const char *pid_file)
{
	struct buf req = { 0 }, what = { 0 }, why = { 0 };
	long pid = read_pid_file(pid_file, &why);

	buf_addf(&what, "container %s's GPU share is not bound to its cgroup", cid);
	if (pid < 0) {
		buf_addf(&req, "%s: %s", what.p ? what.p : "", why.p ? why.p : "");
		warn(c, req.p ? req.p : "not bound");
	} else {
		request(&req, "start", ns, cid);
		buf_addf(&req, ",\"pid\":%ld", pid);
		tell_daemon(c, &req, what.p ? what.p : "not bound");
	}
	buf_free(&req);
	buf_free(&what);
	buf_free(&why);
}

/* The daemon's refusal reasons on which the Python wrapper is asked instead. */
static int redo_in_python(const char *reason)
{
	return !reason || !strcmp(reason, "bundle") || !strcmp(reason, "protocol") ||
	       !strcmp(reason, "internal");
}

static int create(struct call *c, int n, char **args)
{
	char **arguments = calloc((size_t)n + 1, sizeof(*arguments));
	const char *bundle, *pid_file, *cid;
	struct buf req = { 0 }, why = { 0 }, path = { 0 };
	char cwd[PATH_MAX];
	enum api_result res;
	struct reply r = { 0 };
	struct opts o;
	int nargs, code = -1;

	if (!arguments || parse_command(n, args, CMD_CREATE, &o, arguments, &nargs))
		goto python;
	if (opt_get(&o, "help") || nargs != 1) {
		free(arguments);
		return exec_runc(c->real, c->argc, c->argv);  /* runc prints its help or complaint */
	}
	cid = arguments[0];
	pid_file = opt_get(&o, "pid-file");
	bundle = opt_get(&o, "bundle");
	if (!pid_file || !pid_file[0])
		goto python;  /* the pid from `runc state`: rare, left to Python */
	if (!bundle || !bundle[0])
		bundle = ".";
	if (bundle[0] != '/') {
		if (!getcwd(cwd, sizeof(cwd)))
			goto python;
		buf_addf(&path, "%s/%s", cwd, bundle);
		bundle = path.p;
	}
	request(&req, "runc-create", NULL, cid);
	buf_adds(&req, ",\"bundle\":");
	if (!bundle || json_string(&req, bundle, strlen(bundle)))
		goto python;
	buf_adds(&req, ",\"root\":");
	if (json_string(&req, c->root, strlen(c->root)))
		goto python;
	buf_adds(&req, "}\n");
	if (req.failed)
		goto python;
	if (api_call(api_socket(), &req, &r, &why, &res)) {
		if (res != API_TIMEOUT)
			goto python;
		/*
		 * Neither run nor asked again: the daemon may have booked a share
		 * and written it into config.json; it releases the share it could
		 * not answer with, and a second create would get the same share
		 * only to lose it then.
		 */
		buf_addf(&why, "; container %s is not created (a late share is released): retry",
			 cid);
		error(c, why.p ? why.p : "the nri-gpushare daemon did not answer");
		code = 1;
	} else if (!r.ok && redo_in_python(r.reason)) {
		goto python;
	} else if (!r.ok) {
		buf_free(&why);
		if (!r.error || !r.error[0])
			buf_addf(&why, "the nri-gpushare daemon refused container %s", cid);
		error(c, why.p ? why.p : r.error);
		code = 1;
	} else if (!r.plan) {
		code = exec_runc(c->real, c->argc, c->argv);
	} else {
		code = run(c);
		if (code)
			release(c, r.namespace ? r.namespace : "", cid);
		else
			bind(c, r.namespace ? r.namespace : "", cid, pid_file);
	}
python:
	reply_free(&r);
	buf_free(&req);
	buf_free(&why);
	buf_free(&path);
	free(arguments);
	return code >= 0 ? code : fallback_runc(c->argc, c->argv, c->real);
}

static int delete(struct call *c, int n, char **args)
{
	char **arguments = calloc((size_t)n + 1, sizeof(*arguments));
	char ns[128];
	struct opts o;
	int nargs, code;

	if (!arguments || parse_command(n, args, CMD_DELETE, &o, arguments, &nargs) ||
	    opt_get(&o, "help") || nargs != 1) {
		free(arguments);
		return exec_runc(c->real, c->argc, c->argv);
	}
	code = run(c);
	if (code == 0)
		release(c, namespace_from_root(c->root, ns, sizeof(ns)), arguments[0]);
	free(arguments);
	return code;
}

int runc_main(int argc, char **argv)
{
	struct opts g;
	struct call c = { argc, argv, NULL, "", { NULL, NULL } };
	int at = parse_globals(argc - 1, argv + 1, &g) + 1;
	const char *command = at < argc ? argv[at] : "", *v;

	c.real = find_runc(argc ? argv[0] : "");
	if ((strcmp(command, "create") && strcmp(command, "delete") && strcmp(command, "exec")) ||
	    opt_get(&g, "help") || opt_get(&g, "version") || !c.real)
		return exec_runc(c.real, argc, argv);
	if (!strcmp(command, "exec") || g.overflow)
		return fallback_runc(argc, argv, c.real);
	c.root = (v = opt_get(&g, "root")) ? v : "";
	c.log.path = (v = opt_get(&g, "log")) && v[0] ? v : NULL;
	c.log.format = (v = opt_get(&g, "log-format")) ? v : "text";
	if (!strcmp(command, "create"))
		return create(&c, argc - at - 1, argv + at + 1);
	return delete(&c, argc - at - 1, argv + at + 1);
}
