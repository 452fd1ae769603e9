/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gpushare core: quota arithmetic (gs_core.c), inst_ctl command parsing
 * (gs_grammar.c) and the upgrade state's grammar (gs_state.c).  Needs no
 * kernel service, so the same files are also linked into a user-space
 * unit-test binary (see tests/ushim.h).
 */
#ifndef _GS_CORE_H
#define _GS_CORE_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/limits.h>
#include <linux/string.h>
#include <linux/types.h>
#else
#include "ushim.h"
#endif

#include <gpushare.h>

/*
 * Accounting of one GPU.  Always used_mem + orphaned_mem <= total_mem:
 * free memory is what neither a container's memsize nor a deleted
 * container's still-held reservations take.
 */
struct gs_acct {
	u64 total_mem;		/* declared memory, bytes */
	u64 used_mem;		/* sum of the containers' memsize */
	u64 orphaned_mem;	/* bytes still reserved by deleted containers */
	u32 used_weight;	/* sum of the containers' weight, percent */
	u32 ninst;		/* containers on this GPU */
	u32 max_inst;		/* most containers allowed */
};

struct gs_quota {
	u64 memsize;		/* 0 in an add command: default_memsize */
	u32 gpu;
	u32 weight;
	u32 highprio;
};

/*
 * The memory ledger of one container on one GPU: the bytes its open
 * /dev/gpushare files have reserved there.  While the container is
 * registered, used <= its memsize; once it is deleted (orphaned) nothing
 * more is reserved, and what is still used counts in the GPU's
 * orphaned_mem until it is released.
 */
struct gs_ledger {
	u64 used;
	bool orphaned;
};

enum gs_op {
	GS_OP_GPU,		/* gpu <index> <total-bytes> */
	GS_OP_ADD,		/* add <id> <gpu>:<mem>[:<weight>[:<highprio>]],... */
	GS_OP_DEL,		/* del <id> */
	GS_OP_BIND,		/* bind <id> <cgroup-id>|<cgroup-path> */
};

struct gs_cmd {
	enum gs_op op;
	char id[GPUSHARE_ID_MAX + 1];
	u32 gpu;		/* GS_OP_GPU */
	u64 total_mem;		/* GS_OP_GPU */
	u32 nquota;		/* GS_OP_ADD */
	struct gs_quota quota[GPUSHARE_MAX_GPUS];
	u64 cgroup_id;		/* GS_OP_BIND by id (0 unbinds) */
	char *cgroup_path;	/* GS_OP_BIND by path, points into the buffer */
};

/*
 * The files of a GPU's directory, by index; their names are in
 * gs_gpu_files[] (the only list of them), and no container may take one.
 */
enum gs_gpu_file {
	GS_GPU_FREE_WEIGHT,
	GS_GPU_MAJOR,
	GS_GPU_MAX_INST,
	GS_GPU_POLICY,
	GS_GPU_PRIO_RATIO,
	GS_GPU_TOTAL_MEMSIZE,
	GS_GPU_FREE_MEMSIZE,
	GS_GPU_NR_INST,
	GS_GPU_ORPHANED_MEMSIZE,
	GS_GPU_SLICE_US,
	GS_GPU_DRAIN_US,
	GS_GPU_FORCED_ENDS,
	GS_GPU_NFILES
};

extern const char *const gs_gpu_files[GS_GPU_NFILES];

/*
 * The upgrade state (/proc/gpushare/upgrade, see kmod/README.md): a header
 * line, then the registry as inst_ctl commands (gpu, add, bind by id) and
 * the lines below, which only that file takes.
 *
 *   gpushare-upgrade <format> <version> <module-state>
 *   set default_memsize <bytes>
 *   set <gpu> max_inst|policy|prio_ratio|slice_us|drain_us <value>
 *   gputime <id> <gpu> <ns>
 *   end
 *
 * The "end" line is the last and only there: a state written in several
 * write() calls (tail and cat write a larger file in pieces), or cut
 * short, has none in its first piece, so that piece is refused whole
 * instead of being imported as a smaller, valid state.
 */
