/* SPDX-License-Identifier: Apache-2.0 */
/* The two programs of the front: gpushare-runc and the CDI hooks. */
#ifndef GS_FRONT_FRONT_H
#define GS_FRONT_FRONT_H

#include <stddef.h>

/* gpushare-runc with argv (the program, then runc's arguments); the exit status. */
int runc_main(int argc, char **argv);

/* `nri-gpushare hook ACTION [--socket PATH]` (args: what follows "hook"); the exit status. */
int hook_main(int nargs, char **args);

/* The containerd namespace a shim's runc --root ends with, or "" (oci.namespace_from_root). */
const char *namespace_from_root(const char *root, char *out, size_t size);

/* The pid in runc's --pid-file; -1 with *why saying why not (oci.read_pid_file). */
struct buf;
long read_pid_file(const char *path, struct buf *why);

#endif
