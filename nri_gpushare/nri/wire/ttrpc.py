"""Sans-IO ttrpc: message framing, Request/Response envelopes, per-connection state.

A ttrpc message is a 10-byte big-endian header (uint32 payload length, uint32
stream id, uint8 type, uint8 flags) followed by the payload. Unary calls use a
request (type 1) answered by a response (type 2) on the same stream id; client
stream ids are odd and increase (gaps allowed). Streaming (type 3) is not used
by NRI and is refused.

Size limits: we send at most 4 MiB of payload per message (ttrpc's limit). We
accept bigger messages, because runtimes do send them (a 6 MB Synchronize has
been seen), up to MAX_RECEIVE_MESSAGE (64 MiB), beyond which the declared length
is taken as garbage. That bounds the buffer on malformed input.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final, NamedTuple

from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import (
    Code,
    DecodeError,
    MessageTooLarge,
    ProtocolError,
    WireError,
    as_code,
)

HEADER = struct.Struct(">IIBB")
MAX_SEND_MESSAGE = 4 << 20
MAX_RECEIVE_MESSAGE = 64 << 20
_MAX_STREAM_ID = 0xFFFFFFFF


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Message(NamedTuple):
    stream_id: int
    type: int
    payload: bytes
    flags: int = 0


def encode_message(
    stream_id: int,
    type: int,
    payload: bytes,
    flags: int = 0,
    *,
    max_length: int = MAX_SEND_MESSAGE,
) -> bytes:
    """Header plus payload of one ttrpc message; refuses payloads over `max_length`."""
    if len(payload) > max_length:
        raise MessageTooLarge(
            f"ttrpc message of {len(payload)} bytes exceeds the {max_length}-byte limit"
        )
    return HEADER.pack(len(payload), stream_id, type, flags) + payload


class MessageDecoder:
    """Reassembles ttrpc messages from a byte stream."""

    def __init__(self, max_length: int = MAX_RECEIVE_MESSAGE) -> None:
        self.max_length = max_length
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    def feed(self, data: bytes) -> list[Message]:
        if self._error:
            raise self._error
        if not self._buf and len(data) >= HEADER.size:
            # The usual case: the data starts with a message, maybe ends with one.
            length, stream_id, type, flags = HEADER.unpack_from(data)
            end = HEADER.size + length
            if end == len(data) and length <= self.max_length:
                return [Message(stream_id, type, data[HEADER.size :], flags)]
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            length, stream_id, type, flags = HEADER.unpack_from(self._buf)
            if length > self.max_length:
                self._error = ProtocolError(
                    f"ttrpc message on stream {stream_id} declares {length} bytes,"
                    f" more than the limit of {self.max_length}"
                )
                raise self._error
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            with memoryview(self._buf) as view:  # one copy, not two
                payload = bytes(view[HEADER.size : end])
            out.append(Message(stream_id, type, payload, flags))
            del self._buf[:end]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def close(self) -> None:
        """Signal end of input; raise ProtocolError if it cut a message short."""
        if self._buf:
            raise ProtocolError(
                f"connection ended inside a ttrpc message ({len(self._buf)} bytes buffered)"
            )


class RequestField:
    """Field numbers of ttrpc's Request."""

    SERVICE: Final = 1
    METHOD: Final = 2
    PAYLOAD: Final = 3
    TIMEOUT_NANO: Final = 4
    METADATA: Final = 5


class KeyValueField:
    KEY: Final = 1
    VALUE: Final = 2


class ResponseField:
    STATUS: Final = 1
    PAYLOAD: Final = 2


class StatusField:
    CODE: Final = 1
    MESSAGE: Final = 2
    DETAILS: Final = 3  # repeated Any: skipped


_RQ = RequestField
_REQUEST_LEN = (_RQ.SERVICE, _RQ.METHOD, _RQ.PAYLOAD, _RQ.METADATA)
_REQUEST: pb.WireTypes = dict.fromkeys(_REQUEST_LEN, pb.LEN) | {_RQ.TIMEOUT_NANO: pb.VARINT}
_KEY_VALUE: pb.WireTypes = {KeyValueField.KEY: pb.LEN, KeyValueField.VALUE: pb.LEN}
_RESPONSE: pb.WireTypes = {ResponseField.STATUS: pb.LEN, ResponseField.PAYLOAD: pb.LEN}
_STATUS: pb.WireTypes = {StatusField.CODE: pb.VARINT, StatusField.MESSAGE: pb.LEN}
_OK_STATUS = pb.len_field(ResponseField.STATUS, b"")


