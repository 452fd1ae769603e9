#!/usr/bin/env bash
# The whole test suite: lint (ruff check and format, mypy --strict, shellcheck,
# checkpatch), the kernel module's user-space unit tests, the CUDA interposer's
# C tests (on its fake driver), then pytest (unit tests, the interposer under
# cuda-bindings, the real containerd test bed, and the real kernel module in a
# qemu guest).  Every prerequisite is installed by scripts/install-prereqs.sh;
# with CI=true a missing one fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
shellcheck scripts/*.sh .ci/run kmod/fetch-checkpatch.sh tests/guest/harness/init.sh \
	libgpushare/tests/run_cuda.sh
make -C kmod check checkpatch
make -C libgpushare check
exec .venv/bin/python -m pytest -ra -q "$@"
