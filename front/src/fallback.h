/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Python programs, the reference the front hands every case it does not
 * handle itself to: gpushare-runc (nri_gpushare.local.runc_wrapper) and
 * `nri-gpushare hook`.  They are found in $GPUSHARE_PYBIN, else in the
 * directory the front was built for (PYBIN: the venv's bin).
 */
#ifndef GS_FRONT_FALLBACK_H
#define GS_FRONT_FALLBACK_H

#include <stddef.h>

/*
 * Become the Python gpushare-runc with argv[1..]; `real` (the runc found)
 * is passed on as $GPUSHARE_RUNC so that it never finds this program.
 * Returns only on failure, saying why (exit status 127).
 */
int fallback_runc(int argc, char **argv, const char *real);

/*
 * Become `nri-gpushare hook` with args (nargs of them); when `state` is not
 * NULL its `len` bytes (what was read of stdin) are its stdin instead.
 * Returns only on failure, saying why.
 */
int fallback_hook(int nargs, char **args, const char *state, size_t len);

#endif
