// SPDX-License-Identifier: Apache-2.0
/* What the front reads itself: a namespace from runc's --root, the pid file (oci.py's). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "front.h"

#define MAX_NAMESPACE 76

/* containerd's namespace rule: [A-Za-z0-9]+([._-][A-Za-z0-9]+)*, at most 76 characters. */
static int is_namespace(const char *s, size_t len)
{
	size_t i;

	if (!len || len > MAX_NAMESPACE || !isalnum((unsigned char)s[0]) ||
	    !isalnum((unsigned char)s[len - 1]))
		return 0;
	for (i = 1; i < len; i++) {
		if (isalnum((unsigned char)s[i]))
			continue;
		if (!strchr("._-", s[i]) || !isalnum((unsigned char)s[i + 1]))
			return 0;
	}
	return 1;
}

const char *namespace_from_root(const char *root, char *out, size_t size)
{
	const char *end = root + strlen(root), *start;

	out[0] = '\0';
	for (;;) {
		while (end > root && end[-1] == '/')
			end--;
		start = end;
		while (start > root && start[-1] != '/')
			start--;
		if (end - start == 1 && *start == '.') {  /* "." is no component */
			end = start;
			continue;
		}
		break;
	}
	if (is_namespace(start, (size_t)(end - start)) && (size_t)(end - start) < size) {
		memcpy(out, start, (size_t)(end - start));
		out[end - start] = '\0';
	}
	return out;
}

/* Python's repr of bytes, enough for a message. */
static void bytes_repr(struct buf *b, const unsigned char *s, size_t len)
{
	size_t i;

	buf_adds(b, "b'");
	for (i = 0; i < len; i++) {
		if (s[i] == '\\' || s[i] == '\'')
			buf_addf(b, "\\%c", s[i]);
		else if (s[i] == '\n')
			buf_adds(b, "\\n");
		else if (s[i] == '\t')
			buf_adds(b, "\\t");
		else if (s[i] == '\r')
			buf_adds(b, "\\r");
		else if (s[i] < 0x20 || s[i] >= 0x7f)
			buf_addf(b, "\\x%02x", s[i]);
		else
			buf_add(b, (const char *)s + i, 1);
	}
	buf_adds(b, "'");
}

long read_pid_file(const char *path, struct buf *why)
{
	unsigned char text[65];
	struct stat st;
	ssize_t n;
	size_t a = 0, z;
	long long pid = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY), sign = 1;

	if (fd < 0) {
		buf_addf(why, "%s: cannot open: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		buf_addf(why, "%s: not a regular file", path);
		close(fd);
		return -1;
	}
	n = read(fd, text, 64);
	if (n < 0) {
		buf_addf(why, "%s: cannot read: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	close(fd);
	z = (size_t)n;
	while (a < z && isspace(text[a]))
		a++;
	while (z > a && isspace(text[z - 1]))
		z--;
	if (a < z && (text[a] == '+' || text[a] == '-'))
		sign = text[a++] == '-' ? -1 : 1;
	if (a == z)
		goto bad;
	for (; a < z; a++) {
		if (!isdigit(text[a]))
			goto bad;
		if (pid < 1LL << 40)
			pid = pid * 10 + (text[a] - '0');
	}
	pid *= sign;
	if (pid <= 0 || pid >= 1LL << 31) {
		buf_addf(why, "%s: %lld is not a process ID", path, pid);
		return -1;
	}
	return (long)pid;
bad:
	buf_addf(why, "%s: ", path);
	bytes_repr(why, text, n > 40 ? 40 : (size_t)n);
	buf_adds(why, " is not a process ID");
	return -1;
}