class Request(NamedTuple):
    """ttrpc Request {service=1, method=2, payload=3, timeout_nano=4, metadata=5}."""

    service: str
    method: str
    payload: bytes = b""
    timeout_nano: int = 0
    metadata: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        F, KV = RequestField, KeyValueField
        parts = [
            pb.string_field(F.SERVICE, self.service),
            pb.string_field(F.METHOD, self.method),
            pb.bytes_field(F.PAYLOAD, self.payload),
            pb.varint_field(F.TIMEOUT_NANO, self.timeout_nano),
        ]
        for k, v in self.metadata:
            entry = pb.string_field(KV.KEY, k) + pb.string_field(KV.VALUE, v)
            parts.append(pb.len_field(F.METADATA, entry))
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> Request:
        fast = _decode_usual_request(data)
        if fast is not None:
            return fast
        what = "ttrpc Request"
        F = RequestField
        service = method = ""
        payload = b""
        timeout = 0
        metadata: list[tuple[str, str]] = []
        for field, value in pb.fields(data, what, _REQUEST):
            if field == F.SERVICE:
                service = pb.text(value, what, field)
            elif field == F.METHOD:
                method = pb.text(value, what, field)
            elif field == F.PAYLOAD:
                payload = value
            elif field == F.TIMEOUT_NANO:
                timeout = pb.signed(value, 64)
            elif field == F.METADATA:
                metadata.append(_decode_key_value(value))
        return cls(service, method, payload, timeout, tuple(metadata))


def _decode_usual_request(data: bytes) -> Request | None:
    """A Request as ttrpc's Go client writes it (service 1, method 2, payload 3,
    timeout 4 in that order, one-byte service and method lengths, no
    metadata), without the general walk; None for anything else (the general
    walk then decodes it, or names what is wrong)."""
    n = len(data)
    if n < 4 or data[0] != 0x0A or data[1] > 0x7F:
        return None
    p = 2 + data[1]
    if p + 2 > n or data[p] != 0x12 or data[p + 1] > 0x7F:
        return None
    m = p + 2 + data[p + 1]
    try:
        service, method = data[2:p].decode(), data[p + 2 : m].decode()
    except UnicodeDecodeError:
        return None
    payload = b""
    timeout = 0
    try:
        if m < n and data[m] == 0x1A:
            size, pos = pb.read_varint(data, m + 1, "", n)
            m = pos + size
            if m > n:
                return None
            payload = data[pos:m]
        if m < n and data[m] == 0x20:
            timeout, m = pb.read_varint(data, m + 1, "", n)
            timeout = pb.signed(timeout, 64)
    except DecodeError:
        return None
    if m != n:
        return None
    return Request(service, method, payload, timeout)


def _decode_key_value(data: bytes) -> tuple[str, str]:
    what = "ttrpc KeyValue"
    key = value = ""
    for field, raw in pb.fields(data, what, _KEY_VALUE):
        if field == KeyValueField.KEY:
            key = pb.text(raw, what, field)
        elif field == KeyValueField.VALUE:
            value = pb.text(raw, what, field)
    return key, value


class Response(NamedTuple):
    """ttrpc Response {status=1 {code=1, message=2}, payload=2}."""

    code: int = Code.OK
    message: str = ""
    payload: bytes = b""

    def encode(self) -> bytes:
        # Like ttrpc's Go server, always include the status, even for OK.
        if not self.code and not self.message:
            return _OK_STATUS + pb.bytes_field(ResponseField.PAYLOAD, self.payload)
        status = pb.varint_field(StatusField.CODE, int(self.code)) + pb.string_field(
            StatusField.MESSAGE, self.message
        )
        return pb.len_field(ResponseField.STATUS, status) + pb.bytes_field(
            ResponseField.PAYLOAD, self.payload
        )

    @classmethod
    def decode(cls, data: bytes) -> Response:
        what = "ttrpc Response"
        code: int = Code.OK
        message = ""
        payload = b""
        for field, value in pb.fields(data, what, _RESPONSE):
            if field == ResponseField.STATUS:
                code, message = _decode_status(value)
            elif field == ResponseField.PAYLOAD:
                payload = value
        return cls(code, message, payload)