#define GS_STATE_FORMAT		1
#define GS_STATE_MAX		(512 * 1024)	/* longest state write, bytes */
#define GS_STATE_LINES_MAX	4096		/* most lines after the header */
#define GS_VERSION_MAX		32		/* [A-Za-z0-9._+~-] */

enum gs_setting {
	GS_SET_DEFAULT_MEMSIZE,		/* module-wide */
	GS_SET_MAX_INST,		/* per GPU from here on */
	GS_SET_POLICY,
	GS_SET_PRIO_RATIO,
	GS_SET_SLICE_US,
	GS_SET_DRAIN_US,
	GS_SET_N
};

extern const char *const gs_setting_names[GS_SET_N];

enum gs_line_kind {
	GS_LINE_CMD,		/* cmd: gpu, add, or bind by cgroup id */
	GS_LINE_SET,		/* setting (cmd.gpu for a GPU's) = value */
	GS_LINE_GPUTIME,	/* cmd.id on cmd.gpu was charged value ns */
	GS_LINE_END,		/* the state's last line */
};

struct gs_state_line {
	enum gs_line_kind kind;
	struct gs_cmd cmd;
	enum gs_setting setting;
	u64 value;
};

/* The module's states around an upgrade (its header's last word). */
enum gs_upgrade_state {
	GS_UPGRADE_LIVE,	/* normal operation */
	GS_UPGRADE_EXPORTED,	/* frozen, its registrations do not pin it */
	GS_UPGRADE_IMPORTING,	/* frozen, waiting for (or taking) a state */
	GS_UPGRADE_NSTATES
};

extern const char *const gs_upgrade_states[GS_UPGRADE_NSTATES];

int gs_parse_u64(const char *s, u64 *val);
int gs_parse_value(char *buf, u64 *val);
bool gs_valid_id(const char *id);
int gs_parse_cmd(char *buf, struct gs_cmd *cmd);

bool gs_valid_version(const char *version);
int gs_parse_state_header(char *line);
int gs_parse_state_line(char *line, struct gs_state_line *l);
int gs_check_state(struct gs_state_line *lines, u32 n, u32 *bad);
int gs_check_setting(enum gs_setting setting, u64 val);

int gs_check_weight(u64 val);
int gs_check_highprio(u64 val);
int gs_check_policy(u64 val);
int gs_check_prio_ratio(u64 val);
int gs_check_slice_us(u64 val);
int gs_check_drain_us(u64 val);

void gs_acct_init(struct gs_acct *a, u64 total_mem);
u64 gs_acct_free_mem(const struct gs_acct *a);
u32 gs_acct_free_weight(const struct gs_acct *a);
int gs_acct_fits(const struct gs_acct *a, u64 mem, u32 weight);
int gs_acct_change(struct gs_acct *a, struct gs_quota *q, u64 mem, u32 weight);
int gs_acct_set_total(struct gs_acct *a, u64 total_mem);
int gs_acct_set_max_inst(struct gs_acct *a, u64 max_inst);
int gs_acct_set_memsize(struct gs_acct *a, struct gs_quota *q,
			const struct gs_ledger *l, u64 mem);

u64 gs_mem_quota(const struct gs_quota *q, const struct gs_ledger *l);
int gs_mem_reserve(const struct gs_quota *q, struct gs_ledger *l, u64 *mine,
		   u64 bytes);
int gs_mem_release(struct gs_acct *a, struct gs_ledger *l, u64 *mine,
		   u64 bytes);
void gs_mem_orphan(struct gs_acct *a, struct gs_ledger *l);

int gs_resolve_default(struct gs_quota *q, u32 n, u64 default_mem);
int gs_admit(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
	     const struct gs_quota *q, u32 n);
void gs_charge(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
	       const struct gs_quota *q, u32 n);
void gs_uncharge(struct gs_acct *const accts[GPUSHARE_MAX_GPUS],
		 const struct gs_quota *q, u32 n);

#endif /* _GS_CORE_H */
