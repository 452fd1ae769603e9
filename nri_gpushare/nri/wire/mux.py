"""Sans-IO codec of the NRI connection multiplexer.

One socket carries several logical byte streams. Every frame is an 8-byte
big-endian header (uint32 conn_id, uint32 payload_len) followed by the payload.
Conn 1 carries the plugin service (the runtime calls us), conn 2 the runtime
service (we call the runtime). There is no handshake.

Sending: the runtime's reader accepts frames of at most 4096 bytes, and a frame
must not hold bytes of two ttrpc messages. `encode_frames` therefore splits one
message into frames of at most 4096 bytes *including* the header, the
conservative reading of the limit; callers pass one message per call.

Receiving: each known conn id is a byte stream. Payload bytes are handed on as
soon as they arrive, so the decoder buffers at most one partial header whatever
the frame sizes. Frames for unknown conn ids are dropped and counted (or refused
with `strict=True`).
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Iterable

from nri_gpushare.nri.wire.errors import ProtocolError

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
PLUGIN_CONN = 1
"""Plugin service: the runtime is the ttrpc client, the plugin serves."""
RUNTIME_CONN = 2
"""Runtime service: the plugin is the ttrpc client."""
MAX_FRAME = 4096
"""Largest frame we send, header included."""
MAX_FRAME_PAYLOAD = MAX_FRAME - HEADER.size
MAX_RECEIVE_FRAME = 64 << 20
"""Largest frame payload we accept: far above any legal message (see ttrpc)."""
_UINT32_MAX = 0xFFFFFFFF


def encode_frames(conn_id: int, data: bytes, max_frame: int = MAX_FRAME) -> list[bytes]:
    """Frames carrying `data` (one whole ttrpc message) on `conn_id`."""
    if not 0 <= conn_id <= _UINT32_MAX:
        raise ValueError(f"conn id {conn_id} does not fit in uint32")
    step = max_frame - HEADER.size
    if step <= 0:
        raise ValueError(f"max_frame {max_frame} leaves no room for payload")
    if 0 < len(data) <= step:  # the usual case: one frame
        return [HEADER.pack(conn_id, len(data)) + data]
    view = memoryview(data)
    return [
        HEADER.pack(conn_id, len(chunk)) + chunk
        for chunk in (bytes(view[i : i + step]) for i in range(0, len(view), step))
    ]


class MuxDecoder:
    """Turns socket bytes into (conn_id, bytes) pieces of the logical streams."""

    def __init__(
        self,
        conn_ids: Iterable[int] = (PLUGIN_CONN, RUNTIME_CONN),
        *,
        strict: bool = False,
        max_frame_payload: int = MAX_RECEIVE_FRAME,
    ) -> None:
        self.conn_ids = set(conn_ids)
        self.strict = strict
        self.max_frame_payload = max_frame_payload
        self.dropped_frames: Counter[int] = Counter()
        """Frames dropped per unknown conn id."""
        self._header = bytearray()
        self._conn = 0
        self._left = 0  # payload bytes of the current frame still to come
        self._keep = False  # whether the current frame's conn id is known
        self._frame_len = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Consume socket bytes; return payload pieces in order, merged per run of one conn."""
        if not self._left and not self._header and len(data) >= HEADER.size:
            # The usual case: the data is exactly one frame of a known conn.
            conn_id, length = HEADER.unpack_from(data)
            if HEADER.size + length == len(data) and length and conn_id in self.conn_ids:
                self._start_frame(conn_id, length)
                self._left = 0
                return [(conn_id, bytes(data[HEADER.size :]))]
        # A run's pieces are views of `data`, joined once: one copy of a
        # payload, not two (a Synchronize brings 80 MiB in 4 KiB frames).
        out: list[tuple[int, list[memoryview]]] = []
        view = memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                if self._keep:
                    if out and out[-1][0] == self._conn:
                        out[-1][1].append(view[pos : pos + take])
                    else:
                        out.append((self._conn, [view[pos : pos + take]]))
                pos += take
                self._left -= take
                continue
            need = HEADER.size - len(self._header)
            self._header += view[pos : pos + need]
            pos += min(need, end - pos)
            if len(self._header) < HEADER.size:
                break
            self._start_frame(*HEADER.unpack(self._header))
            self._header.clear()
        return [(conn, b"".join(pieces)) for conn, pieces in out]

    def _start_frame(self, conn_id: int, length: int) -> None:
        if length > self.max_frame_payload:
            raise ProtocolError(
                f"mux frame for conn {conn_id} declares {length} payload bytes,"
                f" more than the limit of {self.max_frame_payload}"
            )
        known = conn_id in self.conn_ids
        if not known:
            if self.strict:
                raise ProtocolError(f"mux frame for unknown conn id {conn_id}")
            if not self.dropped_frames[conn_id]:
                log.warning("dropping mux frames for unknown conn id %d", conn_id)
            self.dropped_frames[conn_id] += 1
        self._conn, self._left, self._keep, self._frame_len = conn_id, length, known, length

    @property
    def idle(self) -> bool:
        """True when no partial frame is buffered (a clean place for the stream to end)."""
        return not self._header and not self._left

    def close(self) -> None:
        """Signal end of input; raise ProtocolError if it cut a frame short."""
        if self._header:
            raise ProtocolError(
                f"connection ended inside a mux frame header"
                f" ({len(self._header)} of {HEADER.size} bytes)"
            )
        if self._left:
            raise ProtocolError(
                f"connection ended inside a mux frame for conn {self._conn}"
                f" ({self._frame_len - self._left} of {self._frame_len} payload bytes)"
            )
