/* SPDX-License-Identifier: GPL-2.0-only WITH Linux-syscall-note */
/*
 * gpushare.ko user-space ABI: limits and the /dev/gpushare ioctls.  The
 * procfs command grammar is described in kmod/README.md; every number it
 * accepts is bounded by the limits here.  This header is shared by the
 * module and C user space, and mirrored in Python.
 */
#ifndef _UAPI_GPUSHARE_H
#define _UAPI_GPUSHARE_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define GPUSHARE_ABI_VERSION	1

#define GPUSHARE_DEV_NAME	"gpushare"	/* the misc device's name */

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

/*
 * Both structures are extensible (the convention of clone3() and
 * openat2()): fields are only ever added at the end, and user space says
 * how big its version is.  The module reads a smaller (older) structure
 * as if the missing tail were zero, and refuses a bigger one with E2BIG
 * unless the part it does not know is zero.
 */

/* One container's share of one GPU. */
struct gpushare_quota {
	__u64 memsize;		/* bytes */
	__u32 gpu;		/* GPU index */
	__u32 weight;		/* percent of the GPU's compute, 0 = none */
	__u32 highprio;		/* 0 or 1 */
	__u32 __reserved;	/* 0 */
};

#define GPUSHARE_QUOTA_SIZE_VER0 24	/* sizeof first published */

/*
 * GPUSHARE_IOC_QUERY: the registration bound to the calling process's
 * cgroup (v2), or to its nearest ancestor that has one.  ENOENT when there
 * is none.  The quotas go to a user array of quota_cap entries of
 * quota_size bytes each; count says how many the registration has, and
 * when that is more than quota_cap the first quota_cap are written and the
 * call fails with EOVERFLOW (everything else filled in), so the caller can
 * retry with a bigger array.
 */
struct gpushare_query {
	__u32 size;		/* in: sizeof(struct gpushare_query) */
	__u32 abi_version;	/* in: GPUSHARE_ABI_VERSION; out: the module's */
	__u32 flags;		/* in: 0 */
	__u32 quota_size;	/* in: sizeof(struct gpushare_quota) */
	__u64 quotas;		/* in: user pointer to struct gpushare_quota[] */
	__u32 quota_cap;	/* in: entries the array holds */
	__u32 count;		/* out: entries the registration has */
	__u64 cgroup_id;	/* out: the bound cgroup's id (inode number) */
	char id[GPUSHARE_ID_MAX + 8];	/* out: container ID, NUL-terminated */
};

#define GPUSHARE_QUERY_SIZE_VER0 112	/* sizeof first published */

/*
 * 0xE7 is free in Documentation/userspace-api/ioctl/ioctl-number.rst (as
 * of Linux 6.1 and since); we use numbers 0x00-0x0F.  The requests carry
 * no size (_IO, like VFIO's): the structure's size field says it, so a
 * request number never changes when a structure grows.
 */
#define GPUSHARE_IOC_MAGIC	0xE7
#define GPUSHARE_IOC_QUERY	_IO(GPUSHARE_IOC_MAGIC, 0x01)

#endif /* _UAPI_GPUSHARE_H */
