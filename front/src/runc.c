// SPDX-License-Identifier: Apache-2.0
/* The real runc (see runc.h). */
#include "runc.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const fallback[] = { "/usr/sbin/runc", "/usr/bin/runc" };

static int same(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static int usable(const char *path, const struct stat *me, int nme)
{
	struct stat st;
	int i;

	if (stat(path, &st) || !S_ISREG(st.st_mode) || access(path, X_OK))
		return 0;
	for (i = 0; i < nme; i++)
		if (same(&st, &me[i]))
			return 0;
	return 1;
}

static int is_self(const char *path, const struct stat *me, int nme)
{
	struct stat st;
	int i;

	if (stat(path, &st))
		return 0;
	for (i = 0; i < nme; i++)
		if (same(&st, &me[i]))
			return 1;
	return 0;
}

const char *find_runc(const char *self)
{
	static char found[PATH_MAX];
	const char *chosen = getenv("GPUSHARE_RUNC"), *path = getenv("PATH"), *end;
	struct stat me[2];
	int nme = 0;
	size_t i, n;

	if (self && strchr(self, '/') && !stat(self, &me[nme]))
		nme++;
	if (!stat("/proc/self/exe", &me[nme]))
		nme++;
	/* $GPUSHARE_RUNC naming this program would have it exec itself for ever */
	if (chosen && chosen[0] && !is_self(chosen, me, nme))
		return chosen;
	for (; path && *path; path = *end ? end + 1 : end) {
		end = strchrnul(path, ':');
		n = (size_t)(end - path);
		if (!n)
			continue;
		if (snprintf(found, sizeof(found), "%.*s/runc", (int)n, path) >= (int)sizeof(found))
			continue;
		if (usable(found, me, nme))
			return found;
	}
	for (i = 0; i < sizeof(fallback) / sizeof(*fallback); i++)
		if (usable(fallback[i], me, nme))
			return fallback[i];
	return NULL;
}

static char **with_first(const char *first, int argc, char **argv)
{
	char **out = calloc((size_t)argc + 1, sizeof(*out));
	int i;

	if (!out)
		return NULL;
	out[0] = (char *)first;
	for (i = 1; i < argc; i++)
		out[i] = argv[i];
	return out;
}

int exec_runc(const char *real, int argc, char **argv)
{
	char **args;

	if (!real) {
		fprintf(stderr, "gpushare: no real runc found (not on PATH, not in %s or %s); "
			"set GPUSHARE_RUNC\n", fallback[0], fallback[1]);
		return 127;
	}
	args = with_first(real, argc, argv);
	if (args)
		execv(real, args);
	fprintf(stderr, "gpushare: cannot run %s: %s\n", real, strerror(errno));
	free(args);
	return 127;
}

static volatile pid_t child;
static const int passed[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT };

static void forward(int signum)
{
	int saved = errno;

	if (child > 0)
		kill(child, signum);
	errno = saved;
}

int run_runc(const char *real, int argc, char **argv)
{
	struct sigaction sa = { 0 }, before[4];
	sigset_t block, old;
	char **args = with_first(real, argc, argv);
	int status, i, e;
	pid_t pid;

	if (!args)
		return -1;
	if (access(real, X_OK)) {  /* said here: a child that cannot exec could not say it */
		free(args);
		return -1;
	}
	sigemptyset(&block);
	for (i = 0; i < 4; i++)
		sigaddset(&block, passed[i]);
	sigprocmask(SIG_BLOCK, &block, &old);
	sa.sa_handler = forward;
	sigemptyset(&sa.sa_mask);
	for (i = 0; i < 4; i++)
		sigaction(passed[i], &sa, &before[i]);
	pid = fork();
	if (pid == 0) {
		for (i = 0; i < 4; i++)
			sigaction(passed[i], &before[i], NULL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		execv(real, args);
		_exit(127);
	}
	e = errno;
	child = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);
	status = -1;
	if (pid > 0) {
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	child = 0;
	for (i = 0; i < 4; i++)
		sigaction(passed[i], &before[i], NULL);
	free(args);
	if (pid < 0) {
		errno = e;
		return -1;
	}
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}
