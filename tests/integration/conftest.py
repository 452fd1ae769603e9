from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.plugin import PluginProcess


@pytest.fixture
def start_plugin() -> Iterator[Callable[..., PluginProcess]]:
    """start_plugin(containerd, **config) -> a running, synchronized plugin.

    Every plugin started is stopped after the test; a failed test's report gets
    each plugin's log.
    """
    workdir = Path(tempfile.mkdtemp(prefix="gs-plugin-"))  # short: unix socket paths
    started: list[PluginProcess] = []

    def start(containerd: Any, *, wait: bool = True, **settings: Any) -> PluginProcess:
        plugin = PluginProcess(containerd.nri_socket, workdir / str(len(started)), **settings)
        started.append(plugin)
        return plugin.start(wait=wait)

    start.plugins = started  # type: ignore[attr-defined]
    yield start
    for plugin in started:
        plugin.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach every plugin's log to a failed test's report."""
    outcome = yield
    report = outcome.get_result()
    start = getattr(item, "funcargs", {}).get("start_plugin")
    if report.failed and start is not None:
        for plugin in start.plugins:
            report.sections.append((f"plugin log {plugin.log_path}", plugin.log()[-6000:]))
