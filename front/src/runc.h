/* SPDX-License-Identifier: Apache-2.0 */
/* The real runc: finding it, becoming it, running it as a child (real_runc.py's). */
#ifndef GS_FRONT_RUNC_H
#define GS_FRONT_RUNC_H

/*
 * $GPUSHARE_RUNC unless it names this program (it would exec itself for
 * ever), else the first executable `runc` on PATH that is not this program (`self`, when it has a '/', or /proc/self/exe), else /usr/sbin/runc,
 * /usr/bin/runc; NULL when none.  A static buffer.
 */
const char *find_runc(const char *self);

/* Become `real` with argv[1..] (argc entries in all); returns 127 only on failure, saying why. */
int exec_runc(const char *real, int argc, char **argv);

/*
 * Run `real` with argv[1..] as a child (stdio, environment and descriptors
 * shared; SIGTERM, SIGINT, SIGHUP and SIGQUIT passed on); its exit status,
 * 128 + N when killed by signal N, -1 (errno set) when it could not be run.
 */
int run_runc(const char *real, int argc, char **argv);

#endif
