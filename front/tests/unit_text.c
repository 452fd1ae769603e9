// SPDX-License-Identifier: Apache-2.0
/* JSON strings out, runc's log lines, a namespace from --root, the pid file. */
#include <stdlib.h>
#include <unistd.h>

#include "buf.h"
#include "front.h"
#include "tell.h"
#include "unit.h"

static void test_json_string(void)
{
	struct buf b = { 0 };

	CHECK(!json_string(&b, "a\"b\\c\n\x01\xc3\xa9", 9));
	CHECK_STR(b.p, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");
	CHECK(json_string(&b, "\xff", 1) == -1 && json_string(&b, "a\0b", 3) == -1);
	CHECK(json_string(&b, "\xed\xa0\x80", 3) == -1);  /* a surrogate in UTF-8 */
	CHECK_STR(b.p, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");  /* nothing added */
	buf_free(&b);
}

/* What Python's json.dumps writes: ASCII only; bytes from argv that are not UTF-8 as \udcXX. */
static void test_json_ascii(void)
{
	struct buf b = { 0 };
	const char s[] = "\"\\\t\x7f\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80\xff!";

	json_ascii(&b, s, sizeof(s) - 1);
	CHECK_STR(b.p, "\"\\\"\\\\\\t\\u007f\\u00e9\\u2603\\ud83d\\ude00\\udcff!\"");
	buf_free(&b);
}

static void test_log_line(void)
{
	struct buf b = { 0 };

	log_line(&b, "gpushare: no \xc3\xa9", "error", "json", 0);
	CHECK_STR(b.p, "{\"level\": \"error\", \"msg\": \"gpushare: no \\u00e9\", "
		       "\"time\": \"1970-01-01T00:00:00Z\"}");
	buf_free(&b);
	log_line(&b, "gpushare: \"x\"", "warning", "text", 86400);
	CHECK_STR(b.p, "time=\"1970-01-02T00:00:00Z\" level=warning msg=\"gpushare: \\\"x\\\"\"");
	buf_free(&b);
}

static void test_tell_appends_to_the_log(void)
{
	char path[] = "/tmp/gs-front-log-XXXXXX", got[512];
	struct runc_log log = { path, "json" };
	int fd = mkstemp(path);
	ssize_t n;

	CHECK(fd >= 0);
	tell("one", "warning", &log, 0);
	tell("gpushare: two", "error", &log, 0);
	n = read(fd, got, sizeof(got) - 1);
	got[n > 0 ? n : 0] = '\0';
	CHECK(strstr(got, "\"msg\": \"gpushare: one\"") && strstr(got, "\"msg\": \"gpushare: two\""));
	CHECK(strstr(got, "\"level\": \"warning\"") && strchr(got, '\n') != strrchr(got, '\n'));
	close(fd);
	unlink(path);
}

static void test_namespace_from_root(void)
{
	char ns[128];

	CHECK_STR(namespace_from_root("/run/containerd/runc/default", ns, sizeof(ns)), "default");
	CHECK_STR(namespace_from_root("/var/run/docker/runtime-runc/moby/", ns, sizeof(ns)), "moby");
	CHECK_STR(namespace_from_root("/r/k8s.io/./", ns, sizeof(ns)), "k8s.io");
	CHECK_STR(namespace_from_root("/r/a..b", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root("/r/-a", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root("/r/a-", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root("", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root("/", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root(".", ns, sizeof(ns)), "");
	CHECK_STR(namespace_from_root("/r/a_b-c.d", ns, sizeof(ns)), "a_b-c.d");
	CHECK_STR(namespace_from_root("/r/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
				      ns, sizeof(ns)), "");  /* 77 characters */
}

static long pid_of(const char *text, struct buf *why)
{
	char path[] = "/tmp/gs-front-pid-XXXXXX";
	int fd = mkstemp(path);
	long pid;

	if (fd < 0 || write(fd, text, strlen(text)) < 0)
		return -2;
	close(fd);
	pid = read_pid_file(path, why);
	unlink(path);
	return pid;
}

static void test_pid_file(void)
{
	struct buf why = { 0 };

	CHECK(pid_of("4242\n", &why) == 4242 && !why.len);
	CHECK(pid_of(" +17 ", &why) == 17);
	CHECK(pid_of("0", &why) == -1 && strstr(why.p, ": 0 is not a process ID"));
	buf_free(&why);
	CHECK(pid_of("2147483648", &why) == -1 && strstr(why.p, "is not a process ID"));
	buf_free(&why);
	CHECK(pid_of("12a\n", &why) == -1 && strstr(why.p, ": b'12a\\n' is not a process ID"));
	buf_free(&why);
	CHECK(pid_of("", &why) == -1 && strstr(why.p, ": b'' is not a process ID"));
	buf_free(&why);
	CHECK(read_pid_file("/nonexistent/pid", &why) == -1);
	CHECK_STR(why.p, "/nonexistent/pid: cannot open: No such file or directory");
	buf_free(&why);
	CHECK(read_pid_file("/tmp", &why) == -1);
	CHECK_STR(why.p, "/tmp: not a regular file");
	buf_free(&why);
}

int main(void)
{
	test_json_string();
	test_json_ascii();
	test_log_line();
	test_tell_appends_to_the_log();
	test_namespace_from_root();
	test_pid_file();
	return failures != 0;
}
