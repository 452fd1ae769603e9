"""ttrpc codecs and connection state: exact bytes, limits, malformed input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import Code, MessageTooLarge, ProtocolError
from nri_gpushare.nri.wire.mux import MAX_FRAME, MuxDecoder, encode_frames
from nri_gpushare.nri.wire.ttrpc import (
    MAX_SEND_MESSAGE,
    Message,
    MessageDecoder,
    Request,
    RequestReceived,
    Response,
    ResponseReceived,
    TtrpcConnection,
    encode_message,
)

# Request{service="svc", method="M", payload=01 02, timeout_nano=5, metadata=[{k: v}]}
REQUEST_BYTES = (
    bytes.fromhex("0a03737663") + b"\x12\x01M" + bytes.fromhex("1a02010220052a060a016b120176")
)
REQUEST = Request("svc", "M", b"\x01\x02", 5, (("k", "v"),))


def header(length: int, stream_id: int, type: int, flags: int = 0) -> bytes:
    return length.to_bytes(4, "big") + stream_id.to_bytes(4, "big") + bytes([type, flags])


# message framing


def test_encode_message_bytes():
    assert encode_message(1, 1, b"xy") == b"\x00\x00\x00\x02\x00\x00\x00\x01\x01\x00xy"
    assert encode_message(0x0A0B0C0D, 2, b"", 4) == b"\x00\x00\x00\x00\x0a\x0b\x0c\x0d\x02\x04"


def test_send_limit_is_4_mib_of_payload():
    assert len(encode_message(1, 1, bytes(MAX_SEND_MESSAGE))) == MAX_SEND_MESSAGE + 10
    with pytest.raises(MessageTooLarge, match="4194305 bytes"):
        encode_message(1, 1, bytes(MAX_SEND_MESSAGE + 1))


def test_decode_message_exact():
    dec = MessageDecoder()
    assert dec.feed(header(2, 3, 1, 0) + b"hi") == [Message(3, 1, b"hi", 0)]
    assert dec.buffered == 0


def test_decode_messages_byte_at_a_time_and_coalesced():
    stream = encode_message(1, 1, b"one") + encode_message(3, 1, b"") + encode_message(5, 2, b"3")
    expected = [Message(1, 1, b"one"), Message(3, 1, b""), Message(5, 2, b"3")]
    dec = MessageDecoder()
    assert [m for i in range(len(stream)) for m in dec.feed(stream[i : i + 1])] == expected
    assert MessageDecoder().feed(stream) == expected


def test_reads_messages_larger_than_the_send_limit():
    payload = bytes(range(256)) * (6 * 4096)  # 6 MiB, as a runtime may send
    dec = MessageDecoder()
    data = header(len(payload), 1, 1) + payload
    out = [m for i in range(0, len(data), 65536) for m in dec.feed(data[i : i + 65536])]
    assert out == [Message(1, 1, payload)]


def test_declared_length_over_hard_limit_is_protocol_error_and_sticky():
    dec = MessageDecoder()
    with pytest.raises(ProtocolError, match="declares 4294967295 bytes"):
        dec.feed(header(0xFFFFFFFF, 1, 1))
    with pytest.raises(ProtocolError):
        dec.feed(b"")  # the decoder stays broken


def test_truncated_message_waits_then_eof_is_protocol_error():
    dec = MessageDecoder()
    assert dec.feed(header(5, 1, 1) + b"abc") == []
    assert dec.buffered == 13
    with pytest.raises(ProtocolError, match="13 bytes buffered"):
        dec.close()
    MessageDecoder().close()  # nothing pending: clean end


# envelopes


def test_request_encodes_byte_for_byte():
    assert REQUEST.encode() == REQUEST_BYTES
    assert Request.decode(REQUEST_BYTES) == REQUEST


def test_request_defaults_are_omitted():
    assert Request("s", "m").encode() == b"\x0a\x01s\x12\x01m"


def test_negative_timeout_is_ten_byte_varint():
    data = Request("s", "m", timeout_nano=-1).encode()
    assert data.endswith(b"\x20" + b"\xff" * 9 + b"\x01")
    assert Request.decode(data).timeout_nano == -1


def test_response_encodes_byte_for_byte():
    assert Response(payload=b"hi").encode() == b"\x0a\x00\x12\x02hi"
    assert Response(Code.INTERNAL, "boom").encode() == b"\x0a\x08\x08\x0d\x12\x04boom"
    assert Response.decode(b"\x0a\x08\x08\x0d\x12\x04boom") == Response(13, "boom")
    assert Response.decode(b"\x0a\x08\x08\x0d\x12\x04boom").code is Code.INTERNAL


def test_response_decode_tolerates_missing_status_details_and_unknown_fields():
    assert Response.decode(b"\x12\x02ok") == Response(0, "", b"ok")
    # status with details (field 3, an Any), plus unknown fields of every wire type
    status = b"\x08\x03\x12\x03bad\x1a\x04\x0a\x02xy"
    extra = b"\x38\x01" + b"\x41" + bytes(8) + b"\x4d" + bytes(4) + b"\x52\x01z"
    got = Response.decode(b"\x0a" + bytes([len(status)]) + status + extra)
    assert got == Response(Code.INVALID_ARGUMENT, "bad", b"")


def test_response_negative_and_unknown_codes():
    neg = b"\x0a\x0b\x08" + b"\xff" * 9 + b"\x01"
    assert Response.decode(neg).code == -1
    assert Response.decode(b"\x0a\x02\x08\x63").code == 99


@given(
    st.text(),
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.lists(st.tuples(st.text(), st.text()), max_size=3).map(tuple),
)
@settings(max_examples=50, deadline=None)
def test_request_roundtrip(service, method, payload, timeout, metadata):
    req = Request(service, method, payload, timeout, metadata)
    assert Request.decode(req.encode()) == req


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1), st.text(), st.binary())
@settings(max_examples=50, deadline=None)
def test_response_roundtrip(code, message, payload):
    resp = Response(code, message, payload)
    assert Response.decode(resp.encode()) == resp


GARBAGE = {
    "truncated varint": b"\x0a",
    "truncated tag": b"\x80",
    "length past end": b"\x0a\x05ab",
    "varint too long": b"\x20" + b"\xff" * 10 + b"\x01",
    "field zero": b"\x02\x00",
    "group wire type": b"\x0b",
    "invalid wire type": b"\x0e",
    "wrong wire type": b"\x08\x01",  # service as a varint
    "wrong wire type timeout": b"\x22\x00",
    "bad utf-8": b"\x0a\x02\xff\xfe",
    "bad metadata": b"\x2a\x02\x0a\x05",
    "fixed32 past end": b"\x4d\x00",
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_request_is_protocol_error(data):
    with pytest.raises(ProtocolError, match="malformed ttrpc"):
        Request.decode(data)


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x02\x08", b"\x0a\x02\x10\x00", b"\x12", b"\x0a\x02\x12\x01", b"\x0a\x03\x12\x01\xff"],
)
def test_garbage_response_is_protocol_error(data):
    with pytest.raises(ProtocolError, match="malformed ttrpc"):
        Response.decode(data)


def test_varint_encoding():
    assert pb.varint(0) == b"\x00"
    assert pb.varint(300) == b"\xac\x02"
    assert pb.varint(-1) == b"\xff" * 9 + b"\x01"
    assert pb.read_varint(b"\xac\x02", 0, "x") == (300, 2)


# connection state


def test_client_stream_ids_are_odd_and_increasing():
    conn = TtrpcConnection()
    ids = [conn.send_request(Request("s", "m"))[0] for _ in range(4)]
    assert ids == [1, 3, 5, 7]
    assert conn.awaiting == {1, 3, 5, 7}


def test_send_request_bytes():
    conn = TtrpcConnection()
    stream_id, data = conn.send_request(REQUEST)
    assert data == header(len(REQUEST_BYTES), 1, 1) + REQUEST_BYTES


def test_oversized_request_refused_without_using_a_stream_id():
    conn = TtrpcConnection()
    with pytest.raises(MessageTooLarge):
        conn.send_request(Request("s", "m", bytes(MAX_SEND_MESSAGE)))
    assert conn.awaiting == set()
    assert conn.send_request(Request("s", "m"))[0] == 1


def test_responses_match_requests_in_any_order():
    conn = TtrpcConnection()
    conn.send_request(Request("s", "a"))
    conn.send_request(Request("s", "b"))
    data = encode_message(3, 2, Response(payload=b"B").encode()) + encode_message(
        1, 2, Response(Code.UNIMPLEMENTED, "no").encode()
    )
    assert conn.receive_data(data) == [
        ResponseReceived(3, Response(payload=b"B")),
        ResponseReceived(1, Response(12, "no")),
    ]
    assert conn.awaiting == set()


def test_response_for_unknown_or_answered_stream_is_protocol_error():
    conn = TtrpcConnection()
    with pytest.raises(ProtocolError, match="unknown stream id 1"):
        conn.receive_data(encode_message(1, 2, b""))
    conn = TtrpcConnection()
    conn.send_request(Request("s", "m"))
    conn.receive_data(encode_message(1, 2, b""))
    with pytest.raises(ProtocolError, match="unknown stream id 1"):
        conn.receive_data(encode_message(1, 2, b""))


def test_abandoned_stream_late_response_is_ignored_once():
    conn = TtrpcConnection()
    conn.send_request(Request("s", "m"))
    conn.abandon(1)
    assert conn.awaiting == set()
    assert conn.receive_data(encode_message(1, 2, Response(payload=b"late").encode())) == []
    with pytest.raises(ProtocolError):
        conn.receive_data(encode_message(1, 2, b""))


def test_server_receives_request_and_answers_once():
    conn = TtrpcConnection()
    events = conn.receive_data(encode_message(1, 1, REQUEST_BYTES))
    assert events == [RequestReceived(1, REQUEST)]
    assert conn.unanswered == {1}
    data = conn.send_response(1, Response(payload=b"ok"))
    assert data == header(6, 1, 2) + b"\x0a\x00\x12\x02ok"
    with pytest.raises(ValueError):
        conn.send_response(1, Response())


def test_server_stream_ids_may_have_gaps():
    conn = TtrpcConnection()
    events = conn.receive_data(encode_message(1, 1, b"") + encode_message(7, 1, b""))
    assert [e.stream_id for e in events] == [1, 7]


def test_oversized_response_refused_and_request_stays_unanswered():
    conn = TtrpcConnection()
    conn.receive_data(encode_message(1, 1, b""))
    with pytest.raises(MessageTooLarge):
        conn.send_response(1, Response(payload=bytes(MAX_SEND_MESSAGE)))
    assert conn.unanswered == {1}
    conn.send_response(1, Response(Code.INTERNAL, "too big"))


@pytest.mark.parametrize(
    "data, match",
    [
        (encode_message(2, 1, b""), "even stream id 2"),
        (encode_message(0, 1, b""), "even stream id 0"),
        (encode_message(3, 1, b"") + encode_message(3, 1, b""), "not above the previous 3"),
        (encode_message(5, 1, b"") + encode_message(1, 1, b""), "not above the previous 5"),
        (encode_message(1, 3, b""), "data message"),
        (encode_message(1, 9, b""), "unknown ttrpc message type 9"),
        (encode_message(1, 1, b"\x0a\x05ab"), "malformed ttrpc Request"),
        (header(0x7FFFFFFF, 1, 1), "declares"),
    ],
)
def test_malformed_peer_input_is_protocol_error(data, match):
    with pytest.raises(ProtocolError, match=match):
        TtrpcConnection().receive_data(data)


def test_garbage_response_payload_is_protocol_error():
    conn = TtrpcConnection()
    conn.send_request(Request("s", "m"))
    with pytest.raises(ProtocolError, match="malformed ttrpc Response"):
        conn.receive_data(encode_message(1, 2, b"\xff"))


def test_eof_inside_message_is_protocol_error():
    conn = TtrpcConnection()
    conn.receive_data(encode_message(1, 1, REQUEST_BYTES)[:-1])
    with pytest.raises(ProtocolError):
        conn.receive_eof()


# the two layers together, sans IO


def test_three_megabyte_roundtrip_frames_never_mix_messages():
    big = bytes(range(251)) * (3 * 1024 * 1024 // 251)
    runtime, plugin = TtrpcConnection(), TtrpcConnection()
    _, req1 = runtime.send_request(Request("svc", "Big", big))
    _, req2 = runtime.send_request(Request("svc", "Small", b"s"))
    frames1, frames2 = encode_frames(1, req1), encode_frames(1, req2)
    wire = frames1 + frames2
    assert all(len(f) <= MAX_FRAME for f in wire)
    # the first message's frames carry exactly its bytes, nothing of the next
    assert b"".join(f[8:] for f in frames1) == req1
    assert b"".join(f[8:] for f in frames2) == req2

    mux = MuxDecoder()
    events = [e for f in wire for _, data in mux.feed(f) for e in plugin.receive_data(data)]
    assert events == [
        RequestReceived(1, Request("svc", "Big", big)),
        RequestReceived(3, Request("svc", "Small", b"s")),
    ]
    answer = plugin.send_response(1, Response(payload=big))
    back = [
        e for f in encode_frames(1, answer) for _, d in mux.feed(f) for e in runtime.receive_data(d)
    ]
    assert back == [ResponseReceived(1, Response(payload=big))]


def test_both_conns_interleaved_with_coalesced_and_split_reads():
    # Runtime -> plugin: Configure and Synchronize requests on conn 1, frame-interleaved
    # with the answer to the plugin's RegisterPlugin on conn 2.
    runtime1, runtime2 = TtrpcConnection(), TtrpcConnection()
    _, configure = runtime1.send_request(Request("Plugin", "Configure", b"c" * 9000))
    _, sync = runtime1.send_request(Request("Plugin", "Synchronize", b"y"))
    pending = TtrpcConnection()
    _, register = pending.send_request(Request("Runtime", "RegisterPlugin", b"r" * 5000))
    runtime2.receive_data(register)
    answer = runtime2.send_response(1, Response(payload=b"R" * 5000))

    conf_frames, reg_frames = encode_frames(1, configure), encode_frames(2, answer)
    assert len(conf_frames) == 3 and len(reg_frames) == 2
    order = [conf_frames[0], reg_frames[0], conf_frames[1], reg_frames[1], conf_frames[2]]
    stream = b"".join(order + encode_frames(1, sync))

    for chunk_size in (1, 7, 4096, len(stream)):
        plugin1, plugin2 = TtrpcConnection(), TtrpcConnection()
        plugin2.send_request(Request("Runtime", "RegisterPlugin", b"r" * 5000))
        mux = MuxDecoder()
        got = []
        for i in range(0, len(stream), chunk_size):
            for conn_id, data in mux.feed(stream[i : i + chunk_size]):
                got += (plugin1 if conn_id == 1 else plugin2).receive_data(data)
        mux.close()
        assert got == [
            ResponseReceived(1, Response(payload=b"R" * 5000)),
            RequestReceived(1, Request("Plugin", "Configure", b"c" * 9000)),
            RequestReceived(3, Request("Plugin", "Synchronize", b"y")),
        ]
