"""The kubelet's side of the DRA driver: ``DRAPlugin`` (v1, v1beta1) and
``DRAResourceHealth`` (v1alpha1, v1) on ``<plugin_dir>/dra.sock``, and the
plugin watcher's ``Registration`` on ``<registry_dir>/<driver>-reg.sock``
(the kubelet finds that socket, asks GetInfo and connects to dra.sock).

Once a second `KubeletPlugin` checks that both sockets are still its own
(the same file as it bound): one removed (a node cleanup, a kubelet that
wiped its directory) is served again, which the plugin watcher sees as a new
plugin; one that another process bound (a second driver) is left to it until
it is gone.  The services are in `nri_gpushare.k8s.dra.kubelet_services`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from grpclib.server import Server

from nri_gpushare.host.sockets import bind_socket
from nri_gpushare.k8s.dra import DRIVER, Preparer
from nri_gpushare.k8s.dra.kubelet_services import (
    HEALTH_POLL,
    PARALLEL,
    PREPARE_TIMEOUT,
    Claims,
    DraPluginV1,
    DraPluginV1beta1,
    HealthFeed,
    HealthV1,
    HealthV1alpha1,
    Registration,
)
from nri_gpushare.k8s.served import close_server, identity, unlink

log = logging.getLogger(__name__)

PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
SOCKET = "dra.sock"
POLL = 1.0
"""Seconds between checks of the sockets."""
SOCKET_MODE = 0o600
DIR_MODE = 0o750


class _Served:
    """One server and the socket file it was started on."""

    def __init__(self, server: Server, path: str, feed: HealthFeed | None) -> None:
        self.server = server
        self.path = path
        self.feed = feed
        self.identity = identity(path)

    def state(self) -> str:
        """Whether the file is "ours", "gone" or "taken" (another process's)."""
        now = identity(self.path)
        if now is None:
            return "gone"
        return "ours" if now == self.identity else "taken"

    async def close(self) -> None:
        feed = self.feed
        if feed is not None:
            feed.stop()
        streams = (lambda: feed.streams) if feed is not None else None
        await close_server(self.server, self.path, self.identity, streams)


class KubeletPlugin:
    """The DRA driver's kubelet plugin: `run` serves (and serves again)
    until `stop` is set; `close` stops the servers and removes the sockets."""

    def __init__(
        self,
        preparer: Preparer,
        *,
        driver: str = DRIVER,
        plugin_dir: str = PLUGIN_DIR,
        registry_dir: str = REGISTRY_DIR,
        timeout: float = PREPARE_TIMEOUT,
        parallel: int = PARALLEL,
        poll: float = POLL,
        health_poll: float = HEALTH_POLL,
    ) -> None:
        self.driver = driver
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.socket = os.path.join(plugin_dir, SOCKET)
        self.registration_socket = os.path.join(registry_dir, f"{driver}-reg.sock")
        self._preparer = preparer
        self._claims = Claims(preparer, driver=driver, timeout=timeout, parallel=parallel)
        self._registration = Registration(driver, self.socket)
        self._poll = poll
        self._health_poll = health_poll
        self._served: dict[str, _Served] = {}
        self._yielded: set[str] = set()
        self._problems: dict[str, str] = {}
        self._closed = False

    @property
    def registered(self) -> bool:
        """Whether the kubelet's last word on the registration was yes."""
        return bool(self._registration.registered)

    @property
    def registration_error(self) -> str:
        """The kubelet's reason when it refused the registration."""
        return str(self._registration.error)

    @property
    def serving(self) -> frozenset[str]:
        """The socket paths served now."""
        return frozenset(self._served)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve, and check the sockets every `poll` seconds, until `stop`
        is set or `close` was called."""
        while not stop.is_set() and not self._closed:
            try:
                await self.tick()
            except Exception:  # a bug: keep serving what is served
                log.exception("checking the DRA plugin's sockets failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._poll)

    async def tick(self) -> None:
        """Serve each socket that is not served, or was removed; the plugin's
        first, so that the kubelet finds it when it follows the registration."""
        if self._closed:
            return
        await self._check(self.socket, self._plugin_server)
        await self._check(self.registration_socket, self._registration_server)

    def _plugin_server(self) -> tuple[Server, HealthFeed]:
        feed = HealthFeed(self._preparer, self._health_poll)
        services: list[Any] = [
            DraPluginV1(self._claims),
            DraPluginV1beta1(self._claims),
            HealthV1alpha1(feed),
            HealthV1(feed),
        ]
        return Server(services), feed

    def _registration_server(self) -> tuple[Server, None]:
        return Server([self._registration]), None

    async def _check(self, path: str, make: Callable[[], tuple[Server, HealthFeed | None]]) -> None:
        current = self._served.get(path)
        state = "gone" if current is None else current.state()
        if current is not None and state != "ours":
            del self._served[path]
            if path == self.registration_socket:
                self._registration.registered = False
            if state == "taken":
                log.warning(
                    "%s is another process's now (a second DRA driver?): this one steps "
                    "back until that socket is gone",
                    path,
                )
                self._yielded.add(path)
            else:
                log.info("%s was removed: serving again", path)
            await current.close()
        if path in self._served:
            return
        if path in self._yielded:
            if identity(path) is not None:
                return
            self._yielded.discard(path)
            log.info("%s is gone: serving it again", path)
        await self._serve(path, make)

    async def _serve(self, path: str, make: Callable[[], tuple[Server, HealthFeed | None]]) -> None:
        server, feed = make()
        try:
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                os.makedirs(directory, DIR_MODE, exist_ok=True)
                os.chmod(directory, DIR_MODE)
            unlink(path)  # a stale socket of an earlier run
            sock = bind_socket(path, SOCKET_MODE)
            await server.start(sock=sock)
        except OSError as e:
            self._say(path, f"cannot serve the DRA plugin on {path}: {e.strerror or e}")
            return
        served = _Served(server, path, feed)
        if self._closed:  # closed while it started
            await served.close()
            return
        self._served[path] = served
        self._problems.pop(path, None)
        log.info("serving the %s DRA plugin on %s", self.driver, path)

    def _say(self, key: str, problem: str) -> None:
        """Log `problem` once until it changes (the loop meets it every second)."""
        if self._problems.get(key) != problem:
            self._problems[key] = problem
            log.warning("%s", problem)

    async def close(self) -> None:
        """Stop both servers (health streams end cleanly), remove our sockets
        and cancel the prepares still running; `run` returns."""
        self._closed = True
        served, self._served = list(self._served.values()), {}
        await asyncio.gather(*(s.close() for s in served))
        self._registration.registered = False
        await self._claims.close()
