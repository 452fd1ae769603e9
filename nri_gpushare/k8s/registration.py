"""The device plugin's sockets and its registration with the kubelet.  The
kubelet deletes every socket in the directory when it starts and creates a
new ``kubelet.sock``; once a second `DevicePlugin` checks both, serves again
where our socket is gone and registers again (with backoff while it fails)
where the kubelet is new.  A second process on the same directory takes the
sockets over; the first steps back and serves again only once they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from grpclib.client import Channel
from grpclib.server import Server

from nri_gpushare.host.sockets import bind_socket
from nri_gpushare.k8s import API_VERSION, KUBELET_SOCKET, endpoint
from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.served import close_server, identity, unlink
from nri_gpushare.k8s.service import OPTIONS, DevicePluginService
from nri_gpushare.k8s.state import PluginState
from nri_gpushare.names import RESOURCES

log = logging.getLogger(__name__)

POLL = 1.0
"""Seconds between refreshes of the device lists and checks of the sockets."""
REGISTER_TIMEOUT = 5.0
REGISTER_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before each further Register attempt after a failure (then the last)."""
SOCKET_MODE = 0o600


class _Endpoint:
    """One resource's server and the socket it was started on."""

    def __init__(self, service: DevicePluginService, server: Server, path: str) -> None:
        self.service = service
        self.server = server
        self.path = path
        self.identity = identity(path)

    def serving(self) -> bool:
        return self.identity is not None and identity(self.path) == self.identity

    async def close(self) -> None:
        self.service.stop()
        await close_server(self.server, self.path, self.identity, lambda: self.service.streams)


class DevicePlugin:
    """The servers of every resource in `directory` and their registration
    with the kubelet there; `tick()` does one round of checks."""

    def __init__(
        self,
        directory: str,
        state: PluginState,
        *,
        register_timeout: float = REGISTER_TIMEOUT,
        register_delays: tuple[float, ...] = REGISTER_DELAYS,
    ) -> None:
        self.directory = directory
        self.kubelet_socket = os.path.join(directory, KUBELET_SOCKET)
        self._state = state
        self._register_timeout = register_timeout
        self._register_delays = register_delays
        self._endpoints: dict[str, _Endpoint] = {}
        self._kubelet: tuple[int, int, int] | None = None
        self._registered: set[str] = set()
        self._failures: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._problems: dict[str, str] = {}
        self._yielded: set[str] = set()
        self.registrations = 0

    def socket_path(self, short: str) -> str:
        return os.path.join(self.directory, endpoint(short))

    @property
    def registered(self) -> frozenset[str]:
        return frozenset(self._registered)

    @property
    def serving(self) -> frozenset[str]:
        return frozenset(self._endpoints)

    async def run(self, stop: asyncio.Event, poll: float = POLL) -> None:
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                tick = asyncio.ensure_future(self.tick())
                # A stop does not wait for a Register call the kubelet does not answer.
                await asyncio.wait({tick, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not tick.done():
                    tick.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await tick
                    break
                if not tick.cancelled() and tick.exception() is not None:
                    # a bug: keep serving what is served
                    log.error(
                        "checking the sockets and the registration failed",
                        exc_info=tick.exception(),
                    )
                await asyncio.wait({stopping}, timeout=poll)
        finally:
            stopping.cancel()

    async def tick(self) -> None:
        """Serve where our socket is gone, register where the kubelet is new
        or an attempt is due."""
        for short in RESOURCES:
            current = self._endpoints.get(short)
            path = self.socket_path(short)
            if current is not None and not current.serving():
                if identity(path) is not None:
                    # Not the kubelet (it only removes): a newer device plugin.
                    log.warning(
                        "%s is another process's now (a second device plugin): it serves "
                        "%s; this one steps back until that socket is gone",
                        path,
                        RESOURCES[short],
                    )
                    del self._endpoints[short]
                    self._registered.discard(short)
                    self._yielded.add(short)
                    await current.close()
                    continue
                log.info("%s was removed (the kubelet restarted?): serving again", path)
            if short in self._yielded:
                if identity(path) is not None:
                    continue
                self._yielded.discard(short)
                log.info("%s is gone: serving %s again", path, RESOURCES[short])
            if current is None or not current.serving():
                if await self._serve(short):
                    self._registered.discard(short)
        kubelet = identity(self.kubelet_socket)
        if kubelet != self._kubelet:
            if kubelet is not None:
                log.info("kubelet socket %s is new: registering", self.kubelet_socket)
            self._kubelet = kubelet
            self._registered.clear()
            self._failures.clear()
            self._next_try.clear()
        if kubelet is None:
            self._say("kubelet", f"waiting for the kubelet's socket {self.kubelet_socket}")
            return
        for short in RESOURCES:
            if short in self._endpoints and short not in self._registered:
                if time.monotonic() >= self._next_try.get(short, 0.0):
                    await self._register(short)

    async def _serve(self, short: str) -> bool:
        old = self._endpoints.pop(short, None)
        if old is not None:
            await old.close()
        path = self.socket_path(short)
        service = DevicePluginService(short, self._state)
        server = Server([service])
        try:
            unlink(path)  # a stale socket of an earlier run
            sock = bind_socket(path, SOCKET_MODE)
            await server.start(sock=sock)
        except OSError as e:
            self._say(short, f"cannot serve {RESOURCES[short]} on {path}: {e.strerror or e}")
            return False
        self._endpoints[short] = _Endpoint(service, server, path)
        self._problems.pop(short, None)
        log.info("serving %s on %s", RESOURCES[short], path)
        return True

    async def _register(self, short: str) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=endpoint(short),
            resource_name=RESOURCES[short],
            options=OPTIONS,
        )
        channel = Channel(path=self.kubelet_socket)
        try:
            await pb.RegistrationStub(channel).register(request, timeout=self._register_timeout)
        except Exception as e:  # never fatal: try again later
            failures = self._failures[short] = self._failures.get(short, 0) + 1
            delay = self._register_delays[min(failures, len(self._register_delays)) - 1]
            self._next_try[short] = time.monotonic() + delay
            why = str(e) or type(e).__name__
            log.warning(
                "registering %s with the kubelet (%s) failed: %s; trying again in %.0f s",
                RESOURCES[short],
                self.kubelet_socket,
                why,
                delay,
            )
            return
        finally:
            channel.close()
        self._registered.add(short)
        self._failures.pop(short, None)
        self.registrations += 1
        log.info("registered %s with the kubelet (endpoint %s)", RESOURCES[short], endpoint(short))

    def _say(self, key: str, problem: str) -> None:
        """Log `problem` once until it changes (the loop meets it every second)."""
        if self._problems.get(key) != problem:
            self._problems[key] = problem
            log.warning("%s", problem)

    async def close(self) -> None:
        """Stop every server and remove its socket."""
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        await asyncio.gather(*(e.close() for e in endpoints))
        self._registered.clear()
