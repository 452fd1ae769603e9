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

/*
 * 1: GPUSHARE_IOC_QUERY.  2: GPUSHARE_IOC_MEM too (a version-1 module
 * answers it with ENOTTY).  3: GPUSHARE_IOC_SCHED too.  4: SCHED's EXTEND op,
 * ACQUIRE's EARLY flag and the drain_ns and forced_ends outputs (a version-3
 * module answers EXTEND and EARLY with EINVAL, and leaves the new outputs
 * as the caller set them).
 */
#define GPUSHARE_ABI_VERSION	4

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
#define GPUSHARE_SLICE_US_MIN	1000	/* a GPU's scheduling slice, us */
#define GPUSHARE_SLICE_US_MAX	1000000
#define GPUSHARE_SLICE_US_DEFAULT 10000
#define GPUSHARE_DRAIN_US_MIN	1000	/* a holder's longest drain past its slice */
#define GPUSHARE_DRAIN_US_MAX	10000000
#define GPUSHARE_DRAIN_US_DEFAULT 100000

/*
 * The structures are extensible (the convention of clone3() and
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
/*
 * GPUSHARE_IOC_MEM: the memory ledger.  A process reserves bytes on one of
 * its container's GPUs before it allocates them there, and releases them
 * after it frees them; the bytes reserved by all processes of a container
 * on a GPU never exceed its memsize there.
 *
 * A descriptor acts for the container its opener was in when it opened
 * /dev/gpushare (found as QUERY finds it), whoever calls on it later; one
 * opened by a process in no registered container gets ENOENT.  Its
 * reservations belong to the open file and are returned when the file is
 * released (the last close: exit, crash, SIGKILL), so nothing can leak.
 * A child that inherits the descriptor shares its reservations: a client
 * opens its own descriptor after fork (and with O_CLOEXEC).
 *
 * Every op fills in quota, used and mine whenever the descriptor acts for
 * a container that has a quota on that GPU, also when it fails with
 * EDQUOT, EINVAL (a release beyond what the file holds) or ENOENT (the
 * container was deleted: quota then reads 0, used and mine what is still
 * held), so INFO is the way to read them without changing anything.
 * Reserving or releasing 0 bytes changes nothing and succeeds (but on a
 * deleted container's descriptor RESERVE answers ENOENT whatever the
 * bytes, as INFO does).
 *
 * Errors: ENOENT the descriptor acts for no container, or its container
 * was deleted (see kmod/README.md: RELEASE still works then, RESERVE and
 * INFO answer ENOENT), ENXIO the container, deleted or not, has no
 * quota on that GPU (checked first),
 * EDQUOT a reservation beyond the quota (nothing is reserved), EINVAL an
 * unknown op, nonzero flags, size below GPUSHARE_MEM_SIZE_VER0, or a
 * release of more than this file holds on that GPU (nothing is released),
 * E2BIG size over a page or a bigger structure whose unknown tail is not
 * zero, EFAULT a bad pointer (nothing changed).
 */
#define GPUSHARE_MEM_INFO	0	/* change nothing */
#define GPUSHARE_MEM_RESERVE	1	/* reserve bytes, all or nothing */
#define GPUSHARE_MEM_RELEASE	2	/* give back bytes this file reserved */

struct gpushare_mem {
	__u32 size;		/* in: sizeof(struct gpushare_mem) */
	__u32 op;		/* in: GPUSHARE_MEM_* */
	__u32 gpu;		/* in: GPU index, as in the container's quota */
	__u32 flags;		/* in: 0 */
	__u64 bytes;		/* in: bytes to reserve or release */
	__u64 quota;		/* out: the container's memsize on this GPU */
	__u64 used;		/* out: bytes its processes hold there, after */
	__u64 mine;		/* out: bytes this file holds there, after */
};

#define GPUSHARE_MEM_SIZE_VER0	48	/* sizeof first published */

