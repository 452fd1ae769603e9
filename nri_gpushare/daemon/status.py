"""The daemon's status document and the local status socket that serves it:
`nri-gpushare status` asks the running plugin.

The document is the share service's status (GPUs, allocations, the kernel
module, unserved containers) with the daemon's own: its version, the NRI
connection and its handlers' times, the local API, containerd.  The metrics
are computed from the same document.

Protocol: connect to the unix socket, the plugin writes one JSON document
and closes.  Nothing is read from the client, so the socket cannot be used to
change anything.  The socket's mode and directory: `nri_gpushare.host.sockets`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nri_gpushare.daemon.local_server import LocalApiServer
from nri_gpushare.host.containerd.reconcile import Reconciler
from nri_gpushare.host.sockets import UnixServer
from nri_gpushare.nri.stub import Stub
from nri_gpushare.share.service import ShareService

Snapshot = Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]]


@functools.cache
def plugin_version() -> str:
    """The installed package's version ("unknown" when run from a bare tree)."""
    try:
        return importlib.metadata.version("nri-gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def handler_summary(samples: Iterable[float]) -> dict[str, float]:
    """Count, median and p99 of recent handler times, in milliseconds."""
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"count": len(ordered), "p50": pick(0.5), "p99": pick(0.99)}


@dataclass
class StatusDocument:
    """Makes the document (awaited: memory in use is read from the module)."""

    service: ShareService
    stub: Stub
    local_api: LocalApiServer
    api_socket: str
    containerd_socket: str
    reconciler: Reconciler | None

    async def __call__(self) -> dict[str, Any]:
        service, stub = self.service, self.stub
        memory = await service.read_usage()
        nri_state = {
            "connected": stub.synchronized.is_set(),
            "sessions": stub.sessions,
            "last_error": stub.last_error,
            "handler_ms": {
                method: handler_summary(samples) for method, samples in stub.handler_seconds.items()
            },
        }
        containerd = (
            {"socket": self.containerd_socket, **self.reconciler.state()}
            if self.reconciler is not None
            else {"socket": "", "connected": False, "last_error": "containerd.socket is off"}
        )
        return {
            "version": plugin_version(),
            **service.status(memory),
            "nri": nri_state,
            "local_api": {"socket": self.api_socket, "requests": self.local_api.requests},
            "containerd": containerd,
        }


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
