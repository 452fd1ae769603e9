# The two commands of the README:
#   make demo   a private containerd, the plugin on a simulated GPU inventory,
#               and a pod that gets a GPU share
#   make test   the whole test suite (unit, real containerd, real kernel in qemu)
PYTHON := .venv/bin/python

.PHONY: demo test prereqs kmod lint bench report install-node

prereqs:
	bash scripts/install-prereqs.sh

kmod: prereqs
	$(MAKE) -C kmod

demo: prereqs
	$(PYTHON) scripts/demo.py

lint: prereqs
	.venv/bin/ruff check .

test: prereqs
	bash scripts/test.sh

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
