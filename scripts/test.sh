#!/usr/bin/env bash
# The whole test suite (`make test`; .ci/run calls exactly that): lint (ruff
# check and format, mypy --strict, the layering contracts, shellcheck,
# checkpatch), the kernel module's user-space unit tests, the CUDA
# interposer's C tests (on its fake driver), then every pytest test (unit
# tests, the interposer under cuda-bindings, the real containerd test bed, and
# the real kernel module in a qemu guest).  Every prerequisite is installed by
# scripts/install-prereqs.sh; with CI=true a missing one fails the run instead
# of skipping.
#
# Where the time goes, and how it is spent side by side on two cores:
#   1. the static checks that time nothing (make -j check-static-untimed)
#      beside the kernel matrix's roots (scripts/kernel-roots.sh trixie sid:
#      6.12's and 7.2's headers, compilers and images); then the
#      interposer's C tests, which time its gate;
#   2. on quiet cores, one after the other (each measures shares of time and
#      fails when other work takes the CPUs it waits for):
#      the interposer's pytest files (libgpushare/tests: GPU-time shares on
#      the fake driver; two files at a time, as each uses a tenth of a core),
#      then `make demo`'s code (python -m scripts.demo: pods on containerd
#      1.7.24 held to a quota and to measured compute shares; it fails when
#      one does not hold), then the module's in-guest suite (tests/guest/test_kmod.py) whole on
#      6.1, and its GPU-time share files (kmod_guest_sched*, and the live
#      resize's) on 6.12, the sched* files on 7.2;
#   3. four lanes at once, each printed whole when it ends:
#      guest    the other tests marked `guest` (the e2e and fault suites in
#               the guest, the harness's boots) on 6.1;
#      kernels  the rest of the module's suite on 6.12, its binding and
#               ledger files on 7.2, the e2e guest test on 6.12;
#      host     the rest (unit, the containerd 1.7.24 test bed, and the
#               Debian 12 installer test, marked `containerd` and `guest`)
#               with pytest-xdist, each test file on one worker (a file's
#               tests share its containerd);
#      containerd2  the CRI suite's core again on containerd 2.1.9
#               (GPUSHARE_CONTAINERD=2), then the Debian 13 installer test.
#   The -m expressions of the guest and host lanes are each other's
#   complement, and step 2's files are left out of them: no test on 6.1 and
#   containerd 1.7 is run twice or left out.
# GPUSHARE_TEST_WORKERS sets the host lane's workers (default 2).
#
# With arguments, they are pytest's, and one pytest run replaces steps 2-3,
# as before: e.g. `scripts/test.sh -x tests/integration/test_trust.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"
py=.venv/bin/python
pytest=("$py" -m pytest -ra -q -p no:cacheprovider --durations=15)

