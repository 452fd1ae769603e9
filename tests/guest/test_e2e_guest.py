"""The acceptance test: kubelet-like CRI calls on a real containerd 1.7 (CRI +
NRI), the real plugin (`nri-gpushare run`, kmod: required) and the real
gpushare.ko, in a real Debian kernel under qemu: bookworm's 6.1, or
$GPUSHARE_GUEST_KERNEL's (e.g. 6.12 from scripts/kernel-roots.sh trixie,
whose root builds the module).

Builds the module (from a copy of kmod/, so a parallel build elsewhere cannot
interfere) and a static kmod_query (run inside a container), boots the guest
once with the module loaded, and runs tests/guest/e2e_guest_*.py there (see
e2e_guest_nri.py for what is checked).  The guest's exit status and its JUnit
report are the verdict.  With CI=true a missing prerequisite fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.guest.harness import (
    build_kmod_query,
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

SUITE = guest_suite("e2e_guest_")

pytestmark = pytest.mark.guest

ROOT = Path(__file__).resolve().parents[2]


def build_cuda_side(build: Path) -> tuple[Path, Path, Path]:
    """libgpushare.so, the fake CUDA driver's directory and cuda_probe (a
    dynamically linked CUDA client, run in a pod)."""
    make = ["make", "-s", "-C", str(ROOT / "libgpushare"), f"BUILD={build}"]
    subprocess.run([*make, "all", "fake"], check=True)
    probe = build / "cuda_probe"
    source = ROOT / "tests" / "guest" / "cuda_probe.c"
    subprocess.run([c_compiler(), "-O2", "-Wall", "-Werror", "-o", probe, source], check=True)
    return build / "libgpushare.so", build / "fake", probe


def test_containerd_plugin_and_module_end_to_end_in_guest(tmp_path: Path) -> None:
    kernel = require_guest()
    c_compiler()
    if absent := missing_prerequisites():
        missing("containerd test bed: " + "; ".join(absent))
    assert SUITE, "no tests/guest/e2e_guest_*.py"

    src = kmod_source()
    ko = build_module(src, tmp_path / "kmod", kernel)
    query = build_kmod_query(tmp_path / "kmod_query", kmod=src, static=True)
    interposer, fake_driver, probe = build_cuda_side(tmp_path / "cuda")
    build_images()  # cached on the host: the guest's writes are thrown away

    run_guest_suite(
        SUITE,
        junit=tmp_path / "out" / "e2e.xml",
        plugins=["pytest_asyncio.plugin", "tests.guest.e2e_support"],
        min_tests=5,
        env={
            "GPUSHARE_E2E_QUERY": str(query),
            "GPUSHARE_E2E_INTERPOSER": str(interposer),
            "GPUSHARE_E2E_FAKE_DRIVER": str(fake_driver),
            "GPUSHARE_E2E_CUDA_PROBE": str(probe),
        },
        timeout=480,
        modules=[ko],
        memory_mb=1536,
        durations=10,
        console_tail=12000,
    )
