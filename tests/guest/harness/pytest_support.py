"""pytest helpers: gate tests on the guest's prerequisites, run pytest inside the guest."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from tests.prereqs import missing

from .vm import (
    DEFAULT_TIMEOUT,
    IN_GUEST_ENV,
    REPO,
    VENV_BIN,
    GuestResult,
    GuestUnavailable,
    Kernel,
    check_prereqs,
    run_in_guest,
)


def in_guest() -> bool:
    """True when running inside the guest (run_in_guest sets GPUSHARE_IN_GUEST=1)."""
    return os.environ.get(IN_GUEST_ENV) == "1"


def require_guest() -> Kernel:
    """The kernel the guest boots; a missing prerequisite fails the calling
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
    )


def junit_counts(junit: str | os.PathLike[str]) -> dict[str, int]:
    """Totals of a pytest junit XML report: tests, failures, errors, skipped."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}
