"""Bad input to the Kubernetes side: the kubelet's device IDs (ranges in
annotations and records, IDs sent back in Allocate), and the daemon's status
document as the device plugin reads it (over its socket: read_status; then
PluginState.update), from a daemon of another
version, a garbled or a hostile one.

Properties: parse_ids raises only BadIds and round-trips through
format_ids; id_number only BadIds; read_status returns a dict or raises
OSError/ValueError/TimeoutError (never hangs past its timeout, never reads
past its limit); update never raises for any document, never lists more IDs than
there are, and garbled allocations or policy never add a device (a
document it cannot read counts as no daemon: every device unhealthy).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.k8s.plugin import read_status
from nri_gpushare.k8s.state import PluginState
from nri_gpushare.names import RESOURCES
from nri_gpushare.share.ids import MAX_ID, BadIds, format_ids, id_number, parse_ids
from nri_gpushare.share.model import Gpu
from tests.unit.test_fuzz_common import fuzz, refused_only, text_with_odd_unicode

GiB = 1 << 30
RESERVE = 512 << 20
GPUS = [Gpu(i, f"GPU-{i}", "Sim", 16 * GiB, i) for i in range(2)]

IDS = st.one_of(
    st.lists(st.integers(0, MAX_ID + 2), max_size=8).map(lambda xs: ",".join(map(str, xs))),
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 40)).map(lambda t: f"{t[0]}-{t[1]}"),
        max_size=4,
    ).map(",".join),
    text_with_odd_unicode(30),
    st.sampled_from(["", ",", "-", "1-", "-1", "0-99999", "٣", "1,,2", "00001", "1" * 100]),
)


@fuzz(400)
@given(IDS)
def test_device_id_ranges(text: str) -> None:
    ids = refused_only(BadIds, parse_ids, text)
    if ids is not None:
        assert ids and all(0 <= i <= MAX_ID for i in ids)
        assert parse_ids(format_ids(ids)) == ids


@fuzz(200)
@given(st.one_of(text_with_odd_unicode(10), st.integers(-5, 10**6).map(str)))
def test_device_id_from_kubelet(device: str) -> None:
    n = refused_only(BadIds, id_number, device)
    assert n is None or 0 <= n <= MAX_ID


def status_doc() -> dict[str, Any]:
    return {
        "policy": {"max_inst": 16, "memory_reserve_bytes": RESERVE},
        "gpus": [
            {
                "index": g.index,
                "memory_total": g.memory_bytes,
                "memory_reserved": RESERVE,
                "memory_free": g.memory_bytes - RESERVE,
                "core_allocated": 0,
                "containers": [],
            }
            for g in GPUS
        ],
        "allocations": [
            {"container_id": "c1", "kubelet": {"gpu-memory": "0-3"}, "gpus": [{"index": 0}]}
        ],
    }


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | text_with_odd_unicode(12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(text_with_odd_unicode(8), inner, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """The status document with one value (at any depth) replaced, or any JSON."""
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON)
    doc: Any = status_doc()
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return doc
        key = draw(st.sampled_from(keys))
        if not isinstance(node[key], dict | list) or draw(st.booleans()):
            node[key] = draw(JSON)
            return doc
        node = node[key]


def capacity() -> dict[str, int]:
    """The most devices each resource may list (the status ignored)."""
    state = PluginState(GPUS, RESERVE, 16, status=lambda: {}, clock=lambda: 0.0)
    state.update(status_doc(), frozenset())
    return {short: len(state.devices[short]) for short in RESOURCES}


CAPACITY = capacity()


@fuzz(300)
@given(documents())
def test_status_document(doc: Any) -> None:
    state = PluginState(GPUS, RESERVE, 16, status=lambda: doc, clock=lambda: 0.0)
    if isinstance(doc, dict):
        state.update(doc, frozenset())
    # The document's GPUs are the daemon's word on capacity: garbled ones
    # may change it, but never past the IDs there are; with its GPUs as
    # they are, garbled allocations or policy never add a device.
    same_gpus = isinstance(doc, dict) and doc.get("gpus") == status_doc()["gpus"]
    for short in RESOURCES:
        devices = state.devices.get(short, ())
        assert len(devices) <= MAX_ID + 1, (short, len(devices))
        if same_gpus:
            assert len(devices) <= CAPACITY[short], (short, len(devices))


REPLIES = st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    documents().map(lambda d: json.dumps(d).encode()),
    st.sampled_from(
        [b"[" * 100_000, b"[" * 30_000, b"{}" * 3, b"\xff", b"1" * 5000, b'{"a": 1e999}']
    ),
)


@fuzz(60)
@given(REPLIES, st.integers(1, 3))
def test_read_status(reply: bytes, pieces: int) -> None:
    """The status socket's reply, in pieces: a dict, or a clean error."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "status.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            with conn, contextlib.suppress(BrokenPipeError, ConnectionResetError):
                # The reader hangs up at its limit.
                step = max(1, len(reply) // pieces)
                for i in range(0, len(reply), step):
                    conn.sendall(reply[i : i + step])

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            doc = read_status(path, timeout=5.0, limit=64 << 10)
        except (OSError, ValueError, RecursionError) as e:
            assert not isinstance(e, RecursionError), "nesting must be a ValueError"
            assert str(e)
            doc = None
        finally:
            thread.join(5)
            server.close()
        assert doc is None or isinstance(doc, dict)


def test_read_status_nested_too_deeply() -> None:
    """Within the size limit but nested past the recursion limit."""
    reply = b"[" * 30_000
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "status.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)

            def serve() -> None:
                conn, _ = server.accept()
                with conn:
                    conn.sendall(reply)

            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
            try:
                read_status(path, timeout=5.0)
            except ValueError as e:
                assert "nested too deeply" in str(e)
            else:
                raise AssertionError("a reply nested 30,000 deep was taken")
            thread.join(5)
