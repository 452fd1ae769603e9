"""asyncio transport over socketpair: both roles on both conns, errors, closes."""

import asyncio
import socket
import struct

import pytest

from nri_gpushare.nri.wire.errors import (
    Code,
    ConnectionClosed,
    MessageTooLarge,
    ProtocolError,
    TtrpcError,
)
from nri_gpushare.nri.wire.mux import MAX_FRAME, MuxDecoder, encode_frames
from nri_gpushare.nri.wire.transport import MuxConnection
from nri_gpushare.nri.wire.ttrpc import (
    MAX_SEND_MESSAGE,
    MessageDecoder,
    Request,
    Response,
    encode_message,
)

GUARD = 10  # seconds: only keeps a broken test from hanging, never a measurement


async def within(awaitable):
    return await asyncio.wait_for(awaitable, GUARD)


async def echo(service: str, method: str, payload: bytes) -> bytes:
    return f"{service}/{method}:".encode() + payload


async def connection(sock: socket.socket, mode: str) -> MuxConnection:
    """A MuxConnection fed by the socket's callbacks ("pushed", as `from_socket`
    and `connect` make it) or by a task reading a stream ("stream")."""
    if mode == "pushed":
        return await MuxConnection.from_socket(sock)
    reader, writer = await asyncio.open_connection(sock=sock)
    return MuxConnection(reader, writer)


@pytest.fixture(params=["pushed", "stream"])
async def pair(request):
    """(plugin, runtime) MuxConnections joined by a socketpair."""
    a, b = socket.socketpair()
    plugin = await connection(a, request.param)
    runtime = await connection(b, request.param)
    yield plugin, runtime
    await plugin.close()
    await runtime.close()


@pytest.fixture(params=["pushed", "stream"])
async def raw(request):
    """(plugin MuxConnection, reader, writer) with the test speaking raw bytes as the peer."""
    a, b = socket.socketpair()
    plugin = await connection(a, request.param)
    reader, writer = await asyncio.open_connection(sock=b)
    yield plugin, reader, writer
    await plugin.close()
    writer.close()


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    conn_id, length = struct.unpack(">II", await within(reader.readexactly(8)))
    return conn_id, await within(reader.readexactly(length))


async def test_calls_both_ways(pair):
    plugin, runtime = pair
    plugin.serve(1, echo)
    runtime.serve(2, echo)
    assert await within(runtime.client(1).call("P", "Configure", b"x")) == b"P/Configure:x"
    assert await within(plugin.client(2).call("R", "RegisterPlugin", b"y")) == b"R/RegisterPlugin:y"


async def test_runtime_may_call_configure_before_answering_register(pair):
    plugin, runtime = pair
    seen = []

    async def plugin_service(service, method, payload):
        seen.append(method)
        return b"configured"

    async def runtime_service(service, method, payload):
        # The runtime calls Configure on conn 1 before it answers RegisterPlugin on conn 2.
        assert await runtime.client(1).call("Plugin", "Configure", b"") == b"configured"
        return b"registered"

    plugin.serve(1, plugin_service)
    runtime.serve(2, runtime_service)
    assert await within(plugin.client(2).call("Runtime", "RegisterPlugin", b"")) == b"registered"
    assert seen == ["Configure"]


async def test_concurrent_calls_are_handled_concurrently(pair):
    plugin, runtime = pair
    n = 5
    arrived: list[bytes] = []
    all_here = asyncio.Event()

    async def handler(service, method, payload):
        arrived.append(payload)
        if len(arrived) == n:
            all_here.set()
        await all_here.wait()  # nobody is answered until all requests are in flight
        return payload * 2

    plugin.serve(1, handler)
    client = runtime.client(1)
    results = await within(asyncio.gather(*(client.call("s", "m", bytes([i])) for i in range(n))))
    assert results == [bytes([i, i]) for i in range(n)]


async def test_error_status_reaches_the_caller(pair):
    plugin, runtime = pair

    async def handler(service, method, payload):
        raise TtrpcError(Code.FAILED_PRECONDITION, "no GPU has 4 GiB free")

    plugin.serve(1, handler)
    with pytest.raises(TtrpcError) as info:
        await within(runtime.client(1).call("s", "m", b""))
    assert info.value.code is Code.FAILED_PRECONDITION
    assert info.value.message == "no GPU has 4 GiB free"


async def test_handler_exception_answers_internal_and_connection_survives(pair):
    plugin, runtime = pair

    async def handler(service, method, payload):
        if method == "bad":
            raise RuntimeError("kaboom")
        if method == "notbytes":
            return "a str"
        return b"fine"

    plugin.serve(1, handler)
    client = runtime.client(1)
    with pytest.raises(TtrpcError) as info:
        await within(client.call("s", "bad", b""))
    assert (info.value.code, info.value.message) == (Code.INTERNAL, "kaboom")
    with pytest.raises(TtrpcError) as info:
        await within(client.call("s", "notbytes", b""))
    assert info.value.code is Code.INTERNAL
    assert await within(client.call("s", "good", b"")) == b"fine"
    assert not plugin.closed and not runtime.closed


