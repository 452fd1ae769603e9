"""The fault suite in the real kernel: the plugin SIGKILLed at random points
of pod lifecycles and of container starts through gpushare-runc, a hung
gpushare.ko write (tests/guest/kprobe_hang/ holds the module's command lock)
and a SIGSTOPped plugin, with the real containerd 1.7 + plugin + gpushare.ko
in Debian's 6.1 kernel (or $GPUSHARE_GUEST_KERNEL's) under qemu
(tests/guest/fault_guest_*.py, fixtures in
tests/guest/fault_support.py).

Its own guest boot, apart from test_e2e_guest.py (whose suite ends by
unloading the module).  The seed is $GPUSHARE_FAULT_SEED, else drawn here and
printed, so a failure can be replayed.  With CI=true a missing prerequisite
fails.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.guest.harness import (
    build_module,
    c_compiler,
    guest_suite,
    kmod_source,
    require_guest,
    run_guest_suite,
)
from tests.prereqs import missing
from tests.testbed.containerd import missing_prerequisites
from tests.testbed.images import build_images

REPO = Path(__file__).resolve().parents[2]
HANG = REPO / "tests" / "guest" / "kprobe_hang"
SUITE = guest_suite("fault_guest_")
PASS_THROUGH = ("GPUSHARE_FAULT_LIFECYCLES", "GPUSHARE_FAULT_KILLS")

pytestmark = pytest.mark.guest


def test_fault_suite_in_guest(tmp_path: Path) -> None:
    kernel = require_guest()
    c_compiler()
    if absent := missing_prerequisites():
        missing("containerd test bed: " + "; ".join(absent))
    assert SUITE, "no tests/guest/fault_guest_*.py"
    seed = int(os.environ.get("GPUSHARE_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"fault suite seed: {seed} (replay: GPUSHARE_FAULT_SEED={seed})")

    ko = build_module(kmod_source(), tmp_path / "kmod", kernel)
    hang = build_module(HANG, tmp_path / "kprobe_hang", kernel)
    build_images()  # cached on the host: the guest's writes are thrown away
    out = tmp_path / "out"
    env = {
        "GPUSHARE_FAULT_SEED": str(seed),
        "GPUSHARE_FAULT_OUT": str(out),
        "GPUSHARE_HANG_KO": str(hang),
    }
    env |= {k: os.environ[k] for k in PASS_THROUGH if os.environ.get(k)}
    try:
        run_guest_suite(
            SUITE,
            junit=out / "faults.xml",
            plugins=["pytest_asyncio.plugin", "tests.guest.fault_support"],
            min_tests=4,
            env=env,
            timeout=540,
            modules=[ko],
            memory_mb=1536,
            smp=2,
            durations=10,
            console_tail=12000,
        )
    finally:
        for summary in sorted(out.glob("*.json")):
            print(f"{summary.stem}: {json.dumps(json.loads(summary.read_text()))}")
        print(f"fault suite seed: {seed}")
