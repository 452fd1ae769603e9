"""The collector paused while a Synchronize is handled (`stub.gc_pause`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.stub import gc_pause
from nri_gpushare.nri.stub.plugin import Plugin
from nri_gpushare.nri.stub.service import PluginService
from tests.unit.test_stub_service import CTR, LEGACY, POD, handle


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    assert gc_pause._depth == 0
    if was:
        gc.enable()
    else:
        gc.disable()


def test_overlapping_pauses_resume_the_collector_when_the_last_one_ends() -> None:
    gc.enable()
    first, second = gc_pause.collection_paused(), gc_pause.collection_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)  # not nested: the first to start ends first
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with gc_pause.collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_collector_resumes_when_the_handler_raises() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), gc_pause.collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


async def test_synchronize_is_handled_with_the_collector_paused() -> None:
    seen: list[bool] = []

    class Recording(Plugin):
        async def stop_container(self, pod: Any, container: Any) -> Any:
            return []

        def synchronize_part(self, pods: Any, containers: Any) -> bool:
            seen.append(gc.isenabled())
            return True

        async def synchronize(self, pods: Any, containers: Any) -> Any:
            seen.append(gc.isenabled())
            return []

    gc.enable()
    service = PluginService(Recording())
    await handle(service, "Configure", LEGACY)
    first = nri.SynchronizeRequest(pods=[POD], containers=[CTR], more=True)
    assert await handle(service, "Synchronize", first) == lite.encode_synchronize_response(
        more=True
    )
    assert gc.isenabled()  # between the requests
    await handle(service, "Synchronize", nri.SynchronizeRequest())
    assert seen == [False, False] and gc.isenabled()
