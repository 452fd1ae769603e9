"""The acceptance test: kubelet-like CRI calls on a real containerd 1.7 (CRI +
NRI), the real plugin (`nri-gpushare run`, kmod: required) and the real
gpushare.ko, in a real 6.1 kernel under qemu.

Builds the module (from a copy of kmod/, so a parallel build elsewhere cannot
interfere) and a static kmod_query (run inside a container), boots the guest
once with the module loaded, and runs tests/guest/e2e_guest_*.py there (see
e2e_guest_nri.py for what is checked).  The guest's exit status and its JUnit
report are the verdict.  With CI=true a missing prerequisite fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.guest.harness import GuestError, junit_counts, require_guest, run_in_guest
from tests.prereqs import missing
from tests.testbed.containerd import missing_prerequisites
from tests.testbed.images import build_images

REPO = Path(__file__).resolve().parents[2]
KMOD = REPO / "kmod"
SUITE = sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "tests" / "guest").glob("e2e_guest_*.py")
)
BUILD_PRODUCTS = shutil.ignore_patterns(
    "*.o", "*.ko", "*.mod", "*.mod.c", ".*", "Module.symvers", "modules.order", "build"
)

pytestmark = pytest.mark.guest


def test_containerd_plugin_and_module_end_to_end_in_guest(tmp_path: Path) -> None:
    kernel = require_guest()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("make") is None:
        missing("a C compiler and make are needed to build gpushare.ko")
    if absent := missing_prerequisites():
        missing("containerd test bed: " + "; ".join(absent))
    assert SUITE, "no tests/guest/e2e_guest_*.py"

    src = tmp_path / "kmod"
    shutil.copytree(KMOD, src, ignore=BUILD_PRODUCTS)
    subprocess.run(
        ["make", "-C", str(src), f"KDIR={kernel.build}"], check=True, stdout=subprocess.DEVNULL
    )
    query = tmp_path / "kmod_query"
    subprocess.run(
        [
            cc,
            "-static",
            "-Wall",
            "-Werror",
            "-O2",
            "-I",
            str(KMOD / "include" / "uapi"),
            "-o",
            str(query),
            str(REPO / "tests" / "guest" / "kmod_query.c"),
        ],
        check=True,
    )
    build_images()  # cached on the host: the guest's writes are thrown away

    out = tmp_path / "out"
    junit = out / "e2e.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-p",
        "pytest_asyncio.plugin",
        "-p",
        "tests.guest.e2e_support",
        "-q",
        "-rfE",
        "--durations=10",
        "-W",
        "ignore::pytest.PytestConfigWarning",
        f"--junitxml={junit}",
        *SUITE,
    ]
    try:
        result = run_in_guest(
            cmd,
            cwd=REPO,
            env={"GPUSHARE_E2E_QUERY": str(query)},
            timeout=480,
            rwdirs=[out],
            modules=[src / "gpushare.ko"],
            memory_mb=1536,
        )
    except GuestError as e:
        pytest.fail(f"{e}\n--- guest console (end) ---\n{e.console[-8000:]}")
    tail = result.console[-12000:]
    assert not result.kernel_warned, f"the guest kernel warned:\n{tail}"
    assert result.status == 0, f"in-guest suite failed (status {result.status}):\n{tail}"

    counts = junit_counts(junit)
    assert counts["tests"] >= 5, counts
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts
    print(
        f"guest: {counts['tests']} end-to-end tests passed; boot {result.boot_s:.1f} s,"
        f" total {result.total_s:.1f} s"
    )
