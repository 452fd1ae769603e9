"""Runs a `Plugin` against a container runtime over NRI.

One `Stub` owns the connection's life: connect, serve the plugin service on
conn 1 while calling RegisterPlugin on conn 2 (the runtime may send Configure
before our registration reply arrives), answer Configure / Synchronize /
events, and when the runtime goes away reconnect with backoff and do it all
again.  State comes back through Synchronize, so nothing is lost across a
runtime restart.  The requests themselves are served by `PluginService`.

Timeouts are the runtime's: Configure carries how long it waits for a
registration and for each reply (NRI's defaults, 5 s and 2 s, until it says).
The stub waits that long for its registration reply, and warns when a handler
runs past the request timeout (the runtime has then given up on the request).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Iterator

from nri_gpushare.api import lite, nri
from nri_gpushare.stub.plugin import Plugin, PluginError
from nri_gpushare.stub.service import PluginService
from nri_gpushare.wire.errors import Code, TtrpcError
from nri_gpushare.wire.mux import PLUGIN_CONN, RUNTIME_CONN
from nri_gpushare.wire.transport import MuxConnection

log = logging.getLogger(__name__)

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_RECONNECT_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)
"""Seconds between reconnection attempts: containerd expects a plugin back
within 2 s of its restart, so the last (repeated) delay is at most 1 s."""


def backoff(delays: tuple[float, ...]) -> Iterator[float]:
    """The delays before each further attempt: `delays`, then its last forever."""
    yield from delays
    while True:
        yield delays[-1]


class Stub:
    """Connects a plugin to the runtime and keeps it connected."""

    def __init__(
        self,
        plugin: Plugin,
        *,
        name: str = "gpushare",
        index: str = "10",
        socket_path: str | None = None,
        preconnected: socket.socket | None = None,
        reconnect_delays: tuple[float, ...] = DEFAULT_RECONNECT_DELAYS,
    ) -> None:
        if len(index) != 2 or not index.isdigit():
            raise ValueError(f"plugin index {index!r} must be exactly two digits")
        if not reconnect_delays or min(reconnect_delays) < 0:
            raise ValueError("reconnect_delays must be non-empty and non-negative")
        self.plugin = plugin
        self.name, self.index = name, index
        self.socket_path = socket_path
        self._preconnected = preconnected
        self._delays = reconnect_delays
        self._stopping = asyncio.Event()
        self._connection: MuxConnection | None = None
        self.service = PluginService(plugin, name)
        """Serves the runtime's requests; holds what Configure said."""
        self.service.on_configure = self._configured
        self._registration: tuple[asyncio.Timeout, float] | None = None

    @classmethod
    def from_environment(cls, plugin: Plugin, **kwargs: object) -> Stub:
        """Build a stub for a plugin that containerd launched itself (fd 3)."""
        if os.environ.get("NRI_PLUGIN_SOCKET") != "3":
            raise RuntimeError("not started by the runtime: NRI_PLUGIN_SOCKET is not 3")
        sock = socket.socket(fileno=3)
        kwargs.setdefault("name", os.environ.get("NRI_PLUGIN_NAME", "gpushare"))
        kwargs.setdefault("index", os.environ.get("NRI_PLUGIN_IDX", "10"))
        return cls(plugin, preconnected=sock, **kwargs)  # type: ignore[arg-type]

    # -- what the service knows ---------------------------------------------

    @property
    def synchronized(self) -> asyncio.Event:
        """Set once per connection when Synchronize has completed."""
        return self.service.synchronized

    @property
    def sessions(self) -> int:
        """How many connections reached Synchronize (for tests and logs)."""
        return self.service.sessions

    @property
    def handler_seconds(self) -> dict[str, deque[float]]:
        """Recent time spent inside the plugin's handlers, per RPC method (seconds)."""
        return self.service.handler_seconds

    @property
    def request_timeout(self) -> float:
        """Seconds the runtime waits for each reply (from Configure; 2 s before)."""
        return self.service.request_timeout

    @property
    def registration_timeout(self) -> float:
        """Seconds allowed for registration (from Configure; 5 s before)."""
        return self.service.registration_timeout

    @property
    def events(self) -> int:
        """The event mask of the current subscription (0 before Configure)."""
        return self.service.events

    # -- life ----------------------------------------------------------------

    async def run(self) -> None:
        """Serve until `stop()`; reconnect whenever the runtime goes away.

        A runtime-launched plugin (pre-connected socket) cannot reconnect and
        returns when its connection ends.
        """
        delays = backoff(self._delays)
        while not self._stopping.is_set():
            try:
                if await self._session():
                    delays = backoff(self._delays)
            except (OSError, TtrpcError, PluginError, ConnectionError) as exc:
                log.warning("NRI connection failed: %s", exc)
            if self._preconnected is not None or self._stopping.is_set():
                return
            await self._pause(next(delays))

    async def _pause(self, delay: float) -> None:
        """Wait `delay` seconds before reconnecting, or until `stop()`."""
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except TimeoutError:
            pass

    async def stop(self) -> None:
        self._stopping.set()
        if self._connection is not None:
            await self._connection.close()

    async def _session(self) -> bool:
        """One connection; True if it registered (the backoff starts over)."""
        if self._preconnected is not None:
            connection = await MuxConnection.from_socket(self._preconnected)
        else:
            assert self.socket_path, "no NRI socket configured"
            connection = await MuxConnection.connect(self.socket_path)
        self._connection = connection
        self.service.begin()
        if self._stopping.is_set():  # stop() came while we were connecting
            await connection.close()
            return False
        connection.serve(PLUGIN_CONN, self.service.handle)
        try:
            await self._register(connection)
            log.info("registered with the runtime as %s-%s", self.index, self.name)
            await connection.wait_closed()
            if connection.error is not None:
                log.warning("NRI connection closed: %s", connection.error)
            else:
                log.info("NRI connection closed by the runtime")
            return True
        finally:
            self._connection = None
            self.service.reset()
            await connection.close()

    async def _register(self, connection: MuxConnection) -> None:
        """RegisterPlugin, waiting the registration timeout for the reply; a
        Configure arriving meanwhile moves the deadline to what it says."""
        request = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.registration_timeout) as deadline:
                self._registration = (deadline, started)
                await connection.client(RUNTIME_CONN).call(
                    RUNTIME_SERVICE, "RegisterPlugin", bytes(request)
                )
        except TimeoutError:
            raise TtrpcError(
                Code.DEADLINE_EXCEEDED,
                f"RegisterPlugin: no reply within {loop.time() - started:.3g} s",
            ) from None
        finally:
            self._registration = None

    def _configured(self, request: lite.ConfigureRequestView) -> None:
        if self._registration is not None and request.registration_timeout > 0:
            deadline, started = self._registration
            deadline.reschedule(started + request.registration_timeout / 1000)

    async def update_containers(
        self, updates: list[nri.ContainerUpdate], evictions: list[nri.ContainerEviction]
    ) -> nri.UpdateContainersResponse:
        """Ask the runtime to update or evict containers outside an event."""
        if self._connection is None:
            raise ConnectionError("not connected to the runtime")
        request = nri.UpdateContainersRequest(update=updates, evict=evictions)
        reply = await self._connection.client(RUNTIME_CONN).call(
            RUNTIME_SERVICE, "UpdateContainers", bytes(request)
        )
        return nri.UpdateContainersResponse().parse(reply)