async def test_handler_exception_without_a_message_still_answers(pair):
    plugin, runtime = pair

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message either")

    async def handler(service, method, payload):
        raise Unprintable if method == "unprintable" else MemoryError

    plugin.serve(1, handler)
    for method, message in (("unprintable", "Unprintable"), ("empty", "MemoryError")):
        with pytest.raises(TtrpcError) as info:
            await within(runtime.client(1).call("s", method, b""))
        assert (info.value.code, info.value.message) == (Code.INTERNAL, message)
    assert not plugin.closed


async def test_no_handler_answers_unimplemented(pair):
    plugin, runtime = pair
    with pytest.raises(TtrpcError) as info:
        await within(runtime.client(1).call("s", "m", b""))
    assert info.value.code is Code.UNIMPLEMENTED


async def test_three_megabyte_roundtrip(pair):
    plugin, runtime = pair
    plugin.serve(1, echo)
    big = bytes(range(256)) * (3 * 4096)
    assert await within(runtime.client(1).call("s", "m", big)) == b"s/m:" + big


async def test_oversized_call_refused_and_connection_survives(pair):
    plugin, runtime = pair
    plugin.serve(1, echo)
    client = runtime.client(1)
    with pytest.raises(MessageTooLarge):
        await client.call("s", "m", bytes(MAX_SEND_MESSAGE))
    assert await within(client.call("s", "m", b"ok")) == b"s/m:ok"


async def test_oversized_response_answers_internal(pair):
    plugin, runtime = pair

    async def handler(service, method, payload):
        return bytes(MAX_SEND_MESSAGE + 1)

    plugin.serve(1, handler)
    with pytest.raises(TtrpcError) as info:
        await within(runtime.client(1).call("s", "m", b""))
    assert info.value.code is Code.INTERNAL and "exceeds" in info.value.message


async def test_call_timeout_is_deadline_exceeded_and_late_answer_ignored(pair):
    plugin, runtime = pair
    release = asyncio.Event()
    answered = asyncio.Event()

    async def handler(service, method, payload):
        if method == "slow":
            await release.wait()
            answered.set()
        return b"done"

    plugin.serve(1, handler)
    client = runtime.client(1)
    with pytest.raises(TtrpcError) as info:
        await within(client.call("s", "slow", b"", timeout=0.01))
    assert info.value.code is Code.DEADLINE_EXCEEDED
    release.set()
    await within(answered.wait())
    assert await within(client.call("s", "fast", b"")) == b"done"  # late answer was dropped
    assert not runtime.closed


async def test_peer_close_wakes_pending_calls(pair):
    plugin, runtime = pair
    entered = asyncio.Event()

    async def never(service, method, payload):
        entered.set()
        await asyncio.Event().wait()

    runtime.serve(2, never)
    call = asyncio.ensure_future(plugin.client(2).call("R", "RegisterPlugin", b""))
    await within(entered.wait())
    await runtime.close()
    with pytest.raises(ConnectionClosed):
        await within(call)
    await within(plugin.wait_closed())
    assert plugin.closed and plugin.error is None
    with pytest.raises(ConnectionClosed):
        await plugin.client(2).call("R", "x", b"")


async def test_close_wakes_own_pending_calls(pair):
    plugin, runtime = pair
    runtime.serve(2, lambda *a: asyncio.Event().wait())
    call = asyncio.ensure_future(plugin.client(2).call("R", "m", b""))
    await asyncio.sleep(0)
    await plugin.close()
    with pytest.raises(ConnectionClosed):
        await within(call)
    await within(runtime.wait_closed())


async def test_connection_closed_is_a_connection_error():
    assert issubclass(ConnectionClosed, ConnectionError)


# raw peer: exact bytes on the socket


async def test_request_frames_on_the_socket(raw):
    plugin, reader, writer = raw
    call = asyncio.ensure_future(plugin.client(2).call("svc", "M", b"\x01\x02"))
    conn_id, payload = await read_frame(reader)
    request = Request("svc", "M", b"\x01\x02").encode()
    assert conn_id == 2
    assert payload == encode_message(1, 1, request)
    writer.write(b"".join(encode_frames(2, encode_message(1, 2, Response(payload=b"ok").encode()))))
    assert await within(call) == b"ok"


async def test_big_response_frames_are_small_and_whole(raw):
    plugin, reader, writer = raw
    big = bytes(range(256)) * (3 * 4096)

    async def handler(service, method, payload):
        return big if method == "big" else b"small"

    plugin.serve(1, handler)
    writer.write(
        b"".join(
            encode_frames(1, encode_message(1, 1, Request("s", "big").encode()))
            + encode_frames(1, encode_message(3, 1, Request("s", "small").encode()))
        )
    )
    decoder = MessageDecoder()
    messages = []
    while len(messages) < 2:
        conn_id, payload = await read_frame(reader)
        assert conn_id == 1 and 8 + len(payload) <= MAX_FRAME
        done = decoder.feed(payload)
        assert not done or decoder.buffered == 0  # no frame starts the next message
        messages += done
    by_stream = {m.stream_id: Response.decode(m.payload).payload for m in messages}
    assert by_stream == {1: big, 3: b"small"}


