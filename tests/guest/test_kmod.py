"""gpushare.ko in a real kernel: builds the module, boots Debian's 6.1 kernel
under qemu once, and runs the in-guest suite (tests/guest/kmod_guest_*.py,
with the fixtures of tests/guest/kmod_support.py) there as root.  The guest's
exit status is the verdict; the in-guest JUnit report names any failure.

With CI=true a missing prerequisite (qemu, kernel image or headers, a C
compiler) fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.guest.harness.vm import GuestError, GuestUnavailable, check_prereqs, run_in_guest
from tests.prereqs import missing

REPO = Path(__file__).resolve().parents[2]
KMOD = REPO / "kmod"
SUITE = sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "tests" / "guest").glob("kmod_guest_*.py")
)

pytestmark = pytest.mark.guest


def test_kmod_suite_in_guest(tmp_path: Path) -> None:
    try:
        kernel = check_prereqs()
    except GuestUnavailable as e:
        missing(str(e))
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("make") is None:
        missing("a C compiler and make are needed to build gpushare.ko")
    assert len(SUITE) >= 6, SUITE

    subprocess.run(
        ["make", "-C", str(KMOD), f"KDIR={kernel.build}"], check=True, stdout=subprocess.DEVNULL
    )
    query = tmp_path / "kmod_query"
    subprocess.run(
        [
            cc,
            "-Wall",
            "-Werror",
            "-O2",
            "-I",
            str(KMOD / "include" / "uapi"),
            "-o",
            str(query),
            str(REPO / "tests/guest/kmod_query.c"),
        ],
        check=True,
    )
    out = tmp_path / "out"
    junit = out / "kmod.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-p",
        "tests.guest.kmod_support",
        "-q",
        "-rfE",
        "--durations=8",
        "-W",
        "ignore::pytest.PytestConfigWarning",
        f"--junitxml={junit}",
        *SUITE,
    ]
    env = {"GPUSHARE_KO": str(KMOD / "gpushare.ko"), "GPUSHARE_KMOD_QUERY": str(query)}
    if seed := os.environ.get("GPUSHARE_RANDOM_SEED"):
        env["GPUSHARE_RANDOM_SEED"] = seed  # replays kmod_guest_random.py's run
    try:
        result = run_in_guest(cmd, cwd=REPO, env=env, timeout=300, rwdirs=[out])
    except GuestError as e:
        pytest.fail(f"{e}\n--- guest console (end) ---\n{e.console[-6000:]}")
    tail = result.console[-8000:]
    assert not result.kernel_warned, f"the guest kernel warned:\n{tail}"
    assert result.status == 0, f"in-guest suite failed (status {result.status}):\n{tail}"

    # The report must show the whole suite ran and passed.
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 30 and counts["failures"] == counts["errors"] == 0, counts
    assert counts["skipped"] == 0, counts
    print(
        f"guest: {counts['tests']} tests passed; boot {result.boot_s:.1f} s,"
        f" total {result.total_s:.1f} s"
    )
