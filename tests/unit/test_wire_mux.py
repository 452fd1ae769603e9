"""Mux frame codec: exact bytes, splitting, reassembly and malformed input."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpushare.nri.wire.errors import ProtocolError
from nri_gpushare.nri.wire.mux import (
    MAX_FRAME,
    MAX_FRAME_PAYLOAD,
    MuxDecoder,
    encode_frames,
)


def frame(conn_id: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn_id, len(payload)) + payload


def test_encode_single_frame_bytes():
    assert encode_frames(1, b"abc") == [b"\x00\x00\x00\x01\x00\x00\x00\x03abc"]
    assert encode_frames(0x01020304, b"\xff") == [b"\x01\x02\x03\x04\x00\x00\x00\x01\xff"]


def test_encode_nothing_gives_no_frames():
    assert encode_frames(2, b"") == []


def test_frames_are_at_most_4096_bytes_including_header():
    assert MAX_FRAME == 4096 and MAX_FRAME_PAYLOAD == 4088
    assert [len(f) for f in encode_frames(1, bytes(4088))] == [4096]
    assert [len(f) for f in encode_frames(1, bytes(4089))] == [4096, 9]
    data = bytes(range(256)) * 40  # 10240 bytes
    frames = encode_frames(2, data)
    assert [len(f) for f in frames] == [4096, 4096, 8 + 10240 - 2 * 4088]
    assert all(f[:4] == b"\x00\x00\x00\x02" for f in frames)
    assert [struct.unpack(">I", f[4:8])[0] for f in frames] == [4088, 4088, 2064]
    assert b"".join(f[8:] for f in frames) == data


def test_encode_rejects_bad_conn_id():
    with pytest.raises(ValueError):
        encode_frames(1 << 32, b"x")
    with pytest.raises(ValueError):
        encode_frames(-1, b"x")


def test_decode_one_frame():
    assert MuxDecoder().feed(frame(1, b"hello")) == [(1, b"hello")]


def test_decode_byte_at_a_time():
    dec = MuxDecoder()
    stream = frame(1, b"abc") + frame(2, b"de") + frame(1, b"f")
    out = [piece for i in range(len(stream)) for piece in dec.feed(stream[i : i + 1])]
    assert out == [(1, b"a"), (1, b"b"), (1, b"c"), (2, b"d"), (2, b"e"), (1, b"f")]
    assert dec.idle
    dec.close()


def test_decode_coalesced_frames_merge_runs_of_one_conn():
    dec = MuxDecoder()
    stream = frame(1, b"ab") + frame(1, b"cd") + frame(2, b"xy") + frame(1, b"e")
    assert dec.feed(stream) == [(1, b"abcd"), (2, b"xy"), (1, b"e")]


def test_zero_length_frames_are_harmless():
    dec = MuxDecoder()
    assert dec.feed(frame(1, b"") + frame(2, b"") + frame(1, b"z")) == [(1, b"z")]
    dec.close()


def test_unknown_conn_id_frames_are_dropped_and_counted():
    dec = MuxDecoder()
    stream = frame(7, b"junk") + frame(1, b"ok") + frame(7, b"more") + frame(9, b"")
    assert dec.feed(stream) == [(1, b"ok")]
    assert dec.dropped_frames == {7: 2, 9: 1}


def test_unknown_conn_id_split_reads_dropped():
    dec = MuxDecoder()
    stream = frame(3, b"junk junk") + frame(2, b"ok")
    out = [piece for i in range(len(stream)) for piece in dec.feed(stream[i : i + 1])]
    assert b"".join(p for _, p in out) == b"ok" and {c for c, _ in out} == {2}


def test_strict_decoder_refuses_unknown_conn_id():
    dec = MuxDecoder(strict=True)
    with pytest.raises(ProtocolError, match="unknown conn id 5"):
        dec.feed(frame(5, b"x"))


def test_extra_conn_ids_can_be_known():
    dec = MuxDecoder(conn_ids=(1, 2, 5))
    assert dec.feed(frame(5, b"x")) == [(5, b"x")]


def test_declared_frame_length_over_limit_is_protocol_error():
    dec = MuxDecoder()
    with pytest.raises(ProtocolError, match="declares 4294967295"):
        dec.feed(b"\x00\x00\x00\x01\xff\xff\xff\xff")
    small = MuxDecoder(max_frame_payload=10)
    small.feed(frame(1, bytes(10)))
    with pytest.raises(ProtocolError):
        small.feed(frame(1, bytes(11)))


def test_eof_inside_header_is_protocol_error():
    dec = MuxDecoder()
    dec.feed(b"\x00\x00\x00")
    with pytest.raises(ProtocolError, match="header"):
        dec.close()


def test_eof_inside_payload_is_protocol_error():
    dec = MuxDecoder()
    assert dec.feed(frame(1, b"abcdef")[:-2]) == [(1, b"abcd")]
    assert not dec.idle
    with pytest.raises(ProtocolError, match="4 of 6"):
        dec.close()


def test_large_frame_payload_streams_without_buffering():
    # A single big frame (up to the limit) is passed on piece by piece.
    dec = MuxDecoder()
    payload = bytes(range(256)) * 4096  # 1 MiB in one frame
    data = frame(1, payload)
    pieces = [dec.feed(data[i : i + 65536]) for i in range(0, len(data), 65536)]
    assert b"".join(p for chunk in pieces for _, p in chunk) == payload


messages = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.binary(max_size=9000)), max_size=6)


@settings(max_examples=60, deadline=None)
@given(messages, st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=20))
def test_any_split_reassembles_each_conn(msgs, cuts):
    stream = b"".join(f for conn, data in msgs for f in encode_frames(conn, data))
    dec = MuxDecoder()
    got: dict[int, bytes] = {1: b"", 2: b""}
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        for conn, piece in dec.feed(stream[pos : pos + step]):
            got[conn] += piece
        pos += step
        i += 1
    dec.close()
    for conn in (1, 2):
        assert got[conn] == b"".join(d for c, d in msgs if c == conn)
    assert dec.dropped_frames.total() == sum(len(encode_frames(3, d)) for c, d in msgs if c == 3)
