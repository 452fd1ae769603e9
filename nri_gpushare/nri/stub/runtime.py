"""Runs a `Plugin` against a container runtime over NRI.

One `Stub` owns the connection's life: connect, serve the plugin service on
conn 1 while calling RegisterPlugin on conn 2 (the runtime may send Configure
before our registration reply arrives), answer Configure / Synchronize /
events, and whenever the connection cannot work reconnect with backoff and do
it all again.  State comes back through Synchronize, so nothing is lost across
a reconnect.  The requests themselves are served by `PluginService`.

A session is dropped (and `last_error` says why) when:

- the connection cannot be made, or the RegisterPlugin reply does not come
  within the registration timeout;
- Configure or Synchronize fails or runs past the request timeout
  (`PluginService.broken`): containerd 1.7 keeps such a plugin connected but
  never sends it an event, so the error is answered and the connection closed;
- no Synchronize has completed within registration timeout + request timeout
  of the registration reply: the runtime may take up to a request timeout for
  Configure and another for Synchronize, and the registration timeout is the
  slack the runtime itself grants a plugin to come up; past that it has
  stalled, and a new connection is the only way to get synchronized;
- the runtime closes the connection or breaks the protocol (containerd also
  closes a plugin whose event handler ran past the request timeout);
- anything unexpected goes wrong in the session (logged with its traceback).

The backoff starts over only after a session that synchronized, so a runtime
that keeps refusing us is not hammered.  A plugin launched by the runtime
(pre-connected fd 3) cannot reconnect: `run()` raises `RuntimeConnectionLost`
and the process should exit non-zero, to be started again.

Timeouts are the runtime's: Configure carries how long it waits for a
registration and for each reply (NRI's defaults, 5 s and 2 s, until it says;
containerd 1.7 never says).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Iterator

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.stub.plugin import Plugin, PluginError
from nri_gpushare.nri.stub.service import (
    DEFAULT_REGISTRATION_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    PluginService,
)
from nri_gpushare.nri.wire.errors import Code, TtrpcError, WireError, describe_error
from nri_gpushare.nri.wire.mux import PLUGIN_CONN, RUNTIME_CONN
from nri_gpushare.nri.wire.transport import MuxConnection

log = logging.getLogger(__name__)

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_RECONNECT_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)
"""Seconds between reconnection attempts: containerd expects a plugin back
within 2 s of its restart, so the last (repeated) delay is at most 1 s."""


class RuntimeConnectionLost(ConnectionError):
    """The connection of a plugin launched by the runtime ended: it cannot reconnect."""


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
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
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
        self.service = PluginService(
            plugin,
            name,
            request_timeout=request_timeout,
            registration_timeout=registration_timeout,
        )
        """Serves the runtime's requests; holds what Configure said."""
        self.service.on_configure = self._configured
        # (deadline, when it started) of the registration reply, then of Synchronize.
        self._registration: tuple[asyncio.Timeout, float] | None = None
        self._sync_wait: tuple[asyncio.Timeout, float] | None = None
        self.last_error = ""
        """Why the last session ended (or the last connection attempt failed); "" if none has."""

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
        """Serve until `stop()`; whenever the connection is unusable, drop it and
        reconnect with backoff.

        A runtime-launched plugin (pre-connected socket) cannot reconnect: when
        its connection ends other than by `stop()`, raises RuntimeConnectionLost.
        """
        delays = backoff(self._delays)
        while not self._stopping.is_set():
            synchronized, reason = await self._attempt()
            if self._stopping.is_set():
                return
            self.last_error = reason
            if synchronized:
                delays = backoff(self._delays)
            if self._preconnected is not None:
                log.error("NRI connection lost: %s; a runtime-launched plugin exits", reason)
                raise RuntimeConnectionLost(reason)
            delay = next(delays)
            log.warning("NRI connection lost: %s; reconnecting in %.3g s", reason, delay)
            await self._pause(delay)

    async def _attempt(self) -> tuple[bool, str]:
        """One session, whatever goes wrong in it: (whether it synchronized, why it ended)."""
        before = self.sessions
        try:
            reason = await self._session()
        except (OSError, WireError, PluginError) as exc:
            reason = describe_error(exc)
        except Exception as exc:
            log.exception("NRI session failed unexpectedly")
            reason = f"unexpected {type(exc).__name__}: {describe_error(exc)}"
        return self.sessions > before, reason

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

    async def _session(self) -> str:
        """One connection, until it ends or is dropped; why it ended."""
        if self._preconnected is not None:
            connection = await MuxConnection.from_socket(self._preconnected)
        else:
            assert self.socket_path, "no NRI socket configured"
            try:
                connection = await MuxConnection.connect(self.socket_path)
            except OSError as exc:
                return f"cannot connect to {self.socket_path}: {exc.strerror or exc}"
        self._connection = connection
        self.service.begin()
        try:
            if self._stopping.is_set():  # stop() came while we were connecting
                return "stopped"
            connection.serve(PLUGIN_CONN, self.service.handle)
            await self._register(connection)
            log.info("registered with the runtime as %s-%s", self.index, self.name)
            return await self._watch(connection)
        finally:
            # When a failed Configure or Synchronize broke the session, its
            # error reply is already queued (the handler's task wrote it before
            # this one could run again) and close() flushes what is queued.
            self._connection = None
            await connection.close()
            self.service.reset()

    async def _watch(self, connection: MuxConnection) -> str:
        """Wait until the registered session ends; why it ended."""
        loop = asyncio.get_running_loop()
        registered = loop.time()
        closed = loop.create_task(connection.wait_closed())
        broken = loop.create_task(self.service.broken.wait())
        synchronized = loop.create_task(self.synchronized.wait())
        try:
            try:
                allowed = self.registration_timeout + self.request_timeout
                async with asyncio.timeout_at(registered + allowed) as deadline:
                    self._sync_wait = (deadline, registered)
                    await asyncio.wait(
                        (closed, broken, synchronized), return_when=asyncio.FIRST_COMPLETED
                    )
            except TimeoutError:
                allowed = self.registration_timeout + self.request_timeout
                return f"no Synchronize within {allowed:.3g} s of registration"
            finally:
                self._sync_wait = None
            await asyncio.wait((closed, broken), return_when=asyncio.FIRST_COMPLETED)
            if broken.done():
                return self.service.failure
            if connection.error is not None:
                return f"connection failed: {connection.error}"
            return "the runtime closed the connection"
        finally:
            for task in (closed, broken, synchronized):
                task.cancel()

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
        """Configure has set the runtime's timeouts: move the pending deadlines."""
        if self._registration is not None:
            deadline, started = self._registration
            if not deadline.expired():
                deadline.reschedule(started + self.registration_timeout)
        if self._sync_wait is not None:
            deadline, registered = self._sync_wait
            if not deadline.expired():
                deadline.reschedule(registered + self.registration_timeout + self.request_timeout)

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
