# The two commands of the README:
#   make demo   a private containerd, the plugin on a simulated GPU inventory,
#               pods that get GPU shares, held to them on a simulated GPU
#   make test   the whole test suite (unit, real containerd, real kernel in qemu)
# and, for everyday work, the fast tier that make test includes:
#   make check  lint, types, the layering contracts, the C unit tests and the
#               Python unit tests, side by side (under 3 minutes on 2 cores)
PYTHON := .venv/bin/python
# Workers for pytest-xdist in the fast tier (pytest -n).
CHECK_WORKERS ?= 2

.PHONY: demo demo-kernel test check prereqs kmod lint bench report install-node check-static check-static-untimed \
	check-ruff check-mypy check-layers check-kmod check-interposer check-unit \
	check-shell check-checkpatch check-interposer-all check-front check-native

prereqs:
	bash scripts/install-prereqs.sh

kmod: prereqs
	$(MAKE) -C kmod

demo: prereqs
	$(PYTHON) -m scripts.demo

# The demo inside the qemu guest with gpushare.ko loaded (slow: minutes
# under TCG; not part of make test, which runs make demo's code).
demo-kernel: prereqs
	$(PYTHON) -m scripts.demo --kernel

lint: prereqs
	.venv/bin/ruff check .

test: prereqs
	bash scripts/test.sh

# The fast tier: its parts run side by side (make -j), each one's output
# printed whole when it ends.  No containerd, no qemu, no root needed.
CHECK_PARTS := check-unit check-kmod check-mypy check-ruff check-layers check-interposer check-front \
	check-native
check: prereqs
	$(MAKE) --no-print-directory -j4 --output-sync=target $(CHECK_PARTS)

check-ruff:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

check-mypy:
	.venv/bin/mypy

check-layers:
	.venv/bin/lint-imports

check-kmod:
	$(MAKE) -C kmod check

check-interposer:
	$(MAKE) -C libgpushare unit

# The compiled gpushare-runc and CDI hooks (front/): its C unit tests.
check-front:
	$(MAKE) -C front check

# make test's first step (scripts/test.sh): the static checks and the C tests.
check-static: check-static-untimed check-interposer-all

# The static checks and C tests that measure no time (scripts/test.sh runs
# them beside other work; the interposer's C tests time its gate).
check-static-untimed: check-ruff check-mypy check-layers check-kmod check-shell check-checkpatch \
	check-front check-native

# Synchronize's native scanner: its C unit tests and fuzz, plain and under ASan + UBSan.
check-native:
	$(MAKE) -C nri_gpushare/nri/wire/native check

check-shell:
	shellcheck scripts/*.sh .ci/run kmod/fetch-checkpatch.sh tests/guest/harness/init.sh \
		libgpushare/tests/run_cuda.sh

check-checkpatch:
	$(MAKE) -C kmod checkpatch

# The interposer's C unit tests and its C driver tests in every lookup mode.
check-interposer-all:
	$(MAKE) -C libgpushare check

# tests/unit, and the harness's own tests that boot nothing (tests/guest/
# test_harness.py without the guest mark), with pytest-xdist.
check-unit:
	$(PYTHON) -m pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) --dist worksteal tests/unit \
		tests/guest/test_harness.py -m 'not guest and not containerd'
	# The Synchronize suites again on the pure-Python reader (the native one's fallback).
	NRI_GPUSHARE_NATIVE=0 $(PYTHON) -m pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) \
		tests/unit/test_daemon.py tests/unit/test_unserved.py \
		tests/unit/test_resize_attack_synchronize.py

bench: prereqs
	$(PYTHON) bench/create_latency.py
	$(PYTHON) bench/handler_latency.py
	$(PYTHON) bench/synchronize.py
	$(PYTHON) bench/concurrent_pods.py
	$(PYTHON) bench/rss_cycles.py
	$(PYTHON) bench/interposer_overhead.py
	$(PYTHON) bench/interposer_compute.py
	$(PYTHON) bench/container_start.py

# Every benchmark at full size, then bench/REPORT.md and its plots (about
# tens of minutes: run it on a quiet machine).  REPORT_ARGS: e.g. --gpu-json DIR
# --notes bench/REPORT-notes.md, or --quick --out /tmp/report.
report: prereqs
	$(PYTHON) bench/report $(REPORT_ARGS)

# On a GPU node (as root): the daemon, the unit, the interposer and gpushare.ko
# through DKMS.  See docs/install.md.
install-node:
	sh scripts/install-node.sh
