/* SPDX-License-Identifier: GPL-2.0-only WITH Linux-syscall-note */
/*
 * gpushare.ko user-space ABI: limits, the /dev/gpushare ioctls and the
 * names user space relies on.  The procfs command grammar is described in
 * kmod/README.md; every number it accepts is bounded by the limits here.
 * This header is shared by the module, C user space and (mirrored) Python.
 */
#ifndef _UAPI_GPUSHARE_H
#define _UAPI_GPUSHARE_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define GPUSHARE_VERSION	"0.1.0"
#define GPUSHARE_ABI_VERSION	1

#define GPUSHARE_PROC_ROOT	"/proc/gpushare"
#define GPUSHARE_DEV_NAME	"gpushare"	/* /dev/gpushare */

#define GPUSHARE_MAX_GPUS	16	/* GPU indexes 0 .. GPUSHARE_MAX_GPUS - 1 */
#define GPUSHARE_ID_MAX		64	/* container ID length, [A-Za-z0-9_.-] */
#define GPUSHARE_CMD_MAX	4096	/* longest inst_ctl write, bytes */

#define GPUSHARE_WEIGHT_MAX	100	/* weight is percent of one GPU */
#define GPUSHARE_MAX_INST_MIN	1	/* containers per GPU */
#define GPUSHARE_MAX_INST_MAX	25
#define GPUSHARE_MAX_INST_DEFAULT 16
#define GPUSHARE_POLICY_MAX	5	/* policies 0 .. 5 */
#define GPUSHARE_POLICY_DEFAULT	2	/* weighted preemptive */
#define GPUSHARE_PRIO_RATIO_MIN	20
#define GPUSHARE_PRIO_RATIO_MAX	99
#define GPUSHARE_PRIO_RATIO_DEFAULT 80

/* One container's share of one GPU. */
struct gpushare_quota {
	__u64 memsize;		/* bytes */
	__u32 gpu;		/* GPU index */
	__u32 weight;		/* percent of the GPU's compute, 0 = none */
	__u32 highprio;		/* 0 or 1 */
	__u32 reserved;		/* 0 */
};

/*
 * GPUSHARE_IOC_QUERY: the registration bound to the calling process's
 * cgroup (v2), or to its nearest ancestor that has one.  ENOENT when
 * there is none.
 */
struct gpushare_query {
	__u32 abi_version;	/* out: GPUSHARE_ABI_VERSION */
	__u32 count;		/* out: entries used in quotas[] */
	__u64 cgroup_id;	/* out: the bound cgroup's id (inode number) */
	char id[GPUSHARE_ID_MAX + 8];	/* out: container ID, NUL-terminated */
	struct gpushare_quota quotas[GPUSHARE_MAX_GPUS];	/* out */
};

#define GPUSHARE_IOC_MAGIC	'G'
#define GPUSHARE_IOC_QUERY	_IOR(GPUSHARE_IOC_MAGIC, 0x01, struct gpushare_query)

#endif /* _UAPI_GPUSHARE_H */
