"""The local status socket: `nri-gpushare status` asks the running plugin.

Protocol: connect to the unix socket, the plugin writes one JSON document
and closes.  Nothing is read from the client, so the socket cannot be used to
change anything.  The socket's mode and directory: `nri_gpushare.host.sockets`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from nri_gpushare.host.sockets import UnixServer

Snapshot = Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]]


class StatusServer(UnixServer):
    """`snapshot` gives the document, or an awaitable of it (e.g. when part of
    it is read from the kernel module off the event loop)."""

    def __init__(self, path: str, snapshot: Snapshot) -> None:
        super().__init__(path)
        self._snapshot = snapshot

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            document = self._snapshot()
            if inspect.isawaitable(document):
                document = await document
            writer.write(json.dumps(document).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()