async def test_unknown_conn_id_frames_are_dropped(raw):
    plugin, reader, writer = raw
    plugin.serve(1, echo)
    request = encode_message(1, 1, Request("s", "m", b"x").encode())
    writer.write(struct.pack(">II", 7, 5) + b"junk!" + b"".join(encode_frames(1, request)))
    conn_id, payload = await read_frame(reader)
    assert MessageDecoder().feed(payload)[0].stream_id == 1
    assert plugin.dropped_frames == {7: 1}
    assert not plugin.closed


@pytest.mark.parametrize(
    "garbage, match",
    [
        (b"".join(encode_frames(2, encode_message(99, 2, b""))), "unknown stream id 99"),
        (b"".join(encode_frames(1, encode_message(2, 1, b""))), "even stream id"),
        (b"".join(encode_frames(1, encode_message(1, 3, b""))), "data message"),
        (b"".join(encode_frames(1, encode_message(1, 1, b"\xff\xff"))), "malformed"),
        (b"".join(encode_frames(1, b"\x7f\xff\xff\xff" + bytes(6))), "declares"),
        (b"\x00\x00\x00\x01\xff\xff\xff\xff", "declares"),
    ],
    ids=["unknown-stream", "even-stream", "data-type", "garbage-pb", "ttrpc-len", "mux-len"],
)
async def test_protocol_error_closes_and_wakes_pending_calls(raw, garbage, match):
    plugin, reader, writer = raw
    call = asyncio.ensure_future(plugin.client(2).call("R", "RegisterPlugin", b""))
    await read_frame(reader)  # the request went out
    writer.write(garbage)
    with pytest.raises(ConnectionClosed, match=match):
        await within(call)
    await within(plugin.wait_closed())
    assert isinstance(plugin.error, ProtocolError)
    assert plugin.closed
    assert await within(reader.read()) == b""  # the plugin hung up


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00\x00\x01\x00",  # inside a mux header
        b"\x00\x00\x00\x01\x00\x00\x00\x10abc",  # inside a mux frame
        b"".join(encode_frames(1, encode_message(1, 1, b"abcdef")[:-2])),  # inside a message
    ],
    ids=["mux-header", "mux-payload", "ttrpc-message"],
)
async def test_eof_mid_frame_is_protocol_error(raw, tail):
    plugin, reader, writer = raw
    writer.write(tail)
    writer.write_eof()
    await within(plugin.wait_closed())
    assert isinstance(plugin.error, ProtocolError)


async def test_clean_eof_is_no_error(raw):
    plugin, reader, writer = raw
    writer.close()
    await within(plugin.wait_closed())
    assert plugin.error is None


async def test_connect_unix_path(tmp_path):
    path = str(tmp_path / "nri.sock")
    accepted: asyncio.Queue[MuxConnection] = asyncio.Queue()

    async def on_client(reader, writer):
        sock = writer.get_extra_info("socket")
        runtime = MuxConnection(reader, writer)
        runtime.serve(2, echo)
        assert sock is not None
        await accepted.put(runtime)

    server = await asyncio.start_unix_server(on_client, path)
    try:
        plugin = await within(MuxConnection.connect(path))
        assert await within(plugin.client(2).call("R", "m", b"!")) == b"R/m:!"
        await plugin.close()
        runtime = await accepted.get()
        await within(runtime.wait_closed())
        await runtime.close()
    finally:
        server.close()
        await server.wait_closed()


def test_decoders_alone_agree_with_transport_framing():
    # what the transport writes for one message is exactly encode_frames of it
    data = encode_message(1, 2, Response(payload=b"x" * 9000).encode())
    frames = encode_frames(1, data)
    assert [c for c, _ in MuxDecoder().feed(b"".join(frames))] == [1]


@pytest.mark.parametrize("mode", ["pushed", "stream"])
async def test_bytes_sent_before_the_connection_is_made_are_served(mode):
    # The runtime may write as soon as the socket is up: what arrives before
    # the connection is set up waits for its services, it is not refused.
    a, b = socket.socketpair()
    b.sendall(encode_frames(1, encode_message(1, 1, Request("P", "Configure", b"x").encode()))[0])
    b.shutdown(socket.SHUT_WR)
    await asyncio.sleep(0.01)  # the bytes are in a's receive buffer
    plugin = await connection(a, mode)
    plugin.serve(1, echo)
    reader, writer = await asyncio.open_connection(sock=b)
    conn_id, data = await read_frame(reader)
    assert conn_id == 1 and Response.decode(data[10:]) == Response(payload=b"P/Configure:x")
    await within(plugin.wait_closed())
    assert plugin.error is None  # a clean EOF after the request
    await plugin.close()
    writer.close()