if [ $# -gt 0 ]; then
	make --no-print-directory -j4 --output-sync=target check-static
	exec "${pytest[@]}" "$@"
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/gpushare-test.XXXXXX")
declare -A lane_of=()
failed=()

# lane NAME CMD...: CMD in the background, its output into $logs/NAME.log.
lane() {
	local name=$1
	shift
	echo "test.sh: lane $name: $*"
	"$@" >"$logs/$name.log" 2>&1 &
	lane_of[$!]=$name
}

# Wait for every lane; print each one's output whole as it ends.
finish() {
	local pid rc name
	while [ ${#lane_of[@]} -gt 0 ]; do
		rc=0
		wait -n -p pid "${!lane_of[@]}" || rc=$?
		name=${lane_of[$pid]}
		unset "lane_of[$pid]"
		echo "=================== lane $name (exit $rc, at ${SECONDS}s) ==================="
		cat "$logs/$name.log"
		[ "$rc" = 0 ] || failed+=("$name")
	done
	if [ ${#failed[@]} -gt 0 ]; then
		echo "test.sh: FAILED: ${failed[*]} (logs in $logs)" >&2
		exit 1
	fi
}

# Beside the static checks that measure no time: the kernel matrix's roots
# (scripts/kernel-roots.sh: network and dpkg).  The C tests of the
# interposer time its gate, and beside mmdebstrap (even niced) a gated
# launch went through early: they run once the roots are made.
for release in trixie sid; do
	lane "roots-$release" nice -n 19 scripts/kernel-roots.sh "$release"
done
make --no-print-directory -j4 --output-sync=target check-static-untimed
finish
make --no-print-directory check-interposer-all


# Byte-compile the project's Python once (__pycache__, git-ignored): every
# plugin, CLI and gpushare-runc process the tests start, on the host and in
# the guests (where compiling under TCG costs seconds per process), reads it
# instead of compiling again, whatever PYTHONDONTWRITEBYTECODE says.
"$py" -m compileall -q -j 0 nri_gpushare tests bench >/dev/null

kmod=tests/guest/test_kmod.py
# The module's in-guest files that measure GPU-time shares (kmod_guest_sched*.py,
# and kmod_guest_resize.py's live weight change): on quiet cores only.
timed='sched* resize'
untimed='!sched* !resize'
# The containerd 2.x lane's files: the CRI suite's core (see tests/README.md).
core2=()
for f in nri_plugin share_e2e trust hostile_values session_recovery reconcile \
	synchronize_large hand_started testbed_docker containerd_client dra_cri; do
	core2+=("tests/integration/test_$f.py")
done

# kmod_on KERNEL FILES [pytest args]: the module's in-guest suite on KERNEL
# (6.1 bookworm's, 6.12 trixie's, 7.2 sid's), only FILES (GPUSHARE_KMOD_FILES).
kmod_on() {
	GPUSHARE_GUEST_KERNEL=$1 GPUSHARE_KMOD_FILES=$2 "${pytest[@]}" "$kmod"
}
# e2e_on KERNEL: containerd + plugin + module in the guest on KERNEL.
e2e_on() {
	GPUSHARE_GUEST_KERNEL=$1 "${pytest[@]}" tests/guest/test_e2e_guest.py
}
# in_turn CMD... ';' CMD...: each command after the other; fails if any did.
in_turn() {
	local rc=0 cmd=()
	for word in "$@" ';'; do
		if [ "$word" = ';' ]; then
			"${cmd[@]}" || rc=1
			cmd=()
		else
			cmd+=("$word")
		fi
	done
	return $rc
}

lane interposer in_turn "${pytest[@]}" -n 2 --dist loadfile libgpushare/tests ';' "$py" -m scripts.demo
finish
# On quiet cores: the module's whole suite on 6.1, its GPU-time share files
# on 6.12 and 7.2.
lane kmod-quiet in_turn kmod_on 6.1 '' ';' kmod_on 6.12 "$timed" ';' kmod_on 7.2 'sched*'
finish
lane guest "${pytest[@]}" -m 'guest and not containerd' --ignore="$kmod" tests
lane kernels in_turn kmod_on 6.12 "$untimed" ';' kmod_on 7.2 'bindings ledger*' ';' e2e_on 6.12
trixie=tests/integration/test_install_trixie.py
bookworm=tests/integration/test_install.py
lane host "${pytest[@]}" -m 'not guest or containerd' -n "${GPUSHARE_TEST_WORKERS:-2}" \
	--dist loadfile --ignore="$trixie" --ignore="$bookworm" tests
# The 2.1.9 core ends first (by ten minutes in a trial): the Debian 13 and 12
# installers follow it here, one after the other (run at once, two installed
# nodes failed each other's checks), rather than waiting for a host worker,
# and then the Synchronize suites on the pure-Python reader (the native
# scanner's fallback; the host lane runs them on the scanner).
sync_suites=(tests/unit/test_daemon.py tests/unit/test_unserved.py
	tests/unit/test_resize_attack_synchronize.py tests/integration/test_bench_synchronize.py
	tests/integration/test_synchronize_large.py)
lane containerd2 in_turn env GPUSHARE_CONTAINERD=2 "${pytest[@]}" -n 2 --dist loadfile \
	"${core2[@]}" ';' "${pytest[@]}" "$trixie" "$bookworm" \
	';' env NRI_GPUSHARE_NATIVE=0 "${pytest[@]}" "${sync_suites[@]}"
finish

rm -rf "$logs"
echo "test.sh: every lane passed (${SECONDS}s)"
