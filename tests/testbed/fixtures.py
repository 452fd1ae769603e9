"""pytest fixtures for the containerd test bed (loaded by tests/conftest.py).

- containerd (module scope): a started private Containerd with NRI enabled and
  the test images imported; restarted if a test left it stopped.
- make_containerd (function scope): factory Containerd(**kwargs) for custom
  settings (NRI timeouts, log level, nri=False); all are stopped after the test.
- cri (function scope): a ready CriClient on `containerd`; every pod it
  started is stopped and removed after the test.
- dockerd (function scope): a started private Dockerd (Debian's, from the
  release of `containerd`) on it, test images loaded; stopped after the test.
- make_dockerd (function scope): factory Dockerd(containerd, **kwargs) for
  runtimes= and cdi_spec_dirs=; all are stopped after the test.

GPUSHARE_CONTAINERD selects the containerd (1.7 or 2) of every bed of the
run (tests/testbed/containerd.py).  Missing prerequisites fail the test,
unless GPUSHARE_ALLOW_SKIP=1 (and CI is not "true"), which turns them into
skips.  GPUSHARE_KEEP_TESTBED=1 keeps the
base dirs (config, log, pod logs) for inspection.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from tests import prereqs
from tests.testbed.containerd import (
    SELECT_VAR,
    Containerd,
    ContainerdError,
    containerd_version,
    missing_prerequisites,
    runc_binary,
    selected_bin_dir,
)
from tests.testbed.cri import CriClient
from tests.testbed.docker import Dockerd
from tests.testbed.docker import missing_prerequisites as missing_docker_prerequisites


def pytest_report_header() -> str:
    """Which containerd and runc this run's test beds use (GPUSHARE_CONTAINERD)."""
    try:
        bin_dir = selected_bin_dir()
        version = ".".join(map(str, containerd_version(bin_dir)))
        runc = subprocess.run([runc_binary(bin_dir), "--version"], capture_output=True, text=True)
        runc_version = runc.stdout.split("\n", 1)[0].removeprefix("runc version ")
    except (ContainerdError, OSError) as exc:
        return f"test bed ({SELECT_VAR}): unusable: {exc}"
    return f"test bed ({SELECT_VAR}): containerd {version} with runc {runc_version}, {bin_dir}"


def require_testbed() -> None:
    """Fail (or, if allowed, skip) when the test bed cannot run here."""
    missing = missing_prerequisites()
    if not missing:
        return
    prereqs.missing("containerd test bed prerequisites missing: " + "; ".join(missing))


def require_docker() -> None:
    """require_testbed(), and Docker's own binaries."""
    require_testbed()
    missing = missing_docker_prerequisites()
    if missing:
        prereqs.missing("Docker test bed prerequisites missing: " + "; ".join(missing))


def _keep() -> bool:
    return os.environ.get("GPUSHARE_KEEP_TESTBED") == "1"


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    require_testbed()
    bed = Containerd().start()
    try:
        yield bed
    finally:
        bed.stop(remove=not _keep())


@pytest.fixture
def make_containerd() -> Iterator[Callable[..., Containerd]]:
    started: list[Containerd] = []

    def make(**kwargs: object) -> Containerd:
        require_testbed()
        bed = Containerd(**kwargs)  # type: ignore[arg-type]
        started.append(bed)
        return bed.start()

    make.started = started  # type: ignore[attr-defined]
    yield make
    for bed in started:
        bed.stop(remove=not _keep())


@pytest_asyncio.fixture
async def cri(containerd: Containerd) -> AsyncIterator[CriClient]:
    if not containerd.running:
        containerd.start()
    async with containerd.cri_client() as client:
        yield client


@pytest.fixture
def make_dockerd(containerd: Containerd) -> Iterator[Callable[..., Dockerd]]:
    started: list[Dockerd] = []

    def make(**kwargs: Any) -> Dockerd:
        require_docker()
        if not containerd.running:
            containerd.start()
        bed = Dockerd(containerd, **kwargs)
        started.append(bed)
        return bed.start()

    make.started = started  # type: ignore[attr-defined]
    yield make
    for bed in started:
        bed.stop(remove=not _keep())


@pytest.fixture
def dockerd(make_dockerd: Callable[..., Dockerd]) -> Dockerd:
    return make_dockerd()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach the tail of every test-bed containerd and dockerd log to a failed
    test's report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            for bed in [value] if isinstance(value, Containerd) else getattr(value, "started", []):
                report.sections.append((f"{name} log {bed.log_path}", bed.log_tail(60)))
