// SPDX-License-Identifier: Apache-2.0
/* The Python programs (see fallback.h). */
#include "fallback.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef PYBIN
#define PYBIN "/usr/local/lib/nri-gpushare/venv/bin"
#endif

static const char *program(char *out, size_t size, const char *name)
{
	const char *dir = getenv("GPUSHARE_PYBIN");

	snprintf(out, size, "%s/%s", dir && dir[0] ? dir : PYBIN, name);
	return out;
}

static int cannot(const char *path)
{
	fprintf(stderr, "gpushare: cannot run %s: %s\n", path, strerror(errno));
	return 127;
}

int fallback_runc(int argc, char **argv, const char *real)
{
	char path[4096];
	char **args = calloc((size_t)argc + 1, sizeof(*args));
	int i;

	program(path, sizeof(path), "gpushare-runc");
	if (!args)
		return cannot(path);
	if (real)
		setenv("GPUSHARE_RUNC", real, 1);
	args[0] = path;
	for (i = 1; i < argc; i++)
		args[i] = argv[i];
	execv(path, args);
	free(args);
	return cannot(path);
}

/* stdin replaced by a memory file holding data. */
static int refeed(const char *data, size_t len)
{
	int fd = memfd_create("gpushare-state", 0);
	size_t done = 0;
	ssize_t n;

	if (fd < 0)
		return -1;
	while (done < len) {
		n = write(fd, data + done, len - done);
		if (n <= 0)
			goto fail;
		done += (size_t)n;
	}
	if (lseek(fd, 0, SEEK_SET) || dup2(fd, STDIN_FILENO) < 0)
		goto fail;
	close(fd);
	return 0;
fail:
	close(fd);
	return -1;
}

int fallback_hook(int nargs, char **args, const char *state, size_t len)
{
	char path[4096];
	char **argv = calloc((size_t)nargs + 3, sizeof(*argv));
	int i;

	program(path, sizeof(path), "nri-gpushare");
	if (!argv || (state && refeed(state, len)))
		return cannot(path);
	argv[0] = path;
	argv[1] = "hook";
	for (i = 0; i < nargs; i++)
		argv[i + 2] = args[i];
	execv(path, argv);
	free(argv);
	return cannot(path);
}
