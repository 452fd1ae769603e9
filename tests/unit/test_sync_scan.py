"""Synchronize's native scanner (libnriscan.so, `api.sync_scan`) against the
Python reader it stands in for (issue 30): per view, a head only where the
view reads cleanly, and then the view's own values; per request, the same
`ContainerInfo`s, pods and logged errors from `SyncState` either way, for
the bench's node, the recorded samples and mutated or hostile requests.
Without the library (or NRI_GPUSHARE_NATIVE=0) everything is read the
Python way, said once at info."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.daemon import sync_gather
from nri_gpushare.daemon.nri_views import may_ask
from nri_gpushare.daemon.sync_gather import SyncState
from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import lite, nri, sync_scan
from nri_gpushare.nri.wire import native, pb
from nri_gpushare.nri.wire.errors import DecodeError
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS
from tests.prereqs import missing

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(ROOT / "bench"))
import synchronize as bench  # noqa: E402
from nri_runtime import synchronize_payload  # noqa: E402

STOPPED = nri.ContainerState.CONTAINER_STOPPED


def _use(on: bool) -> None:
    """Read the native way (on) or the Python way from the next call."""
    if on:
        os.environ.pop(native.ENV, None)
    else:
        os.environ[native.ENV] = "0"
    native.library.cache_clear()
    sync_scan._scanner.cache_clear()


@pytest.fixture(scope="module", autouse=True)
def built() -> Iterator[None]:
    """libnriscan.so, (re)built here if make has not: without make and a C
    compiler it is a missing prerequisite (`tests.prereqs.missing`)."""
    if not (shutil.which("make") and shutil.which(os.environ.get("CC", "cc"))):
        missing("no make or C compiler: libnriscan.so cannot be built")
    made = subprocess.run(
        ["make", "-s", "-C", str(native.PATH.parent), native.PATH.name],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    saved = os.environ.get(native.ENV)
    yield
    if saved is not None:
        os.environ[native.ENV] = saved
    _use(saved != "0")


@pytest.fixture(autouse=True)
def native_on() -> Iterator[None]:
    _use(True)
    yield
    _use(True)


# -- loading -----------------------------------------------------------------


def test_the_library_loads_and_scans() -> None:
    assert native.library() is not None
    view = lite.decode_container(bytes(nri.Container(id="c", pod_sandbox_id="p", pid=7)))
    assert sync_scan.scan_containers([view], COARSE_MARKERS, RAW_MARKERS) == [
        sync_scan.ContainerHead("c", "p", "", "", 7, True, False)
    ]


def test_without_the_library_everything_is_read_in_python_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "PATH", native.PATH.with_name("libnriscan-missing.so"))
    _use(True)
    caplog.set_level(logging.INFO, logger=native.__name__)
    view = lite.decode_container(bytes(nri.Container(id="c")))
    for _ in range(3):
        assert sync_scan.scan_containers([view], COARSE_MARKERS, RAW_MARKERS) is None
        assert sync_scan.scan_pods([], COARSE_MARKERS, RAW_MARKERS) is None
    [record] = caplog.records
    assert record.levelno == logging.INFO and "not loaded" in record.getMessage()
    assert gathered([synchronize_payload([], [bytes(nri.Container(id="c"))], False)])[0]


def test_a_stale_build_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A library built from other sources than the loader's (its plan's
    layout may differ) is left for the Python reader."""
    monkeypatch.setattr(native, "ABI", native.ABI + 1)
    _use(True)
    caplog.set_level(logging.INFO, logger=native.__name__)
    assert native.library() is None
    assert "a stale build" in caplog.text


def test_native_off_by_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    _use(False)
    caplog.set_level(logging.INFO, logger=native.__name__)
    assert native.library() is None and native.library() is None
    assert [r.getMessage() for r in caplog.records] == [
        "native scanner off (NRI_GPUSHARE_NATIVE=0): Synchronize is read in Python"
    ]


# -- per view: a head only where the view reads cleanly, with its values ------


def _container_read(view: lite.ContainerView) -> tuple[Any, ...] | None:
    try:
        return (
            view.id,
            view.pod_sandbox_id,
            view.name,
            view.cgroups_path,
            view.pid,
            view.state != STOPPED,
            may_ask(view),
        )
    except DecodeError:
        return None


def _pod_read(view: lite.PodSandboxView) -> tuple[Any, ...] | None:
    try:
        return (view.id, view.name, view.uid, view.namespace, may_ask(view))
    except DecodeError:
        return None


def _linux_repeated(view: lite.ContainerView) -> bool:
    spans = pb.spans(view.buf, "", start=view.start, end=view.end)
    return sum(n == F.Container.LINUX for n, *_ in spans) > 1


def check_views(payload: bytes) -> None:
    """Each view of a SynchronizeRequest: the scan's head is the view's read."""
    request = lite.decode_synchronize_request(payload)
    heads = sync_scan.scan_containers(request.containers, COARSE_MARKERS, RAW_MARKERS)
    assert heads is not None
    for view, head in zip(request.containers, heads, strict=True):
        read = _container_read(view)
        if head is not None:
            assert tuple(head) == read
        else:
            assert read is None or _linux_repeated(view)
    pod_heads = sync_scan.scan_pods(request.pods, COARSE_MARKERS, RAW_MARKERS)
    assert pod_heads is not None
    for pod, pod_head in zip(request.pods, pod_heads, strict=True):
        assert (None if pod_head is None else tuple(pod_head)) == _pod_read(pod)


# -- per request: the same infos, pods and errors either way ------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.seen.append((record.getMessage(), repr(error)))


def gathered(requests: list[bytes]) -> tuple[Any, ...]:
    """What SyncState gathers of the requests (one Synchronize), and logs."""
    records = _Records()
    sync_gather.log.addHandler(records)
    try:
        state = SyncState()
        for payload in requests:
            request = lite.decode_synchronize_request(payload)
            state.gather(request.pods, request.containers)
        live = state.finish()
    finally:
        sync_gather.log.removeHandler(records)
    return live, state.pods, state.pods_seen, state.containers_seen, records.seen


def both_ways(requests: list[bytes]) -> tuple[Any, ...]:
    _use(True)
    fast = gathered(requests)
    _use(False)
    slow = gathered(requests)
    _use(True)
    assert fast == slow
    return fast


def test_the_bench_node_is_gathered_the_same_either_way() -> None:
    node = bench.node(120, 600, 7)
    requests = [
        synchronize_payload(
            node.pods[k * 20 : (k + 1) * 20], node.containers[k * 100 : (k + 1) * 100], k < 5
        )
        for k in range(6)
    ]
    live, pods, *_ = both_ways(requests)
    assert len(live) == 600 and len(pods) == 120
    assert sum(bool(c.pod_annotations) for c in live) == node.asking
    for payload in requests:
        check_views(payload)
        request = lite.decode_synchronize_request(payload)
        heads = sync_scan.scan_containers(request.containers, COARSE_MARKERS, RAW_MARKERS)
        assert heads and all(h is not None for h in heads)  # the scanner did read them


def _samples() -> list[bytes]:
    recorded = json.loads((DATA / "nri_v0_12_2.json").read_text())["requests"]
    # Pod 1 and container 2 in any container request, as in a SynchronizeRequest.
    return [
        bytes.fromhex(recorded[name]["hex"]) for name in recorded if name != "ConfigureRequest"
    ] + [(DATA / "create_container_request.bin").read_bytes()]


@pytest.mark.parametrize("index", range(len(_samples())))
def test_the_recorded_samples_are_read_the_same_either_way(index: int) -> None:
    payload = _samples()[index]
    check_views(payload)
    both_ways([payload])
