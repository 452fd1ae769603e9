// SPDX-License-Identifier: Apache-2.0
/* The local API's client against a daemon whose listen backlog is full. */
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "api.h"
#include "unit.h"

/* A listening socket at path that accepts nothing; its backlog filled. */
static int busy_daemon(const char *path, int *clients, int n)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0), i;

	strcpy(addr.sun_path, path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || listen(fd, 0))
		return -1;
	for (i = 0; i < n; i++) {
		clients[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		connect(clients[i], (struct sockaddr *)&addr, sizeof(addr));
	}
	return fd;
}

/* A full backlog is a daemon that does not answer in time, not one that is not there. */
static void test_full_backlog_waits(void)
{
	char dir[] = "/tmp/gs-unit-XXXXXX", path[64];
	struct buf req = { 0 }, reply = { 0 }, why = { 0 };
	int clients[4], fd, i;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/api.sock", dir);
	fd = busy_daemon(path, clients, 4);
	CHECK(fd >= 0);
	buf_adds(&req, "{\"v\":1,\"op\":\"release\",\"namespace\":\"\",\"id\":\"c1\"}\n");
	CHECK(api_ask(path, &req, 300, &reply, &why) == API_TIMEOUT);
	CHECK(why.len == 0);
	for (i = 0; i < 4; i++)
		close(clients[i]);
	close(fd);
	unlink(path);
	rmdir(dir);
	buf_free(&req);
	buf_free(&reply);
	buf_free(&why);
}

/* No socket at all: unreachable at once, saying why. */
static void test_no_daemon(void)
{
	struct buf req = { 0 }, reply = { 0 }, why = { 0 };

	buf_adds(&req, "{}\n");
	CHECK(api_ask("/nonexistent/gs/api.sock", &req, 300, &reply, &why) == API_UNREACHABLE);
	CHECK(why.p && strstr(why.p, "No such file or directory"));
	buf_free(&req);
	buf_free(&reply);
	buf_free(&why);
}

int main(void)
{
	test_full_backlog_waits();
	test_no_daemon();
	return failures ? 1 : 0;
}
