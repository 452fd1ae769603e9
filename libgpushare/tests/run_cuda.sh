#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# Runs tests/test_cuda.c's scenarios in every lookup mode under the
# interposer, then proves the suite notices a build whose dlsym and
# cuGetProcAddress are not wrapped.  BUILD: the build directory.
# The VAR=value lists ($QUOTA, $MODULE) are split into words on purpose:
# shellcheck disable=SC2086
set -u
B=$(cd "${BUILD:-build}" && pwd) || exit 1
T=$B/tests/test_cuda
LIB=$B/libgpushare.so
NOLOOKUP=$B/libgpushare-nolookup.so
MiB=1048576
# The fake's device i has UUID GPU-face0000-0000-0000-0000-0000000000ii.
UUID0=GPU-face0000-0000-0000-0000-000000000000
UUID1=GPU-FACE0000-0000-0000-0000-000000000001	# any case matches
export LD_LIBRARY_PATH=$B/fake FAKECUDA_DEVICES=2 FAKECUDA_MEMORY=$((8192 * MiB))
unset GPUSHARE_GPU_UUIDS GPUSHARE_MEMORY_LIMIT GPUSHARE_ISOLATION GPUSHARE_ALLOW_MANAGED \
	GPUSHARE_CORE_LIMIT GPUSHARE_DEBUG FAKECUDA_GPU_STATE FAKECUDA_NS_PER_BLOCK

fail=0
run() {	# run LIB MODE SCENARIO [VAR=value ...]
	lib=$1 mode=$2 scenario=$3
	shift 3
	env "$@" LD_PRELOAD="$lib" "$T" "$mode" "$scenario"
}
# Device 1 is listed first: the quota follows the UUID, not the ordinal.
QUOTA="GPUSHARE_GPU_UUIDS=$UUID1,$UUID0 GPUSHARE_MEMORY_LIMIT=$((1024 * MiB)),$((512 * MiB)) GPUSHARE_ISOLATION=full"

for mode in direct dlsym proc proc_ptds proc_v1; do
	run "$LIB" $mode quota $QUOTA || fail=1
	run "$LIB" $mode managed $QUOTA GPUSHARE_ALLOW_MANAGED=1 || fail=1
	run "$LIB" $mode ordinal GPUSHARE_MEMORY_LIMIT=$((512 * MiB)),$((1024 * MiB)) || fail=1
	run "$LIB" $mode off $QUOTA GPUSHARE_ISOLATION=none || fail=1
	run "$LIB" $mode off || fail=1		# nothing set
done
run "$LIB" direct fork $QUOTA || fail=1
run "$LIB" proc fork $QUOTA || fail=1

# Module mode through /dev/gpushare's stand-in: the registration's quotas
# (module GPU 5 for device 1, 3 for device 0, in UUID order) win over the
# environment's, and the ledger is shared by the processes.
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
GSDEV="$B/fake/fake_gsdev.so $LIB"
MODULE="FAKEGS_QUOTAS=5:$((1024 * MiB)),3:$((512 * MiB)) GPUSHARE_GPU_UUIDS=$UUID1,$UUID0 GPUSHARE_MEMORY_LIMIT=99999999999,99999999999"
n=0
for mode in direct proc_ptds; do
	for scenario in quota modfork; do
		n=$((n + 1))
			run "$GSDEV" $mode $scenario $MODULE FAKEGS_STATE="$TMP/state$n" || fail=1
	done
done
if run "$GSDEV" direct off $MODULE FAKEGS_STATE="$TMP/off" GPUSHARE_DEBUG=1 2>&1 |
	grep -q "ledger module, quotas \[1073741824,536870912\]"; then
	echo "module mode: chosen, with the module's quotas"
else
	echo "FAIL: module mode not chosen"
	fail=1
fi

# A process of the container rewrites the environment for its children:
# with a registration, neither isolation none nor a malformed (or huge)
# GPUSHARE_MEMORY_LIMIT takes the module's quotas away.
for hostile in GPUSHARE_ISOLATION=none GPUSHARE_MEMORY_LIMIT=1,,2 GPUSHARE_MEMORY_LIMIT=-1 \
	GPUSHARE_MEMORY_LIMIT=99999999999999999999999; do
	n=$((n + 1))
	if run "$GSDEV" direct quota $MODULE "$hostile" FAKEGS_STATE="$TMP/state$n" >/dev/null; then
		echo "module mode with $hostile: the module's quotas hold"
	else
		echo "FAIL: module mode with $hostile: not the module's quotas"
		fail=1
	fi
done

