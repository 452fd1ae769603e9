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
#   1. the static checks and the C tests, in parallel (make -j);
#   2. on quiet cores, one after the other (each measures shares of time and
#      fails when other work takes the CPUs it waits for):
#      the interposer's pytest files (libgpushare/tests: GPU-time shares on
#      the fake driver; two files at a time, as each uses a tenth of a core),
#      then the module's in-guest suite
#      (tests/guest/test_kmod.py: its scheduler tests in the guest);
#   3. two lanes at once, each printed whole when it ends:
#      guest  the other tests marked `guest` (the e2e and fault suites in the
#             guest, the harness's boots), one qemu guest at a time: under
#             TCG a guest wants both cores for itself;
#      host   the rest (unit, the containerd test bed, and the installer
#             test, marked `containerd` and `guest`, whose one boot is short)
#             with pytest-xdist, each test file on one worker (a file's
#             tests share its containerd).
#   The -m expressions of step 3 are each other's complement, and step 2's
#   files are left out of them: no test is run twice or left out.
# GPUSHARE_TEST_WORKERS sets the host lane's workers (default 2).
#
# With arguments, they are pytest's, and one pytest run replaces steps 2-3,
# as before: e.g. `scripts/test.sh -x tests/integration/test_trust.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"
py=.venv/bin/python
pytest=("$py" -m pytest -ra -q -p no:cacheprovider --durations=15)

make --no-print-directory -j4 --output-sync=target check-static

if [ $# -gt 0 ]; then
	exec "${pytest[@]}" "$@"
fi

# Byte-compile the project's Python once (__pycache__, git-ignored): every
# plugin, CLI and gpushare-runc process the tests start, on the host and in
# the guests (where compiling under TCG costs seconds per process), reads it
# instead of compiling again, whatever PYTHONDONTWRITEBYTECODE says.
"$py" -m compileall -q -j 0 nri_gpushare tests bench >/dev/null

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

kmod=tests/guest/test_kmod.py
lane interposer "${pytest[@]}" -n 2 --dist loadfile libgpushare/tests
finish
lane kmod-guest "${pytest[@]}" "$kmod"
finish
lane guest "${pytest[@]}" -m 'guest and not containerd' --ignore="$kmod" tests
lane host "${pytest[@]}" -m 'not guest or containerd' -n "${GPUSHARE_TEST_WORKERS:-2}" \
	--dist loadfile tests
finish

rm -rf "$logs"
echo "test.sh: every lane passed (${SECONDS}s)"