/*
 * GPUSHARE_IOC_SCHED: the compute scheduler (kmod/README.md, "The compute
 * scheduler").  A process asks for the GPU before it submits work there
 * (ACQUIRE), submits until the grant's end (until), then waits for its
 * work to finish and gives the GPU back (RELEASE) with the GPU time the
 * work took, measured on the GPU.  The container is charged for the time
 * it held the GPU, and for reported time beyond that; a report can never
 * make the charge smaller.  As for MEM, a descriptor acts for the
 * container its opener was in, and what it holds (a slice, its place in
 * the queue) is given up when the file is released, however the process
 * ends.
 *
 * ACQUIRE blocks (interruptibly: EINTR, then call again) until the
 * container's turn; with GPUSHARE_SCHED_NOWAIT it answers EAGAIN instead,
 * with until set to when to ask again.  A process already in its
 * container's slice renews it when the slice is over and nobody is due
 * before it (no need to wait for its work then); if somebody is, it gets
 * EAGAIN (NOWAIT) and should wait for its work, RELEASE, then ACQUIRE.
 * Under policy 5 (native) every ACQUIRE is granted at once, for a slice,
 * with flags GPUSHARE_SCHED_NATIVE: nothing needs to be measured or
 * released (ask again at until, so that a switch away from 5 bites within
 * a slice).  INFO changes nothing.  Every op fills in the outputs.
 *
 * ABI 4.  A holder's own work must end inside its own hold: past the
 * slice's end the holder stops submitting and waits for its work (the
 * drain), and its hold, charged by the module's clock, goes on until it
 * releases.  While it drains it sends EXTEND every few milliseconds: each
 * pushes the slice's forced end to a grace from now, never beyond
 * drain_ns past the slice's end; until is the forced end then (EAGAIN,
 * until 0: the process is not in its container's slice in progress, or
 * the policy is 5).  A process that stops sending
 * loses the GPU a grace after its last heartbeat.  ACQUIRE with
 * GPUSHARE_SCHED_EARLY, by a process in its container's slice before the
 * slice's end: the hold so far is charged and a new slice starts now if
 * it is still the container's turn; else EAGAIN at once (never blocks):
 * stop submitting, drain, RELEASE.  forced_ends counts the slices of the
 * GPU that ended by force (a holder that neither released nor extended).
 * used_ns reported after a slice ended by force is charged on top of the
 * hold; it can only add to the reporter's own charge.
 *
 * until is CLOCK_MONOTONIC as the caller sees it: in a time namespace
 * with a monotonic offset (a container's), the offset is added, so it
 * compares with the caller's clock_gettime(CLOCK_MONOTONIC).
 *
 * Errors: ENOENT the descriptor acts for no container, or its container
 * was deleted, ENXIO no quota on that GPU, EINVAL an unknown op or flag,
 * size below GPUSHARE_SCHED_SIZE_VER0, E2BIG as for MEM, EAGAIN (NOWAIT)
 * not now, EINTR a signal came while waiting, EFAULT a bad pointer.
 */
#define GPUSHARE_SCHED_INFO	0	/* change nothing */
#define GPUSHARE_SCHED_ACQUIRE	1	/* wait for (or renew) a slice */
#define GPUSHARE_SCHED_RELEASE	2	/* work done: leave the slice */
#define GPUSHARE_SCHED_EXTEND	3	/* draining: push the forced end (ABI 4) */

#define GPUSHARE_SCHED_NOWAIT	0x1u	/* in flags: ACQUIRE does not block */
#define GPUSHARE_SCHED_EARLY	0x2u	/* in flags: renew before the end (ABI 4) */
#define GPUSHARE_SCHED_NATIVE	0x1u	/* out flags: policy 5, no schedule */

struct gpushare_sched {
	__u32 size;		/* in: sizeof(struct gpushare_sched) */
	__u32 op;		/* in: GPUSHARE_SCHED_* */
	__u32 gpu;		/* in: GPU index, as in the container's quota */
	__u32 flags;		/* in: GPUSHARE_SCHED_NOWAIT or 0 */
	__u64 used_ns;		/* in (RELEASE): GPU time since the last report */
	__u64 until;		/* out: caller's CLOCK_MONOTONIC ns, end/retry */
	__u64 slice_ns;		/* out: the GPU's slice */
	__u64 gputime_ns;	/* out: the container's charged GPU time there */
	__u32 policy;		/* out: the GPU's policy */
	__u32 weight;		/* out: the container's weight there */
	__u32 highprio;		/* out */
	__u32 out_flags;	/* out: GPUSHARE_SCHED_NATIVE */
	__u64 drain_ns;		/* out (ABI 4): the GPU's longest drain */
	__u64 forced_ends;	/* out (ABI 4): the GPU's slices ended by force */
};

#define GPUSHARE_SCHED_SIZE_VER0 64	/* sizeof first published */
#define GPUSHARE_SCHED_SIZE_VER1 80	/* ABI 4: drain_ns, forced_ends */

#define GPUSHARE_IOC_MAGIC	0xE7
#define GPUSHARE_IOC_QUERY	_IO(GPUSHARE_IOC_MAGIC, 0x01)
#define GPUSHARE_IOC_MEM	_IO(GPUSHARE_IOC_MAGIC, 0x02)
#define GPUSHARE_IOC_SCHED	_IO(GPUSHARE_IOC_MAGIC, 0x03)

#endif /* _UAPI_GPUSHARE_H */
