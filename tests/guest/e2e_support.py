"""pytest plugin for the in-guest end-to-end suite (tests/guest/e2e_guest_*.py):
a failed test's report gets every plugin log and the tail of containerd's log,
since the guest and its files are gone once it has run."""

from __future__ import annotations

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    if (plugins := funcargs.get("plugins")) is not None:
        for plugin in plugins.started:
            report.sections.append((f"plugin log {plugin.log_path}", plugin.log()[-5000:]))
    if (bed := funcargs.get("bed")) is not None:
        report.sections.append((f"containerd log {bed.log_path}", bed.log_tail(60)))