def _decode_status(data: bytes) -> tuple[int, str]:
    what = "ttrpc Status"
    code: int = Code.OK
    message = ""
    for field, value in pb.fields(data, what, _STATUS):
        if field == StatusField.CODE:
            code = as_code(pb.signed(value, 32))
        elif field == StatusField.MESSAGE:
            message = pb.text(value, what, field)
    return code, message


class RequestReceived(NamedTuple):
    stream_id: int
    request: Request


class ResponseReceived(NamedTuple):
    stream_id: int
    response: Response


Event = RequestReceived | ResponseReceived


class TtrpcConnection:
    """State of one ttrpc byte stream, in both roles at once.

    As a client it allocates stream ids and matches responses to requests; as a
    server it checks the peer's stream ids and tracks which requests still owe
    a response. It never touches a socket: feed it bytes, send what it returns.
    """

    def __init__(
        self,
        *,
        max_send: int = MAX_SEND_MESSAGE,
        max_receive: int = MAX_RECEIVE_MESSAGE,
    ) -> None:
        self.max_send = max_send
        self._decoder = MessageDecoder(max_receive)
        self._next_id = 1
        self._awaiting: set[int] = set()  # our requests without a response yet
        self._abandoned: set[int] = set()  # our requests whose response we ignore
        self._last_peer_id = 0
        self._unanswered: set[int] = set()  # peer requests we still owe a response

    # client role

    def send_request(self, request: Request) -> tuple[int, bytes]:
        """Allocate a stream id for `request`; return it and the bytes to send."""
        if self._next_id > _MAX_STREAM_ID:
            raise WireError("ttrpc stream ids exhausted on this connection")
        data = encode_message(
            self._next_id, MessageType.REQUEST, request.encode(), max_length=self.max_send
        )
        stream_id = self._next_id
        self._next_id += 2
        self._awaiting.add(stream_id)
        return stream_id, data

    def abandon(self, stream_id: int) -> None:
        """Stop waiting for a response (e.g. timed out); a late one is then ignored."""
        if stream_id in self._awaiting:
            self._awaiting.discard(stream_id)
            self._abandoned.add(stream_id)

    @property
    def awaiting(self) -> frozenset[int]:
        return frozenset(self._awaiting)

    # server role

    def send_response(self, stream_id: int, response: Response) -> bytes:
        """Bytes answering the peer's request `stream_id` (exactly once)."""
        if stream_id not in self._unanswered:
            raise ValueError(f"no unanswered request on stream {stream_id}")
        data = encode_message(
            stream_id, MessageType.RESPONSE, response.encode(), max_length=self.max_send
        )
        self._unanswered.discard(stream_id)
        return data

    @property
    def unanswered(self) -> frozenset[int]:
        return frozenset(self._unanswered)

    # input

    def receive_data(self, data: bytes) -> list[Event]:
        """Consume stream bytes; return the complete requests and responses in them."""
        return [
            event
            for message in self._decoder.feed(data)
            if (event := self._receive(message)) is not None
        ]

    def receive_eof(self) -> None:
        """The stream ended; raise ProtocolError if it ended inside a message."""
        self._decoder.close()

    def _receive(self, message: Message) -> Event | None:
        sid = message.stream_id
        if message.type == MessageType.REQUEST:
            if sid % 2 == 0:
                raise ProtocolError(f"ttrpc request on even stream id {sid}; must be odd")
            if sid <= self._last_peer_id:
                raise ProtocolError(
                    f"ttrpc request on stream {sid}, not above the previous {self._last_peer_id}"
                )
            request = Request.decode(message.payload)
            self._last_peer_id = sid
            self._unanswered.add(sid)
            return RequestReceived(sid, request)
        if message.type == MessageType.RESPONSE:
            if sid in self._awaiting:
                self._awaiting.discard(sid)
                return ResponseReceived(sid, Response.decode(message.payload))
            if sid in self._abandoned:
                self._abandoned.discard(sid)
                Response.decode(message.payload)  # still refuse garbage
                return None
            raise ProtocolError(f"ttrpc response for unknown stream id {sid}")
        if message.type == MessageType.DATA:
            raise ProtocolError(f"unexpected ttrpc data message on stream {sid} (no streaming)")
        raise ProtocolError(f"unknown ttrpc message type {message.type} on stream {sid}")
