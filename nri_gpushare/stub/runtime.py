"""Runs a `Plugin` against a container runtime over NRI.

One `Stub` owns the connection's life: connect, serve the plugin service on
conn 1 while calling RegisterPlugin on conn 2 (the runtime may send Configure
before our registration reply arrives), answer Configure / Synchronize /
events, and when the runtime goes away reconnect with backoff and do it all
again.  State comes back through Synchronize, so nothing is lost across a
runtime restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

import betterproto

from nri_gpushare.api import lite, nri
from nri_gpushare.api.lite import ContainerView, PodSandboxView
from nri_gpushare.stub.plugin import (
    HANDLERS,
    Event,
    Plugin,
    PluginError,
    implemented_events,
    subscription_mask,
    valid_event_mask,
)
from nri_gpushare.wire.errors import Code, TtrpcError
from nri_gpushare.wire.transport import MuxConnection

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_CONN = 1  # the runtime calls us here
RUNTIME_CONN = 2  # we call the runtime here
_TIMING_SAMPLES = 4096  # handler timings kept per method, for `status`

# v0.12 runtimes call one RPC per event (request {pod=1, container=2}, empty
# reply); older ones send StateChange {event=1, pod=2, container=3}.
_EVENT_RPCS: dict[str, Event] = {
    "RunPodSandbox": Event.RUN_POD_SANDBOX,
    "StopPodSandbox": Event.STOP_POD_SANDBOX,
    "RemovePodSandbox": Event.REMOVE_POD_SANDBOX,
    "PostCreateContainer": Event.POST_CREATE_CONTAINER,
    "StartContainer": Event.START_CONTAINER,
    "PostStartContainer": Event.POST_START_CONTAINER,
    "PostUpdateContainer": Event.POST_UPDATE_CONTAINER,
    "RemoveContainer": Event.REMOVE_CONTAINER,
}


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
        reconnect_delays: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0),
    ) -> None:
        if len(index) != 2 or not index.isdigit():
            raise ValueError(f"plugin index {index!r} must be exactly two digits")
        self.plugin = plugin
        self.name, self.index = name, index
        self.socket_path = socket_path
        self._preconnected = preconnected
        self._delays = reconnect_delays
        self._stopping = asyncio.Event()
        self._connection: MuxConnection | None = None
        self._sync_pods: list[PodSandboxView] = []
        self._sync_containers: list[ContainerView] = []
        #: Set once per connection when Synchronize has completed.
        self.synchronized = asyncio.Event()
        #: How many connections reached Synchronize (for tests and logs).
        self.sessions = 0
        #: Recent time spent inside the plugin's handlers, per RPC method (seconds).
        self.handler_seconds: dict[str, deque[float]] = {}

    @classmethod
    def from_environment(cls, plugin: Plugin, **kwargs: object) -> Stub:
        """Build a stub for a plugin that containerd launched itself (fd 3)."""
        if os.environ.get("NRI_PLUGIN_SOCKET") != "3":
            raise RuntimeError("not started by the runtime: NRI_PLUGIN_SOCKET is not 3")
        sock = socket.socket(fileno=3)
        kwargs.setdefault("name", os.environ.get("NRI_PLUGIN_NAME", "gpushare"))
        kwargs.setdefault("index", os.environ.get("NRI_PLUGIN_IDX", "10"))
        return cls(plugin, preconnected=sock, **kwargs)  # type: ignore[arg-type]

    # -- life ----------------------------------------------------------------

    async def run(self) -> None:
        """Serve until `stop()`; reconnect whenever the runtime goes away.

        A runtime-launched plugin (pre-connected socket) cannot reconnect and
        returns when its connection ends.
        """
        attempt = 0
        while not self._stopping.is_set():
            try:
                await self._session()
                attempt = 0
            except (OSError, TtrpcError, PluginError, ConnectionError) as exc:
                log.warning("NRI connection failed: %s", exc)
            if self._preconnected is not None or self._stopping.is_set():
                return
            delay = self._delays[min(attempt, len(self._delays) - 1)]
            attempt += 1
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        self._stopping.set()
        if self._connection is not None:
            await self._connection.close()

    async def _session(self) -> None:
        if self._preconnected is not None:
            connection = await MuxConnection.from_socket(self._preconnected)
        else:
            assert self.socket_path, "no NRI socket configured"
            connection = await MuxConnection.connect(self.socket_path)
        self._connection = connection
        self.synchronized.clear()
        if self._stopping.is_set():  # stop() came while we were connecting
            await connection.close()
            return
        connection.serve(PLUGIN_CONN, self._dispatch)
        try:
            request = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            await connection.client(RUNTIME_CONN).call(
                RUNTIME_SERVICE, "RegisterPlugin", bytes(request), timeout=5.0
            )
            log.info("registered with the runtime as %s-%s", self.index, self.name)
            await connection.wait_closed()
            if connection.error is not None:
                log.warning("NRI connection closed: %s", connection.error)
            else:
                log.info("NRI connection closed by the runtime")
        finally:
            self._connection = None
            self.synchronized.clear()
            await connection.close()

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

    # -- the plugin service ----------------------------------------------------

    async def _dispatch(self, service: str, method: str, payload: bytes) -> bytes:
        if service != PLUGIN_SERVICE:
            raise TtrpcError(Code.UNIMPLEMENTED, f"unknown service {service}")
        handler = _METHODS.get(method)
        if handler is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"{method} is not implemented")
        started = time.perf_counter()
        try:
            return await handler(self, payload)
        except PluginError as exc:
            raise TtrpcError(Code.UNKNOWN, str(exc)) from None
        except lite.DecodeError as exc:
            raise TtrpcError(Code.INVALID_ARGUMENT, f"{method}: malformed request: {exc}") from None
        except TtrpcError:
            raise
        except Exception as exc:
            log.exception("%s handler failed", method)
            raise TtrpcError(
                Code.INTERNAL, f"{self.name}: internal error in {method}: {exc}"
            ) from exc
        finally:
            elapsed = time.perf_counter() - started
            self.handler_seconds.setdefault(method, deque(maxlen=_TIMING_SAMPLES)).append(elapsed)

    async def _configure(self, payload: bytes) -> bytes:
        request = lite.decode_configure_request(payload)
        mask = subscription_mask(
            self.plugin,
            valid_event_mask(request.runtime_name, request.runtime_version, request.nri_version),
        )
        log.info(
            "configured by %s %s: events 0x%x",
            request.runtime_name,
            request.runtime_version,
            mask,
        )
        await self.plugin.configure(request.config, request.runtime_name, request.runtime_version)
        self._sync_pods, self._sync_containers = [], []
        return lite.encode_configure_response(mask)

    async def _synchronize(self, payload: bytes) -> bytes:
        request = lite.decode_synchronize_request(payload)
        self._sync_pods.extend(request.pods)
        self._sync_containers.extend(request.containers)
        if request.more:
            return lite.encode_synchronize_response(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        updates = await self.plugin.synchronize(pods, containers)
        self.sessions += 1
        self.synchronized.set()
        return lite.encode_synchronize_response(updates=_encoded(updates))

    async def _shutdown(self, payload: bytes) -> bytes:
        await self.plugin.shutdown()
        return lite.EMPTY

    async def _create_container(self, payload: bytes) -> bytes:
        request = lite.decode_create_container_request(payload)
        adjust = await self.plugin.create_container(request.pod, request.container)
        if isinstance(adjust, betterproto.Message):
            return bytes(nri.CreateContainerResponse(adjust=adjust))
        return lite.encode_create_container_response(adjust)

    async def _update_container(self, payload: bytes) -> bytes:
        request = lite.decode_update_container_request(payload)
        updates = await self.plugin.update_container(
            request.pod, request.container, request.linux_resources_message()
        )
        return lite.encode_update_container_response(_encoded(updates))

    async def _stop_container(self, payload: bytes) -> bytes:
        request = lite.decode_stop_container_request(payload)
        updates = await self.plugin.stop_container(request.pod, request.container)
        return lite.encode_stop_container_response(_encoded(updates))

    async def _state_change(self, payload: bytes) -> bytes:
        request = lite.decode_state_change(payload)
        try:
            event = Event(request.event)
        except ValueError:
            log.debug("ignoring unknown NRI event %d", request.event)
            return lite.EMPTY
        await self._notify(event, request.pod, request.container)
        return lite.EMPTY

    async def _notify(
        self, event: Event, pod: PodSandboxView, container: ContainerView | None
    ) -> None:
        if event not in implemented_events(self.plugin):
            return
        handler = getattr(self.plugin, HANDLERS[event])
        if event in (Event.RUN_POD_SANDBOX, Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX):
            await handler(pod)
        else:
            await handler(pod, container)


def _encoded(updates: Iterable[betterproto.Message] | None) -> list[bytes]:
    return [bytes(update) for update in updates or ()]


def _event_rpc(event: Event) -> Callable[[Stub, bytes], Awaitable[bytes]]:
    """Serve a v0.12 per-event RPC; events the plugin does not handle answer
    Unimplemented, so the runtime falls back to StateChange (which we ignore)."""

    async def serve(stub: Stub, payload: bytes) -> bytes:
        if event not in implemented_events(stub.plugin):
            raise TtrpcError(Code.UNIMPLEMENTED, f"{event.name} not handled")
        request = lite.decode_pod_container_request(payload, event.name)
        await stub._notify(event, request.pod, request.container)
        return lite.EMPTY

    return serve


_METHODS: dict[str, Callable[[Stub, bytes], Awaitable[bytes]]] = {
    "Configure": Stub._configure,
    "Synchronize": Stub._synchronize,
    "Shutdown": Stub._shutdown,
    "CreateContainer": Stub._create_container,
    "UpdateContainer": Stub._update_container,
    "StopContainer": Stub._stop_container,
    "StateChange": Stub._state_change,
    **{name: _event_rpc(event) for name, event in _EVENT_RPCS.items()},
}
