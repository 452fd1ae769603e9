"""The local API's server in the daemon: a unix socket only root can use.

The socket is created mode 0600 in the daemon's runtime directory (checked
as the status socket's is), and every connection's peer credentials
(SO_PEERCRED) are checked too: only uid 0 or the daemon's own uid is
answered, so a socket made reachable by mistake (a bind mount into a
container) grants nothing to a container that does not run as host root.
Root in a container without a user namespace is uid 0 here and is served
like the node's runtime (it could ask for any bundle's config.json to be
read and given a share): never mount this socket into a container.  One
request per connection, read until
the client shuts its side or `MAX_MESSAGE` bytes, under a deadline; a
client that stalls or sends garbage gets an error and costs nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable

from nri_gpushare.host.sockets import UnixServer
from nri_gpushare.local.protocol import (
    MAX_MESSAGE,
    ProtocolError,
    Reply,
    Request,
    decode_request,
    encode_reply,
)

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
READ_WITHIN = 5.0
"""Seconds a client has to send its request."""

Handler = Callable[[Request], Awaitable[Reply]]
Undelivered = Callable[[Request, Reply], Awaitable[None]]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class LocalApiServer(UnixServer):
    MODE = SOCKET_MODE
    KEY = "api_socket"

    def __init__(self, path: str, handler: Handler, undelivered: Undelivered | None = None) -> None:
        super().__init__(path)
        self._handler = handler
        #: Told of a reply that could not be written (its caller went away).
        self._undelivered = undelivered
        self.requests = 0
        self.refused_peers = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else -1
            allowed = uid in (0, os.geteuid())
            if not allowed:
                self.refused_peers += 1
                log.warning("local API: refused a connection from uid %d (root only)", uid)
            # The request is read even from a refused peer: closing with it
            # unread would reset the connection before the peer reads why.
            request, reply = await self._answer(reader, allowed)
            try:
                writer.write(encode_reply(reply))
                await writer.drain()
            except (ConnectionError, ProtocolError):
                if request is not None and self._undelivered is not None:
                    await self._undelivered(request, reply)
                raise
        except (ConnectionError, ProtocolError) as e:
            log.debug("local API: client went away: %s", e)
        finally:
            writer.close()

    async def _answer(
        self, reader: asyncio.StreamReader, allowed: bool = True
    ) -> tuple[Request | None, Reply]:
        try:
            async with asyncio.timeout(READ_WITHIN):
                data = await reader.read(MAX_MESSAGE + 1)
                while data and not reader.at_eof() and len(data) <= MAX_MESSAGE:
                    more = await reader.read(MAX_MESSAGE + 1 - len(data))
                    if not more:
                        break
                    data += more
        except TimeoutError:
            return None, Reply.refused(f"gpushare: no request within {READ_WITHIN:g} s", "protocol")
        if not allowed:
            return None, Reply.refused("gpushare: the local API answers root only", "forbidden")
        try:
            request = decode_request(data)
        except ProtocolError as e:
            log.warning("local API: a request that is not one: %s", e)
            return None, Reply.refused(f"gpushare: bad request: {e}", "protocol")
        self.requests += 1
        try:
            return request, await self._handler(request)
        except Exception as e:  # a bug must not leave the caller without an answer
            log.exception("local API: %s %s/%s failed", request.op, request.namespace, request.id)
            return request, Reply.refused(
                f"gpushare: internal error handling {request.op} ({type(e).__name__}); "
                f"see the nri-gpushare log",
                "internal",
            )
