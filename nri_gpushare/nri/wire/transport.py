"""Thin asyncio transport: one socket, multiplexed ttrpc clients and servers.

All protocol logic lives in the sans-IO codecs (mux, ttrpc); this module only
moves bytes. Each ttrpc message goes out in a single `writer.write` of all its
frames, so two messages' frames never interleave on the socket. Incoming
requests run as concurrent tasks; a handler's failure becomes an error status,
never the end of the connection. A protocol error closes the connection and
fails every pending call with ConnectionClosed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Self

from nri_gpushare.nri.wire.errors import (
    Code,
    ConnectionClosed,
    MessageTooLarge,
    ProtocolError,
    TtrpcError,
    describe_error,
)
from nri_gpushare.nri.wire.mux import PLUGIN_CONN, RUNTIME_CONN, MuxDecoder, encode_frames
from nri_gpushare.nri.wire.ttrpc import Request, RequestReceived, Response, TtrpcConnection

log = logging.getLogger(__name__)

Handler = Callable[[str, str, bytes], Awaitable[bytes]]
"""(service, method, request payload) -> response payload."""

_READ_SIZE = 1 << 16
CLOSE_FLUSH_TIMEOUT = 5.0
"""Seconds close() lets unsent bytes drain before it drops them."""


class _Logical:
    """One logical connection: its ttrpc state, handler and pending calls."""

    def __init__(self, conn_id: int) -> None:
        self.conn_id = conn_id
        self.ttrpc = TtrpcConnection()
        self.handler: Handler | None = None
        self.pending: dict[int, asyncio.Future[Response]] = {}


class _PushProtocol(asyncio.StreamReaderProtocol):
    """Hands each chunk the socket delivers straight to its connection, in the
    transport's own callback: no read task wakes up in between. Until the
    connection is attached, what arrives is kept for it."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self.reader = reader  # the base class keeps it only weakly once connected
        self._sink: MuxConnection | None = None
        self._early: list[bytes] = []
        self._early_end: tuple[BaseException | None] | None = None

    def attach(self, sink: MuxConnection) -> None:
        """Feed `sink` from now on; what came before goes to it on the loop's next
        turn (as a read task would have), once its maker has set up its services."""
        asyncio.get_running_loop().call_soon(self._attach, sink)

    def _attach(self, sink: MuxConnection) -> None:
        self._sink = sink
        for data in self._early:
            sink._receive(data)
        self._early = []
        if self._early_end is not None:
            self._end(self._early_end[0])

    def data_received(self, data: bytes) -> None:
        if self._sink is None:
            self._early.append(data)
        else:
            self._sink._receive(data)

    def eof_received(self) -> bool:
        self._end(None)
        return True  # half-closed: answers may still go out; _shutdown closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)
        super().connection_lost(exc)

    def _end(self, exc: BaseException | None) -> None:
        if self._sink is None:
            if self._early_end is None:
                self._early_end = (exc,)
        else:  # on the next turn, as a read task would: the requests' tasks start first
            asyncio.get_running_loop().call_soon(self._sink._receive_end, exc)


