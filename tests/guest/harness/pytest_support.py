"""pytest helpers: gate tests on the guest's prerequisites, run pytest inside the guest.

The host-side guest drivers (tests/guest/test_kmod.py, test_e2e_guest.py)
share run_guest_suite(): discover the in-guest files (guest_suite), build
gpushare.ko from a private copy of its sources (build_module; in the kernel's
own root when it has one), compile kmod_query.c (build_kmod_query), run one
pytest session in the guest with a JUnit report, and fail with the end of the
guest's console on a kernel oops, a kernel warning, a non-zero status or a
report that is short of tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import pytest

from tests.prereqs import missing

from .vm import (
    DEFAULT_TIMEOUT,
    IN_GUEST_ENV,
    REPO,
    VENV_BIN,
    GuestError,
    GuestResult,
    GuestUnavailable,
    Kernel,
    check_prereqs,
    run_in_guest,
)

GUEST_TESTS = REPO / "tests" / "guest"
KMOD = REPO / "kmod"
# Set to another copy of kmod/ (e.g. an old revision from `git archive`) to
# run the guest suites against that module instead.
KMOD_SRC_ENV = "GPUSHARE_KMOD_SRC"
# A pytest -k expression for the in-guest session: run only those tests.
SELECT_ENV = "GPUSHARE_GUEST_SELECT"
BUILD_PRODUCTS = shutil.ignore_patterns(
    "*.o", "*.ko", "*.mod", "*.mod.c", ".*", "Module.symvers", "modules.order", "build"
)


def in_guest() -> bool:
    """True when running inside the guest (run_in_guest sets GPUSHARE_IN_GUEST=1)."""
    return os.environ.get(IN_GUEST_ENV) == "1"


def require_guest() -> Kernel:
    """The kernel the guest boots ($GPUSHARE_GUEST_KERNEL, see find_kernel);
    a missing prerequisite, that kernel's root included, fails the calling
    test (tests/prereqs.py: GPUSHARE_ALLOW_SKIP=1 skips it, never under CI)."""
    try:
        return check_prereqs()
    except GuestUnavailable as e:
        missing(str(e))


def pytest_in_guest(
    args: Sequence[str],
    *,
    junit: str | os.PathLike[str],
    cwd: str | os.PathLike[str] = REPO,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    modules: Iterable[str | os.PathLike[str]] = (),
    rwdirs: Iterable[str | os.PathLike[str]] = (),
    plugins: Sequence[str] = (),
    echo: TextIO | None = None,
    memory_mb: int = 1024,
    smp: int = 1,
    kernel_args: Sequence[str] = (),
) -> GuestResult:
    """Run one pytest session in the guest with the project's venv python.

    Writes a junit XML report to junit (its directory is shared writable);
    status is pytest's exit code.  Plugins are not autoloaded in the guest:
    name the ones needed (e.g. "pytest_asyncio").  Boots cost seconds under
    TCG, so put all guest tests in one session rather than one per test.
    """
    junit = Path(junit).resolve()
    argv = [str(VENV_BIN / "python"), "-m", "pytest", "-p", "no:cacheprovider"]
    for plugin in plugins:
        argv += ["-p", plugin]
    argv += [f"--junitxml={junit}", *args]
    return run_in_guest(
        argv,
        cwd=cwd,
        env=env,
        timeout=timeout,
        modules=modules,
        rwdirs=[junit.parent, *rwdirs],
        echo=echo,
        memory_mb=memory_mb,
        smp=smp,
        kernel_args=kernel_args,
    )


def junit_counts(junit: str | os.PathLike[str]) -> dict[str, int]:
    """Totals of a pytest junit XML report: tests, failures, errors, skipped."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}


def guest_suite(prefix: str) -> list[str]:
    """The in-guest test files tests/guest/<prefix>*.py, repo-relative and sorted."""
    return sorted(p.relative_to(REPO).as_posix() for p in GUEST_TESTS.glob(f"{prefix}*.py"))


