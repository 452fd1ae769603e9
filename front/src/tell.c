// SPDX-License-Identifier: Apache-2.0
/* Messages on stderr and in runc's log (see tell.h). */
#include "tell.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void log_line(struct buf *out, const char *text, const char *level, const char *format,
	      time_t when)
{
	char now[32];
	struct tm tm;

	if (!gmtime_r(&when, &tm) || !strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", &tm))
		strcpy(now, "1970-01-01T00:00:00Z");
	if (format && !strcmp(format, "json")) {
		buf_adds(out, "{\"level\": ");
		json_ascii(out, level, strlen(level));
		buf_adds(out, ", \"msg\": ");
		json_ascii(out, text, strlen(text));
		buf_adds(out, ", \"time\": ");
		json_ascii(out, now, strlen(now));
		buf_adds(out, "}");
	} else {
		buf_adds(out, "time=");
		json_ascii(out, now, strlen(now));
		buf_addf(out, " level=%s msg=", level);
		json_ascii(out, text, strlen(text));
	}
}

static void write_all(int fd, const char *p, size_t len)
{
	ssize_t n;

	while (len) {
		n = write(fd, p, len);
		if (n < 0)
			return;
		p += n;
		len -= (size_t)n;
	}
}

void tell(const char *message, const char *level, const struct runc_log *log, int to_stderr)
{
	struct buf text = { 0 }, line = { 0 };
	int fd;

	if (strncmp(message, "gpushare:", 9))
		buf_adds(&text, "gpushare: ");
	buf_adds(&text, message);
	if (text.failed)
		goto done;
	if (to_stderr) {
		buf_add(&text, "\n", 1);
		write_all(STDERR_FILENO, text.p, text.len);
		text.p[--text.len] = '\0';
	}
	if (!log || !log->path || !log->path[0])
		goto done;
	log_line(&line, text.p, level, log->format, time(NULL));
	buf_add(&line, "\n", 1);
	if (line.failed)
		goto done;
	fd = open(log->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		write_all(fd, line.p, line.len);
		close(fd);
	}
done:
	buf_free(&text);
	buf_free(&line);
}