class MuxConnection:
    """An NRI socket: ttrpc servers and clients on its logical connections.

    Keep a reference to it while it is in use: asyncio holds a stream's reader
    only weakly, so an unreferenced connection and its read task can be
    garbage-collected while the peer is still talking.

    Made by `connect` or `from_socket`, it is fed by the socket's own
    callbacks (the plugin's hot path: one event-loop turn less per request);
    made from a (reader, writer) pair, by a task reading the stream.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        _push: _PushProtocol | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._mux = MuxDecoder((PLUGIN_CONN, RUNTIME_CONN))
        self._conns: dict[int, _Logical] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed_event = asyncio.Event()
        self.closed = False
        self.error: BaseException | None = None
        """Why the connection ended: None for a clean close or EOF."""
        self._read_task: asyncio.Task[None] | None = None
        if _push is None:
            self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        else:
            _push.attach(self)

    @classmethod
    async def connect(cls, path: str) -> Self:
        """Connect to a unix socket (e.g. /var/run/nri/nri.sock)."""
        loop = asyncio.get_running_loop()
        protocol = _PushProtocol(asyncio.StreamReader())
        transport, _ = await loop.create_unix_connection(lambda: protocol, path)
        return cls._pushed(transport, protocol)

    @classmethod
    async def from_socket(cls, sock: socket.socket) -> Self:
        """Use a connected stream socket (e.g. fd 3 handed over by the runtime)."""
        loop = asyncio.get_running_loop()
        protocol = _PushProtocol(asyncio.StreamReader())
        if sock.family == socket.AF_UNIX:
            transport, _ = await loop.create_unix_connection(lambda: protocol, sock=sock)
        else:
            transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
        return cls._pushed(transport, protocol)

    @classmethod
    def _pushed(cls, transport: asyncio.BaseTransport, protocol: _PushProtocol) -> Self:
        loop = asyncio.get_running_loop()
        reader = protocol.reader
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)  # type: ignore[arg-type]
        return cls(reader, writer, _push=protocol)

    @property
    def dropped_frames(self) -> dict[int, int]:
        """Frames dropped per unknown conn id."""
        return dict(self._mux.dropped_frames)

    def serve(self, conn_id: int, handler: Handler) -> None:
        """Answer ttrpc requests arriving on `conn_id` with `handler`."""
        self._logical(conn_id).handler = handler

    def client(self, conn_id: int) -> TtrpcClient:
        """A ttrpc client calling the peer over `conn_id`."""
        self._logical(conn_id)
        return TtrpcClient(self, conn_id)

    async def close(self) -> None:
        """Close the socket; pending calls fail with ConnectionClosed."""
        self._shutdown(None)
        tasks = list(self._tasks)
        if self._read_task is not None:
            self._read_task.cancel()
            tasks.append(self._read_task)
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(self._writer.wait_closed(), CLOSE_FLUSH_TIMEOUT)
        except TimeoutError:  # the peer does not read: drop what is left
            self._writer.transport.abort()
        except (ConnectionError, OSError):
            pass

    async def wait_closed(self) -> None:
        """Return once the connection has ended (peer close, protocol error or close())."""
        await self._closed_event.wait()

    # internals

    def _logical(self, conn_id: int) -> _Logical:
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = self._conns[conn_id] = _Logical(conn_id)
            self._mux.conn_ids.add(conn_id)
        return conn

    async def _read_loop(self) -> None:
        error: BaseException | None = None
        try:
            while data := await self._reader.read(_READ_SIZE):
                self._feed(data)
            self._feed_eof()
        except (ProtocolError, OSError) as exc:
            log.warning("NRI connection failed: %s", exc)
            error = exc
        except Exception as exc:  # a bug here must still end the connection visibly
            log.exception("NRI connection reader failed")
            error = exc
        finally:
            self._shutdown(error)

    def _feed(self, data: bytes) -> None:
        for conn_id, chunk in self._mux.feed(data):
            self._dispatch(conn_id, chunk)

    def _feed_eof(self) -> None:
        self._mux.close()
        for conn in self._conns.values():
            try:
                conn.ttrpc.receive_eof()
            except ProtocolError as exc:
                raise ProtocolError(f"conn {conn.conn_id}: {exc}") from exc

    def _receive(self, data: bytes) -> None:
        """Socket data, pushed (see `_PushProtocol`)."""
        if self.closed:
            return
        try:
            self._feed(data)
        except ProtocolError as exc:
            log.warning("NRI connection failed: %s", exc)
            self._shutdown(exc)
        except Exception as exc:  # a bug here must still end the connection visibly
            log.exception("NRI connection reader failed")
            self._shutdown(exc)

    def _receive_end(self, exc: BaseException | None) -> None:
        """The socket's end, pushed: EOF (None) or the error that ended it."""
        if self.closed:
            return
        if exc is None:
            try:
                self._feed_eof()
            except ProtocolError as error:
                exc = error
        if exc is not None:
            log.warning("NRI connection failed: %s", exc)
        self._shutdown(exc)

    def _dispatch(self, conn_id: int, data: bytes) -> None:
        conn = self._logical(conn_id)
        try:
            events = conn.ttrpc.receive_data(data)
        except ProtocolError as exc:
            raise ProtocolError(f"conn {conn_id}: {exc}") from exc
        for event in events:
            if isinstance(event, RequestReceived):
                task = asyncio.get_running_loop().create_task(
                    self._handle(conn, event.stream_id, event.request)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                future = conn.pending.pop(event.stream_id, None)
                if future is not None and not future.done():
                    future.set_result(event.response)

    async def _handle(self, conn: _Logical, stream_id: int, request: Request) -> None:
        response = await self._respond(conn, request)
        try:
            data = conn.ttrpc.send_response(stream_id, response)
        except MessageTooLarge as exc:
            log.error("response to %s/%s: %s", request.service, request.method, exc)
            data = conn.ttrpc.send_response(stream_id, Response(Code.INTERNAL, str(exc)))
        await self._send(conn.conn_id, data)

    async def _respond(self, conn: _Logical, request: Request) -> Response:
        if conn.handler is None:
            return Response(Code.UNIMPLEMENTED, f"no service on conn {conn.conn_id}")
        try:
            payload = await conn.handler(request.service, request.method, request.payload)
        except TtrpcError as exc:
            return Response(int(exc.code), exc.message)
        except Exception as exc:
            log.exception("handler for %s/%s failed", request.service, request.method)
            return Response(Code.INTERNAL, describe_error(exc))
        if not isinstance(payload, bytes | bytearray | memoryview):
            message = f"handler returned {type(payload).__name__}, not bytes"
            log.error("%s/%s: %s", request.service, request.method, message)
            return Response(Code.INTERNAL, message)
        return Response(payload=bytes(payload))

    async def _send(self, conn_id: int, data: bytes) -> None:
        if self.closed:
            return
        self._writer.write(b"".join(encode_frames(conn_id, data)))
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            pass  # the read loop sees the end of the connection and fails pending calls

    def _shutdown(self, error: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = error
        reason = f"NRI connection closed: {error}" if error else "NRI connection closed"
        for conn in self._conns.values():
            for future in conn.pending.values():
                if not future.done():
                    exc = ConnectionClosed(reason)
                    exc.__cause__ = error
                    future.set_exception(exc)
            conn.pending.clear()
        for task in self._tasks:
            task.cancel()
        if error is None:
            self._writer.close()  # flushes what is queued
        else:
            self._writer.transport.abort()
        self._closed_event.set()


class TtrpcClient:
    """Unary ttrpc calls over one logical connection."""

    def __init__(self, connection: MuxConnection, conn_id: int) -> None:
        self._connection = connection
        self.conn_id = conn_id

    async def call(
        self, service: str, method: str, payload: bytes, timeout: float | None = None
    ) -> bytes:
        """Call service/method; return the response payload.

        Raises TtrpcError for a non-OK status (DEADLINE_EXCEEDED when `timeout`
        seconds pass without a response), ConnectionClosed if the connection ends.
        """
        mux = self._connection
        if mux.closed:
            raise ConnectionClosed("NRI connection closed")
        conn = mux._logical(self.conn_id)
        timeout_nano = int(timeout * 1e9) if timeout is not None else 0
        stream_id, data = conn.ttrpc.send_request(
            Request(service, method, payload, timeout_nano=max(timeout_nano, 0))
        )
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        conn.pending[stream_id] = future
        try:
            async with asyncio.timeout(timeout):
                await mux._send(self.conn_id, data)
                response = await future
        except TimeoutError:
            raise TtrpcError(
                Code.DEADLINE_EXCEEDED, f"{service}/{method}: no response within {timeout} s"
            ) from None
        finally:
            if conn.pending.pop(stream_id, None) is not None:
                conn.ttrpc.abandon(stream_id)
        if response.code != Code.OK:
            raise TtrpcError(response.code, response.message)
        return response.payload