def c_compiler() -> str:
    """cc (or gcc); with make, what building a module needs.  Missing: fails the test."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("make") is None:
        missing("a C compiler and make are needed to build kernel modules")
    assert cc is not None
    return cc


def kmod_source() -> Path:
    """The gpushare.ko sources to test: kmod/, or $GPUSHARE_KMOD_SRC."""
    src = Path(os.environ.get(KMOD_SRC_ENV) or KMOD)
    if not (src / "Kbuild").is_file():
        raise FileNotFoundError(f"{src}: no Kbuild ({KMOD_SRC_ENV} must name a kmod/ tree)")
    return src


def build_module(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    kernel: Kernel,
    make_args: Sequence[str] = (),
) -> Path:
    """Copy the Kbuild tree src to dest and build its one module against
    kernel's headers there, so a parallel build of src cannot interfere.

    A kernel with a root of its own release (Kernel.root) is built for
    inside it: the tree is copied to a directory under the root's /tmp, make
    runs under chroot (with a private /proc, which objtool reads) and the .ko
    comes back to dest.  make_args: e.g. GPUSHARE_VERSION=... for kmod/.
    """
    dest = Path(dest)
    shutil.copytree(src, dest, ignore=BUILD_PRODUCTS)
    if kernel.root is None:
        _make_module(dest, kernel, make_args, [])
    else:
        root = kernel.root
        with tempfile.TemporaryDirectory(prefix="gpushare-kbuild-", dir=root / "tmp") as tmp:
            tree = Path(tmp) / dest.name
            shutil.copytree(dest, tree)
            chroot = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc"]
            chroot += ["chroot", str(root)]
            _make_module(Path("/", tree.relative_to(root)), kernel, make_args, chroot)
            for ko in tree.glob("*.ko"):
                shutil.copy2(ko, dest)
    kos = sorted(dest.glob("*.ko"))
    assert len(kos) == 1, f"{src}: expected one module, built {kos}"
    return kos[0]


def _make_module(
    tree: Path, kernel: Kernel, make_args: Sequence[str], prefix: Sequence[str]
) -> None:
    """make the module in tree (a path as the build sees it) against kernel.build."""
    make = ["make", f"-j{os.cpu_count() or 1}"]
    make += (
        ["-C", str(tree), f"KDIR={kernel.build}", *make_args]  # the tree's own Makefile
        if kernel.host_path(tree).joinpath("Makefile").is_file()
        else ["-C", str(kernel.build), f"M={tree}", *make_args, "modules"]
    )
    subprocess.run([*prefix, *make], check=True, stdout=subprocess.DEVNULL)


def build_kmod_query(
    dest: str | os.PathLike[str], *, kmod: str | os.PathLike[str] = KMOD, static: bool = False
) -> Path:
    """tests/guest/kmod_query.c compiled against kmod's uapi header."""
    dest = Path(dest)
    subprocess.run(
        [
            c_compiler(),
            *(["-static"] if static else []),
            "-Wall",
            "-Werror",
            "-O2",
            "-I",
            str(Path(kmod) / "include" / "uapi"),
            "-o",
            str(dest),
            str(GUEST_TESTS / "kmod_query.c"),
        ],
        check=True,
    )
    return dest


def run_guest_suite(
    files: Sequence[str],
    *,
    junit: str | os.PathLike[str],
    plugins: Sequence[str],
    min_tests: int,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    modules: Iterable[str | os.PathLike[str]] = (),
    memory_mb: int = 1024,
    smp: int = 1,
    kernel_args: Sequence[str] = (),
    durations: int = 8,
    console_tail: int = 8000,
) -> tuple[GuestResult, dict[str, int]]:
    """One pytest session over files in the guest; the test fails unless it passed whole.

    A guest that crashed (a kernel oops panics it: oops=panic), timed out or
    reported no status fails the calling test with the harness's reason
    (naming the first oops line) and the end of the console; so do a kernel
    warning, a non-zero status, and a JUnit report with failures, errors,
    skips or fewer than min_tests tests.  $GPUSHARE_GUEST_SELECT, a pytest -k
    expression, runs only some tests (then one is enough).  Returns the
    result and the report's counts.
    """
    assert files, "no in-guest test files"
    select = os.environ.get(SELECT_ENV)
    args = ["--noconftest", "-q", "-rfE", f"--durations={durations}"]
    args += ["-W", "ignore::pytest.PytestConfigWarning"]
    if select:
        args += ["-k", select]
    try:
        result = pytest_in_guest(
            [*args, *files],
            junit=junit,
            env=env,
            timeout=timeout,
            modules=modules,
            plugins=plugins,
            memory_mb=memory_mb,
            smp=smp,
            kernel_args=kernel_args,
        )
    except GuestError as e:
        pytest.fail(f"{e}\n--- guest console (end) ---\n{e.console[-console_tail:]}")
    tail = result.console[-console_tail:]
    assert not result.kernel_warned, f"the guest kernel warned:\n{tail}"
    assert result.status == 0, f"in-guest suite failed (status {result.status}):\n{tail}"
    counts = junit_counts(junit)
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts
    assert counts["tests"] >= (1 if select else min_tests), counts
    print(
        f"guest: {counts['tests']} tests passed; boot {result.boot_s:.1f} s,"
        f" total {result.total_s:.1f} s"
    )
    return result, counts
