#!/usr/bin/env bash
# The whole test suite: lint, kernel-module user-space checks, then pytest
# (unit tests, the real containerd test bed, and the real kernel module in a
# qemu guest).  Every prerequisite is installed by scripts/install-prereqs.sh;
# with CI=true a missing one fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"
.venv/bin/ruff check .
make -C kmod check
exec .venv/bin/python -m pytest -ra -q "$@"