# A GPU that is not the container's is not unlimited in module mode: a
# list rewritten to name another GPU, to repeat one, to another length,
# malformed, huge or unset leaves the unmatched devices with nothing (out of
# memory, one line on stderr saying why, 0 bytes shown).
OTHER=GPU-0ther000-0000-0000-0000-000000000000
MANY=$(i=0; while [ $i -lt 1000 ]; do printf '%s,' "$UUID0"; i=$((i + 1)); done)$UUID1
# (One string of the environment is at most 128 KiB at exec; unit_env.c
# parses 1 MB.)
HUGE=$(head -c 131000 /dev/zero | tr '\0' 'A')
refused() {	# refused DEVICES UUIDS [VAR=value ...]: run with the list rewritten
	devices=$1 uuids=$2
	shift 2
	n=$((n + 1))
	out=$(run "$GSDEV" direct refused $MODULE "GPUSHARE_GPU_UUIDS=$uuids" TEST_REFUSED=$devices \
		FAKEGS_STATE="$TMP/state$n" "$@" 2>&1)
	rc=$?
	lines=$(printf '%s\n' "$out" | grep -c "^gpushare: GPU memory allocation refused on CUDA device")
	want=${#devices}
	if [ $rc = 0 ] && [ "$lines" = "$want" ]; then
		echo "module mode, devices $devices not the container's (${uuids%"${uuids#????????????????????}"}...): refused"
	else
		printf '%s\n' "$out"
		echo "FAIL: module mode, devices $devices should be refused (rc $rc, $lines lines, want $want)"
		fail=1
	fi
}
refused 0 "$UUID1,$OTHER"		# device 0 replaced by another GPU
refused 0 "$UUID1,$UUID1"		# device 1 twice: device 0 unmatched
refused 1 "$UUID0,$UUID0"
refused 01 "$UUID1"			# one entry, two quotas
refused 01 "$UUID1,$UUID0,$OTHER"	# three entries, two quotas
refused 01 "$MANY"			# 1,001 entries
refused 01 "$HUGE"			# 128 KiB, malformed
refused 01 ""				# unset
refused 01 "$UUID1,,$UUID0"		# malformed
refused 01 "$MANY" GPUSHARE_ISOLATION=none GPUSHARE_MEMORY_LIMIT="$MANY"
refused "" "$UUID1,$UUID0"		# the container's own list: nothing refused
refused "" "$UUID0,$UUID1"		# permuted: each GPU charged to the other's quota
for mode in dlsym proc proc_ptds proc_v1; do
	n=$((n + 1))
	if out=$(run "$GSDEV" $mode refused $MODULE "GPUSHARE_GPU_UUIDS=$UUID1,$OTHER" \
		TEST_REFUSED=0 FAKEGS_STATE="$TMP/state$n" 2>&1); then
		echo "$mode refused: ok"
	else
		printf '%s\n' "$out"
		echo "FAIL: $mode refused"
		fail=1
	fi
done

# Standalone, a hostile environment is off (said on stderr), never larger.
for hostile in "GPUSHARE_MEMORY_LIMIT=$MANY" "GPUSHARE_GPU_UUIDS=$MANY" "GPUSHARE_GPU_UUIDS=$HUGE"; do
	if run "$LIB" direct off $QUOTA "$hostile" 2>&1 | grep -q "GPU memory is not limited"; then
		echo "standalone with a hostile ${hostile%%=*}: off, and says so"
	else
		echo "FAIL: standalone with a hostile ${hostile%%=*}"
		fail=1
	fi
done

# cuGetProcAddress asked oddly.
run "$LIB" proc lookup $QUOTA || fail=1

# Compute, standalone: every launch path is gated in every lookup mode
# (each call after 40 ms of work at 50 % waits), captured launches are not.
for mode in direct dlsym proc proc_ptds proc_v1; do
	run "$LIB" $mode launch GPUSHARE_CORE_LIMIT=50,50 || fail=1
done
# By UUID: device 0 is listed second (50 %); device 1 first, with 0 (no limit).
run "$LIB" proc_ptds launch GPUSHARE_GPU_UUIDS=$UUID1,$UUID0 GPUSHARE_CORE_LIMIT=0,50 || fail=1
# No limit, 100 %, isolation memory or none, a limit only on another GPU: no
# call waits.
for env in GPUSHARE_CORE_LIMIT= GPUSHARE_CORE_LIMIT=100,100 \
	"GPUSHARE_CORE_LIMIT=50,50 GPUSHARE_ISOLATION=memory" \
	"GPUSHARE_CORE_LIMIT=50,50 GPUSHARE_ISOLATION=none" \
	"GPUSHARE_GPU_UUIDS=$UUID1,$OTHER GPUSHARE_CORE_LIMIT=100,50"; do
	run "$LIB" direct launch $env TEST_GATED=0 >/dev/null || { echo "FAIL: gated with $env"; fail=1; }
done
echo "compute: no limit, 100 %, isolation memory/none, another GPU's limit: not gated"
# Module mode through the stand-in: fixed share 50 % on both GPUs (module GPU
# 5 is device 1, 3 is device 0); the environment neither sets nor lifts it.
printf 'policy 3 3\npolicy 5 3\n' >"$TMP/ctl"
GATE="FAKEGS_QUOTAS=5:$((1024 * MiB)):50,3:$((512 * MiB)):50 GPUSHARE_GPU_UUIDS=$UUID1,$UUID0 FAKEGS_CTL=$TMP/ctl"
for mode in direct proc_ptds; do
	n=$((n + 1))
	run "$GSDEV" $mode launch $GATE GPUSHARE_CORE_LIMIT=100,100 FAKEGS_STATE="$TMP/state$n" \
		FAKEGS_SCHED="$TMP/sched$n" || fail=1
done
n=$((n + 1))
if run "$GSDEV" direct launch $GATE GPUSHARE_DEBUG=1 FAKEGS_STATE="$TMP/state$n" \
	FAKEGS_SCHED="$TMP/sched$n" 2>&1 | grep -q "compute module, weights \[50,50\]"; then
	echo "compute: module mode said, with the registration's weights"
else
	echo "FAIL: module compute mode not said"
	fail=1
fi
# A device that is not the container's is refused (fail closed, as its
# memory is), said once per process and device (device 0: the test; device
# 1: the test), so rewriting GPUSHARE_GPU_UUIDS leaves no GPU unscheduled.
n=$((n + 1))
out=$(run "$GSDEV" direct launch_refused $GATE GPUSHARE_GPU_UUIDS=$OTHER,$OTHER \
	FAKEGS_STATE="$TMP/state$n" FAKEGS_SCHED="$TMP/sched$n" 2>&1)
if [ "$(printf '%s\n' "$out" | grep -c "launches on CUDA device 0 are refused")" = 1 ] &&
	[ "$(printf '%s\n' "$out" | grep -c "launches on CUDA device 1 are refused")" = 1 ] &&
	printf '%s\n' "$out" | grep -q "^direct launch_refused: ok"; then
	echo "compute: module mode, a GPU not the container's: launches refused, said once"
else
	printf '%s\n' "$out"
	echo "FAIL: module mode, a GPU not the container's"
	fail=1
fi
# With a registration the environment cannot turn the schedule off.
for hostile in GPUSHARE_ISOLATION=none GPUSHARE_ISOLATION=memory GPUSHARE_CORE_LIMIT=; do
	n=$((n + 1))
	run "$GSDEV" direct launch $GATE $hostile FAKEGS_STATE="$TMP/state$n" \
		FAKEGS_SCHED="$TMP/sched$n" >/dev/null || { echo "FAIL: module mode ungated by $hostile"; fail=1; }
done
echo "compute: module mode stays gated whatever GPUSHARE_ISOLATION / GPUSHARE_CORE_LIMIT say"

# The mode is said once with GPUSHARE_DEBUG; a malformed limit is said and off.
if run "$LIB" direct launch GPUSHARE_CORE_LIMIT=30,50 GPUSHARE_DEBUG=1 2>&1 |
	grep -c "compute standalone, limits \[30,50\] percent, GPUs by CUDA ordinal" | grep -qx 1; then
	echo "compute: standalone mode said, once (a forked child keeps it)"
else
	echo "FAIL: standalone compute mode not said"
	fail=1
fi
for bad in GPUSHARE_CORE_LIMIT=101 GPUSHARE_CORE_LIMIT=50,,50 "GPUSHARE_CORE_LIMIT=50,50,50 GPUSHARE_GPU_UUIDS=$UUID0,$UUID1"; do
	if run "$LIB" direct launch $bad TEST_GATED=0 2>&1 | grep -q "GPU time is not limited"; then
		echo "compute: malformed $bad: off, and says so"
	else
		echo "FAIL: compute with malformed $bad"
		fail=1
	fi
done

# The bypass: without the lookup wrappers, dlopen users escape the quota,
# and the suite must say so (direct calls are still caught).
echo "== libgpushare-nolookup.so: the lookup modes must fail"
run "$NOLOOKUP" direct quota $QUOTA || fail=1
run "$NOLOOKUP" direct launch GPUSHARE_CORE_LIMIT=50,50 >/dev/null || fail=1
for mode in dlsym proc proc_ptds proc_v1; do
	# It must run, and its quota checks must be what fails.
	if run "$NOLOOKUP" $mode quota $QUOTA 2>&1 | grep -q "^$mode quota: FAILED"; then
		echo "$mode quota: bypass caught"
	else
		echo "FAIL: $mode did not catch the missing lookup wrappers"
		fail=1
	fi
	if run "$NOLOOKUP" $mode launch GPUSHARE_CORE_LIMIT=50,50 2>&1 | grep -q "^$mode launch: FAILED"; then
		echo "$mode launch: bypass caught"
	else
		echo "FAIL: $mode launch did not catch the missing lookup wrappers"
		fail=1
	fi
done
[ $fail = 0 ] && echo "run_cuda.sh: all passed" || echo "run_cuda.sh: FAILED"
exit $fail
