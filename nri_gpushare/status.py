"""The local status socket: `nri-gpushare status` asks the running plugin.

Protocol: connect to the unix socket, the plugin writes one JSON document
and closes.  Nothing is read from the client, so the socket cannot be used to
change anything; it is created mode 0660.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any


class StatusServer:
    def __init__(self, path: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._snapshot = snapshot
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o660)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(json.dumps(self._snapshot()).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def query_status(path: str, timeout: float = 5.0) -> dict[str, Any]:
    """Fetch the running plugin's status (blocking; for the CLI)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    document = json.loads(b"".join(chunks))
    if not isinstance(document, dict):
        raise ValueError("the status reply is not a JSON object")
    return document
