"""containerd's trouble as ContainerdError subclasses: the socket is missing or
refuses, or containerd went away or did not answer in time
(ContainerdUnavailable); the peer does not speak containerd's API
(NotContainerd); no such container (ContainerNotFound).  `translated` turns
grpclib's and the socket's errors into them, probing the socket to tell
containerd from another peer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Literal

import h2.exceptions
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError


class ContainerdError(RuntimeError):
    """containerd could not answer a request."""


class ContainerdUnavailable(ContainerdError):
    """The socket is missing, not a socket, or refuses connections."""


class NotContainerd(ContainerdError):
    """Something answers on the socket, but not containerd's gRPC API."""


class ContainerNotFound(ContainerdError, LookupError):
    """No container with that ID in that namespace."""

    def __init__(self, namespace: str, container_id: str) -> None:
        super().__init__(f"containerd has no container {container_id!r} in namespace {namespace!r}")
        self.namespace = namespace
        self.container_id = container_id


# grpclib's own errors for a response that is not a well-formed gRPC one (an
# HTTP/2 server that is not gRPC, or a gRPC server without the method).
_PROTOCOL_ERRORS = (
    "Received :status",
    "Missing content-type",
    "Invalid content-type",
    "Missing grpc-status",
    "Invalid grpc-status",
)


def _protocol_level(exc: GRPCError) -> bool:
    return (exc.message or "").startswith(_PROTOCOL_ERRORS)


# An HTTP/2 client's connection preface and an empty SETTINGS frame: any HTTP/2
# server (containerd's gRPC one included, even when busy) answers with SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04


async def _probe(socket_path: str, timeout: float) -> Literal["http2", "nobody", "other"]:
    """What answers on the socket now: "http2" (a SETTINGS frame back to a
    preface), "nobody" (cannot connect), or "other" (anything else)."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        return "nobody"
    try:
        writer.write(_H2_PREFACE)
        header = await asyncio.wait_for(reader.readexactly(9), timeout)
        return "http2" if header[3] == _H2_SETTINGS else "other"
    except (OSError, asyncio.IncompleteReadError):
        return "other"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _not_containerd(socket_path: str, what: str, why: str) -> NotContainerd:
    return NotContainerd(
        f"{socket_path}: the peer {why} during {what}; is this containerd's gRPC socket "
        "(not its ttrpc socket)?"
    )


@contextlib.asynccontextmanager
async def translated(socket_path: str, what: str, timeout: float) -> AsyncIterator[None]:
    """Turn grpclib's and the socket's errors into ContainerdErrors."""
    try:
        yield
    except TimeoutError as exc:
        if await _probe(socket_path, timeout) != "http2":
            raise _not_containerd(socket_path, what, "does not answer HTTP/2") from exc
        raise ContainerdUnavailable(
            f"{socket_path}: containerd did not answer {what} within {timeout:g}s"
        ) from exc
    except GRPCError as exc:
        if exc.status is Status.UNIMPLEMENTED or _protocol_level(exc):
            why = f"does not implement containerd's API ({exc.message or exc.status.name})"
            raise _not_containerd(socket_path, what, why) from exc
        if exc.status is Status.UNAVAILABLE:
            raise ContainerdUnavailable(f"{socket_path}: {what}: {exc.message}") from exc
        raise ContainerdError(
            f"containerd {what} failed: {exc.status.name}: {exc.message}"
        ) from exc
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ContainerdUnavailable(
            f"{socket_path}: cannot connect ({exc.strerror}); is containerd running?"
        ) from exc
    except (ProtocolError, h2.exceptions.ProtocolError) as exc:
        raise _not_containerd(socket_path, what, f"does not speak gRPC ({exc})") from exc
    except (StreamTerminatedError, ConnectionError, EOFError) as exc:
        # Lost: containerd went away (or restarts), or the peer is no HTTP/2 server.
        if await _probe(socket_path, timeout) == "other":
            raise _not_containerd(socket_path, what, f"closed the connection ({exc!r})") from exc
        raise ContainerdUnavailable(
            f"{socket_path}: the connection to containerd was lost during {what} ({exc!r})"
        ) from exc
    except OSError as exc:
        raise ContainerdUnavailable(f"{socket_path}: {what}: {exc}") from exc
