"""`pbi.index`, the one-loop walker the lazy views index a message with, and
`pbi.single`: hostile inputs (truncated varints, lengths past the end, nested
garbage, duplicated and unknown fields, runs of two-byte keys) give what the
generator walker `pb.spans` gives, field for field and error for error.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.api.views import _CTR_TYPES, _LINUX_TYPES
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire import pb_index as pbi
from nri_gpushare.nri.wire.errors import DecodeError
from tests.unit.test_fuzz_common import fuzz

C = F.Container
COUNT = C.USER + 1


def reference(
    data: bytes, what: str, wire_types: pb.WireTypes, count: int, start: int = 0, end: int = -1
) -> pbi.Index:
    """`index` as `spans` walks: what the one-loop walker must equal."""
    idx = [-1] * (3 * count)
    at = start
    for number, _, a, b in pb.spans(data, what, wire_types, start, end, True):
        if number < count:
            i = 3 * number
            if idx[i] < 0:
                idx[i] = at
            idx[i + 1] = a
            idx[i + 2] = b
        at = b
    return idx


def outcome(walk: object, *args: object) -> object:
    try:
        return walk(*args)  # type: ignore[operator]
    except DecodeError as exc:
        return f"DecodeError: {exc}"


def same(data: bytes, wire_types: pb.WireTypes = _CTR_TYPES, count: int = COUNT) -> object:
    got = outcome(pbi.index, data, "Container", wire_types, count)
    assert got == outcome(reference, data, "Container", wire_types, count)
    return got


CONTAINER = bytes(
    nri.Container(
        id="c1",
        pod_sandbox_id="p1",
        name="main",
        state=nri.ContainerState.CONTAINER_RUNNING,
        labels={f"l{i}": "v" * i for i in range(12)},
        annotations={"a": "b" * 200, "c": ""},
        env=[f"E{i}=" + "x" * (i * 9) for i in range(30)],  # lengths of one and two bytes
        mounts=[nri.Mount(destination="/" + "d" * 150, source="/s")] * 3,
        linux=nri.LinuxContainer(cgroups_path="kubepods.slice:cri:c1"),
        pid=4242,
        created_at=1764000000000000000,  # a 9-byte varint
        cdi_devices=[nri.CdiDevice(name="n"), nri.CdiDevice(name="")],  # two-byte keys
    )
)


def test_a_container_indexes_as_spans_walks_it() -> None:
    idx = same(CONTAINER)
    assert isinstance(idx, list)
    assert pbi.string_at(CONTAINER, idx, C.ID, "Container") == "c1"
    assert pbi.varint_at(idx, C.PID) == 4242
    assert pbi.varint_at(idx, C.CREATED_AT) == 1764000000000000000


@pytest.mark.parametrize(
    "data",
    [
        b"\x08",  # a varint cut short after its key
        b"\x08\xff\xff",  # a truncated varint
        b"\x08" + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a key of 11 bytes
        b"\x0a\x05abc",  # a length past the end
        b"\x0a\xff\xff\xff\xff\x0f",  # a huge length
        b"\x2a\x01a\x2a\x05ab",  # a run whose last entry is cut short
        b"\x2a\x01a\x2a\x81",  # a run ending in a truncated two-byte length
        b"\x0b\x00",  # a group start
        b"\x0f\x00",  # wire type 7
        b"\x00\x01",  # field number 0
        b"\x0d\x00\x00\x00\x00",  # a string field sent as fixed32
        b"\xf8\xff\xff\xff\x1f\x00",  # a field number beyond 2**29 - 1
        b"\x09\x00\x00\x00",  # a fixed64 cut short
        b"\xa2\x01\x01",  # a two-byte key whose payload is cut short
    ],
)
def test_malformed_bytes_are_refused_as_spans_refuses_them(data: bytes) -> None:
    got = same(data)
    assert isinstance(got, str) and got.startswith("DecodeError: malformed Container")


def test_the_last_of_a_duplicated_field_wins_and_the_first_key_is_kept() -> None:
    data = b"\x0a\x01a" + b"\x1a\x00" + b"\x0a\x02bb" + b"\x60\x05" + b"\x60\x07"
    idx = same(data)
    assert isinstance(idx, list)
    assert pbi.string_at(data, idx, C.ID, "Container") == "bb"
    assert idx[3 * C.ID] == 0  # where its region starts
    assert pbi.varint_at(idx, C.PID) == 7


def test_unknown_fields_are_walked_and_left_out() -> None:
    unknown = b"\xf8\x07\x01" + b"\xfa\x07\x02zz" + b"\xfd\x07abcd" + b"\xf9\x07" + bytes(8)
    data = unknown + b"\x0a\x01x" + unknown
    idx = same(data)
    assert isinstance(idx, list) and pbi.string_at(data, idx, C.ID, "Container") == "x"


def test_runs_of_two_byte_keys_are_not_taken_for_one_byte_ones() -> None:
    # Field 20's key is 0xa2 0x01; its value (0xa2) must not match a byte.
    data = b"\xa2\x01\x00\xa2\x01\x03\x0a\x01n"
    idx = same(data)
    assert isinstance(idx, list) and idx[3 * C.CDI_DEVICES + 1 : 3 * C.CDI_DEVICES + 3] == [6, 9]


def test_nested_garbage_passes_the_top_level_and_fails_where_it_is_read() -> None:
    garbage = b"\xff\xff\xff"
    data = b"\x0a\x01x" + pb.len_field(C.LINUX, garbage)
    assert isinstance(same(data), list)
    view = lite.decode_container(data)
    assert view.id == "x"
    with pytest.raises(DecodeError, match="LinuxContainer"):
        _ = view.cgroups_path


@given(st.binary(max_size=200))
@fuzz(1500)
def test_arbitrary_bytes_index_as_spans_walks_them(data: bytes) -> None:
    same(data)
    same(data, _LINUX_TYPES, F.LinuxContainer.LAST + 1)


@given(st.integers(0, len(CONTAINER) - 1), st.binary(min_size=1, max_size=4), st.booleans())
@fuzz(1500)
def test_a_mutated_container_indexes_as_spans_walks_it(at: int, noise: bytes, cut: bool) -> None:
    data = CONTAINER[:at] + noise + (b"" if cut else CONTAINER[at + len(noise) :])
    same(data)


@given(st.integers(0, 3), st.integers(0, 3))
def test_single_says_one_occurrence_only_when_there_is_one(before: int, after: int) -> None:
    linux = pb.len_field(C.LINUX, bytes(nri.LinuxContainer(cgroups_path="a" * 200)))
    data = b"\x0a\x01x" * before + linux + b"\x60\x01" * after
    idx = pbi.index(data, "Container", _CTR_TYPES, COUNT)
    assert pbi.single(idx, C.LINUX)
    again = data + pb.len_field(C.LINUX, bytes(nri.LinuxContainer(cgroups_path="b")))
    idx = pbi.index(again, "Container", _CTR_TYPES, COUNT)
    assert not pbi.single(idx, C.LINUX)
    assert pbi.single(idx, C.ID) == (before == 1)  # absent, once, or a run
    assert lite.decode_container(again).cgroups_path == "b"  # merged: the last wins


def test_single_is_false_for_an_overlong_length_and_the_walk_reads_it() -> None:
    # A 3-byte length for a short payload: one occurrence, read by walking.
    payload = bytes(nri.LinuxContainer(cgroups_path="c"))
    data = b"\x5a" + bytes([len(payload) | 0x80, 0x80, 0x00]) + payload
    idx = pbi.index(data, "Container", _CTR_TYPES, COUNT)
    assert not pbi.single(idx, C.LINUX)
    assert lite.decode_container(data).cgroups_path == "c"
