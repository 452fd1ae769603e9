"""The native scanner against the Python reader on hostile input: random and
mutated containers, pods and whole Synchronize requests (see test_sync_scan
for the comparisons themselves).  A view the scanner reads must read the
same the Python way; one it leaves must be malformed (or hold more than one
`linux`); a request gathers the same infos and logs the same errors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import DecodeError
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS
from tests.unit.test_fuzz_common import fuzz
from tests.unit.test_sync_scan import bench, both_ways, built, check_views, native_on

__all__ = ["built", "native_on"]  # the fixtures, autouse here too

_S = F.SynchronizeRequest
STOPPED = nri.ContainerState.CONTAINER_STOPPED.value


def _container(asking: bool) -> bytes:
    return bytes(
        nri.Container(
            id="c1",
            pod_sandbox_id="p1",
            name="web",
            state=nri.ContainerState.CONTAINER_RUNNING,
            labels={"app": "web"},
            annotations={"gpushare.io/gpu-memory": "1Gi"} if asking else {"a": "b"},
            env=["PATH=/bin", "ALIYUN_COM_GPU_MEM_CONTAINER=2" if asking else "GPU=none"],
            linux=nri.LinuxContainer(cgroups_path="kubepods.slice:cri:c1"),
            pid=42,
        )
    )


def _pod(asking: bool) -> bytes:
    return bytes(
        nri.PodSandbox(
            id="p1",
            name="web",
            uid="u1",
            namespace="ns",
            annotations={"gpushare.io/gpu-memory": "1Gi"} if asking else {"x": "y"},
        )
    )


_BENCH = bench.node(2, 2, 1, shuffled=False)
SEEDS = [
    _container(False),
    _container(True),
    _pod(False),
    _pod(True),
    _BENCH.containers[0],
    _BENCH.pods[0],
    b"",
]
# Hostile shapes: linux twice (the last cgroups path wins, every one checked),
# a string that is not UTF-8, an overlong varint, a field of the wrong type.
LINUX = F.Container.LINUX
HOSTILE = [
    _container(False) + pb.len_field(LINUX, pb.string_field(5, "second")),
    _container(False) + pb.len_field(LINUX, b"\x28\x01"),
    _container(False) + pb.len_field(LINUX, pb.len_field(5, b"\xff")),
    _container(False) + pb.len_field(F.Container.ID, b"\xc3\x28"),
    _container(False) + pb.len_field(F.Container.NAME, b"\xed\xa0\x80"),
    _container(False) + bytes([F.Container.PID << 3]) + b"\xff" * 9 + b"\x01",
    _container(False) + bytes([F.Container.PID << 3]) + b"\xff" * 10 + b"\x01",
    _container(False) + bytes([F.Container.STATE << 3]) + b"\xfb\xff\xff\xff\x0f",
    _container(False) + pb.varint_field(F.Container.STATE, (1 << 32) + STOPPED),
    _container(False) + pb.varint_field(F.Container.PID, (1 << 40) + 7),
    _container(False) + pb.varint_field(F.Container.NAME, 3),
    _container(False) + pb.tag(99, 3),
    _container(False) + pb.tag(99, 5) + b"abcd" + pb.tag(100, 1) + b"12345678",
    _pod(False) + pb.len_field(F.PodSandbox.UID, b"\x80"),
    _pod(False) + pb.varint_field(F.PodSandbox.ID, 1),
    _pod(False) + pb.len_field(F.PodSandbox.NAME, b"last"),
]


def _mutated(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(seed)
    for where, kind, value in edits:
        at = where % (len(data) + 1)
        if kind == 0 and at < len(data):
            data[at] ^= 1 << (value % 8)
        elif kind == 1 and at < len(data):
            data[at] = value
        elif kind == 2:
            del data[at:]
        else:
            data[at:at] = bytes([value])
    return bytes(data)


EDITS = st.lists(
    st.tuples(st.integers(0, 1 << 16), st.integers(0, 3), st.integers(0, 255)), max_size=4
)


def _request(containers: list[bytes], pods: list[bytes], more: bool = False) -> bytes:
    return (
        b"".join(pb.len_field(_S.PODS, p) for p in pods)
        + b"".join(pb.len_field(_S.CONTAINERS, c) for c in containers)
        + pb.bool_field(_S.MORE, more)
    )


def test_hostile_views_are_left_to_the_views() -> None:
    payload = _request(HOSTILE, HOSTILE)  # pods read as containers too, and back
    check_views(payload)
    both_ways([payload, _request([], [_pod(True), _pod(False)])])


@fuzz(600)
@given(st.sampled_from(SEEDS + HOSTILE), EDITS, st.booleans())
def test_mutated_views(seed: bytes, edits: list[tuple[int, int, int]], as_pod: bool) -> None:
    message = _mutated(seed, edits)
    check_views(_request([], [message]) if as_pod else _request([message], []))


@fuzz(300)
@given(st.binary(max_size=200))
def test_random_views(message: bytes) -> None:
    check_views(_request([message], [message]))


@fuzz(300)
@given(st.lists(st.sampled_from(range(len(SEEDS) + len(HOSTILE))), max_size=6), EDITS)
def test_mutated_requests_gather_the_same(
    picks: list[int], edits: list[tuple[int, int, int]]
) -> None:
    """Pods and containers in any order over two requests, then bytes of the
    first request changed (a request that does not split is refused before
    either reader sees it)."""
    pool = SEEDS + HOSTILE
    first = _mutated(_request([pool[i] for i in picks], [_pod(True)], True), edits)
    second = _request([_container(True)], [_pod(False)])
    try:
        lite.decode_synchronize_request(first)
    except DecodeError:
        return
    both_ways([first, second])


_PIECES = st.sampled_from(
    [*COARSE_MARKERS, *RAW_MARKERS, b"GP", b"gpushare.io", b"ALIYUN_COM_GPU", b"G", b"/"]
)


@fuzz(400)
@given(st.lists(st.one_of(st.binary(max_size=12), _PIECES), max_size=10))
def test_markers_anywhere(pieces: list[bytes]) -> None:
    """Marker texts, whole or cut, at any place of a field nothing decodes."""
    text = b"".join(pieces)
    check_views(_request([pb.len_field(F.Container.ARGS, text) + _container(False)], []))
    check_views(_request([_container(False) + pb.len_field(F.Container.ARGS, text)], []))
