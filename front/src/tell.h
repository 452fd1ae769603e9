/* SPDX-License-Identifier: Apache-2.0 */
/* Messages: "gpushare: ..." on stderr and in runc's log, as real_runc.tell writes them. */
#ifndef GS_FRONT_TELL_H
#define GS_FRONT_TELL_H

#include <time.h>

#include "buf.h"

struct runc_log {
	const char *path;	/* NULL: runc was given no --log */
	const char *format;	/* "json" or anything else (text) */
};

/*
 * The log line (no newline) runc would write for `text` at `level` at time
 * `when`: json {"level": ..., "msg": ..., "time": ...} or text
 * time="..." level=... msg="...".
 */
void log_line(struct buf *out, const char *text, const char *level, const char *format,
	      time_t when);

/*
 * `message` ("gpushare: " put in front unless it starts so) on stderr when
 * to_stderr, and appended to the log when there is one.
 */
void tell(const char *message, const char *level, const struct runc_log *log, int to_stderr);

#endif
