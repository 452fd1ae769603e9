/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nriscan: the protobuf top-level scan of many messages in one buffer, for
 * Synchronize's thousands of containers (the Python reader, pb_index.index,
 * does the same one message at a time).  Nothing here knows NRI: the caller
 * passes each message type's expected wire types, the fields it wants and
 * the marker texts to look for.
 */
#ifndef NRISCAN_H
#define NRISCAN_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever a structure or function here changes: the loader refuses
 * a library built from other sources (a stale build) and reads in Python. */
#define NRISCAN_ABI 1

/* A message type: expected wire type by field number (-1 or past ntypes:
 * any valid one) and the fields whose last occurrence is reported. */
struct nriscan_msg {
	const int8_t *types;
	int32_t ntypes;
	const int32_t *want;
	int32_t nwant;
};

struct nriscan_plan {
	struct nriscan_msg top;
	/* A message field of top (0: none) whose every occurrence is checked
	 * as a sub message; sub.want is reported, last occurrence wins. */
	int32_t sub_field;
	struct nriscan_msg sub;
	/* Marker texts back to back: ncoarse coarse ones, then nraw raw ones.
	 * A message "asks" when it holds a coarse one and a raw one. */
	const uint8_t *markers;
	const int32_t *marker_len;
	int32_t ncoarse;
	int32_t nraw;
};

/* A row's status: anything but OK means "read it the slow way". */
enum {
	NRISCAN_OK = 0,
	NRISCAN_BAD_SPAN = 1,	/* the message's bounds are not in the buffer */
	NRISCAN_MALFORMED = 2,	/* the top level does not walk */
	NRISCAN_SUB_MALFORMED = 3,
	NRISCAN_SUB_REPEATED = 4,	/* more than one sub message */
};

/* A row: status, asks, then (a, b) per wanted field, top's then sub's.  A
 * length-delimited or fixed field: its payload's bounds in buf (absent: 0,
 * 0); a varint: its value (as int64) and the position after it (absent: 0,
 * -1). */
#define NRISCAN_ROW(plan) (2 + 2 * ((plan)->top.nwant + (plan)->sub.nwant))

/*
 * Scan the n messages buf[spans[2i] .. spans[2i+1]) into out (n rows of
 * NRISCAN_ROW int64s).  Returns 0, or -1 when the plan itself is unusable
 * (nothing written then).  Never reads outside buf[0 .. len).
 */
int nriscan_scan(const uint8_t *buf, int64_t len, const int64_t *spans, int64_t n,
		 const struct nriscan_plan *plan, int64_t *out);

/* NRISCAN_ABI, as this library was built. */
int nriscan_abi(void);

#endif /* NRISCAN_H */
