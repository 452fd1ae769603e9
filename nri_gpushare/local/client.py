"""The blocking client of the local API, for the CDI hook and gpushare-runc.

Standard library only, and nothing else of the package is imported: these
programs run in every container start.
"""

from __future__ import annotations

import socket
import time

from nri_gpushare.local.protocol import (
    MAX_MESSAGE,
    ProtocolError,
    Reply,
    Request,
    decode_reply,
    encode_request,
)

DEFAULT_SOCKET = "/run/nri-gpushare/api.sock"
DEFAULT_TIMEOUT = 10.0


class Unavailable(OSError):
    """The daemon cannot be asked (not running, socket missing, no answer in time)."""


def ask(request: Request, path: str = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT) -> Reply:
    """Send `request`, wait for the reply.  Unavailable when the daemon cannot
    be reached or does not answer; ProtocolError when it answers nonsense."""
    data = encode_request(request)
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            _connect(sock, path, deadline)
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            chunks, size = [], 0
            while True:
                # `timeout` bounds the whole exchange, not each read of it.
                sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                if not (chunk := sock.recv(65536)):
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_MESSAGE:
                    raise ProtocolError("reply too long")
    except TimeoutError:
        raise Unavailable(
            f"the nri-gpushare daemon ({path}) did not answer in {timeout:g} s"
        ) from None
    except OSError as e:
        raise Unavailable(
            f"cannot reach the nri-gpushare daemon at {path}: {e.strerror or e}; is it running?"
        ) from e
    if not chunks:
        raise Unavailable(f"the nri-gpushare daemon ({path}) closed without answering")
    return decode_reply(b"".join(chunks))


def _connect(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect, waiting out a full listen backlog (a busy daemon: EAGAIN, as a
    unix socket with a timeout reports it) until `deadline`."""
    pause = 0.002
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise TimeoutError from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
