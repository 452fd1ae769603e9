// SPDX-License-Identifier: Apache-2.0
/* The local API's client (see api.h). */
#include "api.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CONNECT_RETRY_MS 5

const char *api_socket(void)
{
	const char *s = getenv("GPUSHARE_API_SOCKET");

	return s && s[0] ? s : DEFAULT_SOCKET;
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for `events` on fd until `deadline`; 0 ready, -1 timed out. */
static int wait_for(int fd, short events, long long deadline)
{
	struct pollfd p = { .fd = fd, .events = events };
	long long left;
	int n;

	for (;;) {
		left = deadline - now_ms();
		if (left <= 0)
			return -1;
		n = poll(&p, 1, (int)left);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return 0;  /* the read or write says what is wrong */
	}
}

static enum api_result unreachable(struct buf *why, const char *path, int e)
{
	buf_addf(why, "cannot reach the nri-gpushare daemon at %s: %s; is it running?", path,
		 strerror(e));
	return API_UNREACHABLE;
}

enum api_result api_ask(const char *path, const struct buf *request, int timeout_ms,
			struct buf *reply, struct buf *why)
{
	long long deadline = now_ms() + timeout_ms;
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	enum api_result rc = API_BAD;
	size_t sent = 0;
	char chunk[65536];
	ssize_t n;
	int fd;

	if (strlen(path) >= sizeof(addr.sun_path))
		return unreachable(why, path, ENAMETOOLONG);
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return unreachable(why, path, errno);
	/*
	 * A unix socket's connect fails with EAGAIN, connecting nothing, while
	 * the daemon's backlog is full (its loop busy): tried again until the
	 * deadline, as the daemon is there.
	 */
	while (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		if (errno == EAGAIN) {
			if (now_ms() >= deadline) {
				rc = API_TIMEOUT;
				goto out;
			}
			poll(NULL, 0, CONNECT_RETRY_MS);
			continue;
		}
		if (errno != EINPROGRESS && errno != EINTR) {
			rc = unreachable(why, path, errno);
			goto out;
		}
		if (wait_for(fd, POLLOUT, deadline)) {
			rc = API_TIMEOUT;
			goto out;
		}
		break;
	}
	while (sent < request->len) {
		n = send(fd, request->p + sent, request->len - sent, MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (wait_for(fd, POLLOUT, deadline)) {
				rc = API_TIMEOUT;
				goto out;
			}
			continue;
		}
		if (n < 0) {
			rc = unreachable(why, path, errno);
			goto out;
		}
		sent += (size_t)n;
	}
	shutdown(fd, SHUT_WR);
	for (;;) {
		n = recv(fd, chunk, sizeof(chunk), 0);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (wait_for(fd, POLLIN, deadline)) {
				rc = API_TIMEOUT;
				goto out;
			}
			continue;
		}
		if (n < 0) {
			rc = unreachable(why, path, errno);
			goto out;
		}
		if (n == 0)
			break;
		buf_add(reply, chunk, (size_t)n);
		if (reply->failed || reply->len > MAX_MESSAGE)
			goto out;
	}
	rc = reply->len ? API_OK : API_BAD;
out:
	close(fd);
	return rc;
}

int api_call(const char *path, const struct buf *request, struct reply *r, struct buf *why,
	     enum api_result *res)
{
	struct buf data = { 0 };

	*res = request->failed ? API_BAD : api_ask(path, request, DEFAULT_TIMEOUT_MS, &data, why);
	if (*res == API_TIMEOUT)
		buf_addf(why, "the nri-gpushare daemon (%s) did not answer in %d s", path,
			 DEFAULT_TIMEOUT_MS / 1000);
	else if (*res == API_BAD && !data.len)
		buf_addf(why, "the nri-gpushare daemon (%s) closed without answering", path);
	else if (*res == API_OK && reply_parse(data.p, data.len, r)) {
		*res = API_BAD;
		buf_adds(why, "not a reply of the local API");
	} else if (*res == API_BAD)
		buf_adds(why, "reply too long");
	buf_free(&data);
	return *res == API_OK ? 0 : -1;
}
