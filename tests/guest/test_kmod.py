"""gpushare.ko in a real kernel: builds the module (from a copy of kmod/, or of
$GPUSHARE_KMOD_SRC), the test-only kretprobe module tests/guest/kprobe_widen/,
kmod_query and the interposer's side (libgpushare.so, the fake CUDA driver
and libgpushare/tests/compute_load, for kmod_guest_sched_interposer.py),
boots a Debian kernel under qemu once and runs the
in-guest suite (tests/guest/kmod_guest_*.py, with the fixtures of
tests/guest/kmod_support.py, whose Agent drives the memory ledger's
processes) there as root.  The guest's exit status is the
verdict; the in-guest JUnit report names any failure, and a kernel oops (the
guest panics on one) fails with the end of the console.

The guest has two CPUs (the race tests need them) and slub debugging
(`slub_debug=FZP`: a use after free reads poison and crashes at once).
$GPUSHARE_GUEST_SELECT (a pytest -k expression) runs only some in-guest
tests, $GPUSHARE_KMOD_FILES only some in-guest files (patterns for what
follows kmod_guest_: "bindings ledger* sched*", or "!sched*" for all but
those); $GPUSHARE_STRESS_S
and $GPUSHARE_RACE_S lengthen the stress tests (kmod_guest_race_*.py) for
long local runs.

The kernel is Debian bookworm's 6.1, or $GPUSHARE_GUEST_KERNEL's (e.g. 6.12
or 7.2 from scripts/kernel-roots.sh, whose root of that release builds the
kernel modules; the user-space parts are built on the host, whose file
system the guest runs on).  With CI=true a missing prerequisite (qemu,
kernel image or headers, that kernel's root, a C compiler) fails instead of
skipping.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.guest.harness import (
    Kernel,
    build_kmod_query,
    build_module,
    c_compiler,
    guest_suite,
    kmod_source,
    require_guest,
    run_guest_suite,
)

REPO = Path(__file__).resolve().parents[2]
WIDEN = REPO / "tests" / "guest" / "kprobe_widen"
SUITE = guest_suite("kmod_guest_")
FILES_ENV = "GPUSHARE_KMOD_FILES"
# Passed from the host into the guest: seeds and the stress tests' lengths.
PASS_THROUGH = ("GPUSHARE_RANDOM_SEED", "GPUSHARE_STRESS_S", "GPUSHARE_RACE_S")

pytestmark = pytest.mark.guest


def build_cuda_side(build: Path) -> Path:
    """libgpushare.so, the fake CUDA driver (fake/) and tests/compute_load,
    all under build (returned).  The guest runs the host's root file system,
    so they are dynamically linked against the libraries it sees too."""
    make = ["make", "-s", "-C", str(REPO / "libgpushare"), f"BUILD={build}"]
    subprocess.run([*make, "all", "fake", str(build / "tests" / "compute_load")], check=True)
    return build


def build_next_version(src: Path, dest: Path, kernel: Kernel) -> tuple[Path, str]:
    """The same module source built as another version (kmod_guest_upgrade.py
    replaces the suite's module by it): its .ko and version string."""
    header = (src / "gs_kmod.h").read_text()
    found = re.search(r'#define GPUSHARE_VERSION\s+"([^"]+)"', header)
    assert found, "gs_kmod.h names no GPUSHARE_VERSION"
    version = f"{found.group(1)}+next"
    return build_module(src, dest, kernel, [f"GPUSHARE_VERSION={version}"]), version


def chosen_files(patterns: str) -> list[str]:
    """The in-guest files whose names after kmod_guest_ match one of the
    space-separated patterns (all when there are none) and none of those
    written !PATTERN; a pattern that matches nothing is an error, not a
    smaller suite."""
    words = patterns.split()
    kept = [w for w in words if not w.startswith("!")]
    dropped = [w[1:] for w in words if w.startswith("!")]
    stems = {f: Path(f).stem.removeprefix("kmod_guest_") for f in SUITE}
    for pattern in kept + dropped:
        assert fnmatch.filter(stems.values(), pattern), f"${FILES_ENV}: {pattern!r} names no file"
    return [
        f
        for f, stem in stems.items()
        if (not kept or any(fnmatch.fnmatch(stem, p) for p in kept))
        and not any(fnmatch.fnmatch(stem, p) for p in dropped)
    ]


def test_kmod_suite_in_guest(tmp_path: Path) -> None:
    kernel = require_guest()
    c_compiler()
    assert len(SUITE) >= 13, SUITE
    files = chosen_files(os.environ.get(FILES_ENV, ""))

    src = kmod_source()
    ko = build_module(src, tmp_path / "kmod", kernel)
    next_ko, next_version = build_next_version(Path(src), tmp_path / "kmod-next", kernel)
    widen = build_module(WIDEN, tmp_path / "kprobe_widen", kernel)
    query = build_kmod_query(tmp_path / "kmod_query", kmod=src)
    cuda = build_cuda_side(tmp_path / "cuda")
    env = {
        "GPUSHARE_KO": str(ko),
        "GPUSHARE_KO_NEXT": str(next_ko),
        "GPUSHARE_NEXT_VERSION": next_version,
        "GPUSHARE_WIDEN_KO": str(widen),
        "GPUSHARE_KMOD_QUERY": str(query),
        "GPUSHARE_CUDA_BUILD": str(cuda),
    }
    env |= {k: os.environ[k] for k in PASS_THROUGH if os.environ.get(k)}
    stress = sum(float(os.environ.get(k) or 0) for k in PASS_THROUGH[1:])
    print(f"kernel {kernel.version}, {len(files)} of {len(SUITE)} in-guest files")
    run_guest_suite(
        files,
        junit=tmp_path / "out" / "kmod.xml",
        plugins=["tests.guest.kmod_support"],
        min_tests=60 if files == SUITE else len(files),
        env=env,
        # A hang detector, not a speed test: 6.12's 103 non-share tests took
        # 392-470 s beside make test's other lanes.
        timeout=900 + 3 * stress,
        smp=int(os.environ.get("GPUSHARE_GUEST_SMP") or 2),
        kernel_args=["slub_debug=FZP"],
    )


def test_kmod_files_patterns_keep_and_drop_in_guest_files() -> None:
    assert chosen_files("") == SUITE
    assert chosen_files("bindings ledger*") == [
        "tests/guest/kmod_guest_bindings.py",
        "tests/guest/kmod_guest_ledger.py",
        "tests/guest/kmod_guest_ledger_random.py",
    ]
    rest = chosen_files("!sched* !race_*")
    assert "tests/guest/kmod_guest_bindings.py" in rest
    assert not [f for f in rest if "_sched" in f or "_race_" in f]
    with pytest.raises(AssertionError, match="names no file"):
        chosen_files("bindings nosuch")
