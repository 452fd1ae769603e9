"""Bad input to the NRI socket's framing: the mux, ttrpc framing and envelopes,
and the protobuf walker under them (all fed by the runtime's bytes).

Properties: only ProtocolError (DecodeError is one) comes out, never another
exception; what an encoder wrote decodes back; a huge declared length is
refused before anything of that size is allocated; any split of the stream
gives the same result as feeding it whole.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.nri.wire import mux, pb, ttrpc
from nri_gpushare.nri.wire.errors import DecodeError, ProtocolError
from tests.unit.test_fuzz_common import allocates_at_most, fuzz, overlong_varint, refused_only

U32 = st.integers(0, 0xFFFFFFFF)


def _feed_all(decoder: ttrpc.TtrpcConnection, chunks: list[bytes]) -> list[ttrpc.Event]:
    out: list[ttrpc.Event] = []
    for chunk in chunks:
        out += decoder.receive_data(chunk)
    decoder.receive_eof()
    return out


def _cuts(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@fuzz(300)
@given(st.binary(max_size=200), st.lists(st.integers(0, 400), max_size=5))
def test_ttrpc_connection_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    conn = ttrpc.TtrpcConnection(max_receive=1 << 16)
    refused_only(ProtocolError, _feed_all, conn, _cuts(data, cuts))


requests = st.builds(
    ttrpc.Request,
    st.text(max_size=30),
    st.text(max_size=30),
    st.binary(max_size=64),
    st.integers(-(2**63), 2**63 - 1),
    st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=3).map(tuple),
)


@fuzz(200)
@given(
    st.lists(requests, min_size=1, max_size=4),
    st.lists(st.integers(0, 2000), max_size=6),
    st.data(),
)
def test_ttrpc_valid_requests_any_split_and_one_mutation(
    reqs: list[ttrpc.Request], cuts: list[int], data: st.DataObject
) -> None:
    stream = b"".join(
        ttrpc.encode_message(2 * i + 1, ttrpc.MessageType.REQUEST, r.encode())
        for i, r in enumerate(reqs)
    )
    events = _feed_all(ttrpc.TtrpcConnection(), _cuts(stream, cuts))
    assert [e.request for e in events if isinstance(e, ttrpc.RequestReceived)] == reqs
    # One byte changed, or the stream cut short: still only ProtocolError.
    at = data.draw(st.integers(0, len(stream) - 1))
    byte = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(stream)))
    damaged = stream[:at] + bytes((byte,)) + stream[at + 1 : cut]
    refused_only(ProtocolError, _feed_all, ttrpc.TtrpcConnection(), [damaged])


@fuzz(100)
@given(st.integers(ttrpc.MAX_RECEIVE_MESSAGE + 1, 0xFFFFFFFF), U32, st.integers(0, 255))
def test_ttrpc_huge_length_refused_without_allocating(length: int, sid: int, kind: int) -> None:
    header = ttrpc.HEADER.pack(length, sid, kind, 0)
    conn = ttrpc.TtrpcConnection()
    with allocates_at_most(1 << 20):
        assert refused_only(ProtocolError, conn.receive_data, header + b"x" * 100) is None


@fuzz(200)
@given(st.binary(max_size=120))
def test_ttrpc_envelopes_arbitrary_bytes(data: bytes) -> None:
    refused_only(DecodeError, ttrpc.Request.decode, data)
    response = refused_only(DecodeError, ttrpc.Response.decode, data)
    if response is not None:
        assert ttrpc.Response.decode(response.encode()) == response


@fuzz(200)
@given(
    st.integers(1, 2**29 - 1),
    st.integers(0, 7),
    st.integers(0, 2**64 - 1),
    st.integers(0, 12),
    st.binary(max_size=20),
)
def test_protobuf_walker_overlong_and_odd_fields(
    number: int, wire_type: int, value: int, extra: int, tail: bytes
) -> None:
    data = overlong_varint(number << 3 | wire_type, extra % 3) + overlong_varint(value, extra)
    data += tail

    def walk() -> list[tuple[int, object]]:
        return list(pb.fields(data, "fuzz"))

    got = refused_only(DecodeError, walk)
    if wire_type == pb.VARINT and extra <= 10 - len(overlong_varint(value, 0)) and got:
        assert got[0] == (number, value)


@fuzz(100)
@given(st.integers(0xFFFFFFFF // 2, 2**64 - 1), st.binary(max_size=16))
def test_protobuf_huge_length_field_no_allocation(size: int, tail: bytes) -> None:
    data = pb.tag(1, pb.LEN) + pb.uvarint(size) + tail
    with allocates_at_most(1 << 20):
        assert refused_only(DecodeError, lambda: list(pb.fields(data, "fuzz"))) is None


def _mux_all(dec: mux.MuxDecoder, chunks: list[bytes]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    dec.close()
    return out


@fuzz(300)
@given(st.binary(max_size=200), st.lists(st.integers(0, 400), max_size=5), st.booleans())
def test_mux_arbitrary_bytes(data: bytes, cuts: list[int], strict: bool) -> None:
    dec = mux.MuxDecoder(strict=strict, max_frame_payload=1 << 16)
    refused_only(ProtocolError, _mux_all, dec, _cuts(data, cuts))


@fuzz(100)
@given(U32, st.integers(mux.MAX_RECEIVE_FRAME + 1, 0xFFFFFFFF))
def test_mux_huge_frame_refused_without_allocating(conn: int, length: int) -> None:
    with allocates_at_most(1 << 20):
        dec = mux.MuxDecoder()
        assert refused_only(ProtocolError, dec.feed, mux.HEADER.pack(conn, length)) is None


@fuzz(150)
@given(
    st.lists(
        st.tuples(st.sampled_from([mux.PLUGIN_CONN, mux.RUNTIME_CONN, 7]), st.binary(max_size=300)),
        max_size=5,
    ),
    st.lists(st.integers(0, 2000), max_size=6),
    st.integers(mux.HEADER.size + 1, 64),
)
def test_mux_frames_round_trip_unknown_conn_dropped(
    pieces: list[tuple[int, bytes]], cuts: list[int], max_frame: int
) -> None:
    stream = b"".join(b"".join(mux.encode_frames(c, d, max_frame)) for c, d in pieces)
    got: dict[int, bytes] = {}
    for conn, data in _mux_all(mux.MuxDecoder(), _cuts(stream, cuts)):
        got[conn] = got.get(conn, b"") + data
    want: dict[int, bytes] = {}
    for conn, data in pieces:
        if conn != 7 and data:
            want[conn] = want.get(conn, b"") + data
    assert got == want
