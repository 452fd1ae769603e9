#!/bin/sh
# /init of the test guest (runs under busybox in the initramfs built by vm.py).
#
# Stage 1 (in the initramfs): mounts the host's / (9p tag "hostroot",
# read-only) as the lower layer of an overlay root with a tmpfs upper, mounts
# the caller's writable 9p shares over their own paths, copies this script
# into the new root and switch_roots to it.  The overlay thus becomes the
# mount namespace's real root, so a process that joins the namespace with
# setns() (nsenter -m, runc exec, CRI ExecSync) sees it rather than the
# initramfs, as it would after a chroot.
#
# Stage 2 (this script again, as PID 1 in the new root, run by the host's
# static /bin/busybox): runs the job script the host wrote and hands the
# job's exit status back through qemu's isa-debug-exit port (0xf4).
#
# The kernel passes `gsjob=DIR` (an unknown command-line word) to us as an
# environment variable: DIR holds job.sh and mounts ("TAG PATH" lines).

export PATH=/bin
gsjob=${gsjob:-}
r=/newroot                      # the host root's overlay; / in stage 2
STAGE2=/run/gpushare-guest/init # where stage 1 puts this script in the new root
say() { echo "gpushare-guest: $*"; }

# Wait until the serial port has sent everything written to the console so
# far (tcdrain: TCSBRK with argument 1); qemu exits the moment we report.
drain() {
	busybox chroot "$r" /usr/bin/perl -e 'ioctl(STDOUT, 0x5409, 1) or die' \
		2>/dev/null || busybox sleep 1
}

# A setup failure ends the machine without a status: the host reports it.
fail() {
	say "setup failed: $*"
	drain
	busybox reboot -f
	busybox sleep 5
}

# Stage 2: run the job in the new root and report its status.
if [ "${1:-}" = stage2 ]; then
	r=/
	say "running"
	/usr/bin/env -i /bin/sh "$gsjob/job.sh" </dev/null
	rc=$?
	kill -KILL -1 2>/dev/null # whatever the job left running must not hold the console

	taint=$(busybox cat /proc/sys/kernel/tainted)
	if [ $((taint & 512)) -ne 0 ]; then
		say "kernel warning (taint $taint), kernel log follows"
		busybox dmesg | busybox tail -n 100
	fi
	busybox sync
	say "exit status $rc"
	drain
	# qemu exits with (byte << 1) | 1.  The octal escape must be in the format.
	# shellcheck disable=SC2059
	printf "\\$(printf %03o "$rc")" | busybox dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	fail "isa-debug-exit did not stop the machine"
	exit 1
fi

mnt() { mount "$@" || fail "mount $*"; }

mnt -t proc proc /proc
mnt -t sysfs sysfs /sys
mnt -t devtmpfs devtmpfs /dev

while read -r mod; do
	insmod "/lib/modules/$mod.ko" || fail "insmod $mod"
done </etc/modules

p9=trans=virtio,version=9p2000.L,msize=512000
mnt -t 9p -o "$p9,cache=loose,ro" hostroot /mnt/lower
mnt -t tmpfs -o mode=0755 tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mnt -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work \
	overlay /newroot

mnt -t proc proc $r/proc
mnt -t sysfs sysfs $r/sys
mnt -t cgroup2 cgroup2 $r/sys/fs/cgroup
mnt -t debugfs debugfs $r/sys/kernel/debug
mnt -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mnt -t devpts -o newinstance,ptmxmode=0666 devpts $r/dev/pts
mnt -t tmpfs -o mode=1777 tmpfs $r/dev/shm

[ -f "$r${gsjob:-/nonexistent}/job.sh" ] || fail "no job (gsjob=${gsjob:-})"
while read -r tag path; do
	mkdir -p "$r$path"
	mnt -t 9p -o "$p9,rw" "$tag" "$r$path"
done <"$r$gsjob/mounts"

# Stage 2 runs from the overlay's tmpfs upper layer under the host's busybox.
[ -x $r/bin/busybox ] || fail "no /bin/busybox in the host root"
mkdir -p "$r${STAGE2%/*}" || fail "mkdir ${STAGE2%/*}"
cp /init "$r$STAGE2" || fail "copy /init to $STAGE2"
# switch_root empties the initramfs but leaves its mounts behind, hidden under
# the new root: release them (the 9p lower and the tmpfs stay: overlay's).
umount /proc /sys /dev || fail "umount /proc /sys /dev"
exec switch_root $r /bin/busybox sh "$STAGE2" stage2
