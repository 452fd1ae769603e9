/* SPDX-License-Identifier: Apache-2.0 */
/* The local API's client: one request line out, one reply back (client.py's). */
#ifndef GS_FRONT_API_H
#define GS_FRONT_API_H

#include <stddef.h>

#include "buf.h"

#define DEFAULT_SOCKET "/run/nri-gpushare/api.sock"
#define DEFAULT_TIMEOUT_MS 10000
#define MAX_MESSAGE (4 << 20)

enum api_result {
	API_OK,
	API_UNREACHABLE,	/* cannot connect (or send): *why says why, as client.py does */
	API_TIMEOUT,		/* no whole answer within the timeout */
	API_BAD,		/* closed without answering, or answered too much */
};

/* The socket: $GPUSHARE_API_SOCKET, else DEFAULT_SOCKET. */
const char *api_socket(void);

/*
 * Send `request` (one line) to `path`, shut our side, read the reply into
 * *reply until the daemon closes; within timeout_ms in all.  On
 * API_UNREACHABLE, *why holds client.py's message.
 */
enum api_result api_ask(const char *path, const struct buf *request, int timeout_ms,
			struct buf *reply, struct buf *why);



#include "reply.h"

/*
 * api_ask, then the reply read: 0, or -1 with *why saying what went wrong as
 * the Python client says it and *res how (API_BAD too for a reply that is not one).
 */
int api_call(const char *path, const struct buf *request, struct reply *r, struct buf *why,
	     enum api_result *res);
#endif
