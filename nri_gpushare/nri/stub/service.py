"""The plugin side of NRI's Plugin service, without a socket.

`PluginService.handle(service, method, payload)` takes a request payload and
returns the reply payload (or raises `TtrpcError` for an error status): the
transport serves it on conn 1, and tests drive it byte for byte.  Which RPCs
exist and which handler each reaches comes from the event table
(`stub.events`); this module holds the codec of each RPC.

A connection whose Configure or Synchronize failed, or ran past the runtime's
request timeout, can never work: the runtime (containerd 1.7, NRI 0.6) keeps
such a plugin connected but never sends it an event.  The service then sets
`broken` (and `failure`, why) and the stub drops the connection, after the
error reply has gone out, and reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import betterproto

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.api.lite import ConfigureRequestView, ContainerView, PodSandboxView
from nri_gpushare.nri.stub.events import BY_EVENT, EVENTS, Delivery, Event, EventSpec, describe_mask
from nri_gpushare.nri.stub.gc_pause import collection_paused
from nri_gpushare.nri.stub.plugin import (
    CreateResult,
    Plugin,
    PluginError,
    implemented_events,
    subscription_mask,
    valid_event_mask,
)
from nri_gpushare.nri.wire.errors import Code, DecodeError, TtrpcError, describe_error

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
DEFAULT_REQUEST_TIMEOUT = 2.0
"""Seconds the runtime waits for a reply, until Configure says (NRI's default)."""
DEFAULT_REGISTRATION_TIMEOUT = 5.0
"""Seconds to wait for registration, until Configure says (NRI's default)."""
SESSION_METHODS = frozenset({"Configure", "Synchronize"})
"""Requests whose failure leaves the connection useless (see `PluginService.broken`)."""
_TIMING_SAMPLES = 4096  # handler timings kept per method, for `status`


class PluginService:
    """Decodes the runtime's requests, calls the plugin, encodes its answers."""

    def __init__(
        self,
        plugin: Plugin,
        name: str = "plugin",
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
    ) -> None:
        self.plugin = plugin
        self.name = name
        self.handled = frozenset(implemented_events(plugin))
        """Events the plugin's class has a handler for."""
        self.events = 0
        """The subscription answered to the last Configure."""
        #: What the runtime is assumed to use until its Configure says (NRI
        #: before v0.8, e.g. containerd 1.7, never says: set them to its config).
        self.assumed_timeouts = (request_timeout, registration_timeout)
        self.request_timeout = request_timeout
        self.registration_timeout = registration_timeout
        self.on_configure: Callable[[ConfigureRequestView], None] | None = None
        """Called with each Configure request, before the plugin's configure()."""
        #: Set once per connection when Synchronize has completed.
        self.synchronized = asyncio.Event()
        #: Set when this connection can no longer work (Configure or Synchronize
        #: failed or ran past the request timeout); `failure` says why.
        self.broken = asyncio.Event()
        self.failure = ""
        #: How many connections reached Synchronize (for tests and logs).
        self.sessions = 0
        #: Recent time spent inside the plugin's handlers, per RPC method (seconds).
        self.handler_seconds: dict[str, deque[float]] = {}
        self._sync_pods: list[PodSandboxView] = []
        self._sync_containers: list[ContainerView] = []

    def reset(self) -> None:
        """Forget the previous connection's Synchronize state and failure."""
        self.synchronized.clear()
        self.broken.clear()
        self.failure = ""
        self._sync_pods, self._sync_containers = [], []

    def fail(self, reason: str) -> None:
        """Mark this connection broken (the first reason is kept)."""
        if self.broken.is_set():
            return
        self.failure = reason
        self.synchronized.clear()
        self.broken.set()

    def begin(self) -> None:
        """A new connection: nothing synchronized, the assumed timeouts until
        its Configure says otherwise (not what the previous runtime said)."""
        self.reset()
        self.request_timeout, self.registration_timeout = self.assumed_timeouts

    async def handle(self, service: str, method: str, payload: bytes) -> bytes:
        """Serve one request (the transport's `Handler`)."""
        if service != PLUGIN_SERVICE:
            raise TtrpcError(Code.UNIMPLEMENTED, f"unknown service {service}")
        serve = _METHODS.get(method)
        if serve is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"{method} is not implemented")
        budget = self.request_timeout
        started = time.perf_counter()
        watchdog = asyncio.get_running_loop().call_later(budget, self._overdue, method, budget)
        try:
            return await serve(self, payload)
        except Exception as exc:
            error = self._status(method, exc)
            if method in SESSION_METHODS:
                self.fail(f"{method} failed: {error}")
            if error is exc:
                raise
            raise error from exc
        finally:
            watchdog.cancel()
            elapsed = time.perf_counter() - started
            samples = self.handler_seconds.get(method)
            if samples is None:
                samples = self.handler_seconds[method] = deque(maxlen=_TIMING_SAMPLES)
            samples.append(elapsed)
            if elapsed > budget:
                message = (
                    f"{method} answered after {elapsed:.3f} s,"
                    f" past the runtime's request timeout of {budget:.3f} s"
                )
                if method in SESSION_METHODS:
                    self.fail(message)
                else:
                    log.warning("%s", message)

    def _status(self, method: str, exc: Exception) -> TtrpcError:
        """The error status that answers a handler's exception."""
        if isinstance(exc, TtrpcError):
            return exc
        if isinstance(exc, PluginError):
            return TtrpcError(Code.UNKNOWN, describe_error(exc))
        if isinstance(exc, DecodeError):
            return TtrpcError(Code.INVALID_ARGUMENT, f"{method}: malformed request: {exc}")
        log.error("%s handler failed", method, exc_info=exc)
        return TtrpcError(
            Code.INTERNAL, f"{self.name}: internal error in {method}: {describe_error(exc)}"
        )

    def _overdue(self, method: str, budget: float) -> None:
        message = (
            f"{method} is still running after {budget:.3f} s, the runtime's request timeout:"
            " the runtime has given up waiting for it"
        )
        if method in SESSION_METHODS:
            self.fail(message)  # the stub drops the connection now
        else:
            log.warning("%s", message)  # NRI closes the connection itself

    # -- lifecycle -----------------------------------------------------------

    async def _configure(self, payload: bytes) -> bytes:
        request = lite.decode_configure_request(payload)
        if request.request_timeout > 0:
            self.request_timeout = request.request_timeout / 1000
        if request.registration_timeout > 0:
            self.registration_timeout = request.registration_timeout / 1000
        if self.on_configure is not None:
            self.on_configure(request)
        requested = await self.plugin.configure(
            request.config, request.runtime_name, request.runtime_version
        )
        valid = valid_event_mask(request.runtime_name, request.runtime_version, request.nri_version)
        mask = subscription_mask(self.plugin, valid, requested)
        log.info(
            "configured by %s %s: events 0x%x (%s), request timeout %.3g s",
            request.runtime_name,
            request.runtime_version,
            mask,
            describe_mask(mask),
            self.request_timeout,
        )
        self.events = mask
        self._sync_pods, self._sync_containers = [], []
        return lite.encode_configure_response(mask)

    async def _synchronize(self, payload: bytes) -> bytes:
        with collection_paused():
            return await self._synchronize_part(payload)

    async def _synchronize_part(self, payload: bytes) -> bytes:
        request = lite.decode_synchronize_request(payload)
        if request.more and self.plugin.synchronize_part(request.pods, request.containers):
            return lite.encode_synchronize_response(more=True)
        self._sync_pods.extend(request.pods)
        self._sync_containers.extend(request.containers)
        if request.more:
            return lite.encode_synchronize_response(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        updates = await self.plugin.synchronize(pods, containers)
        reply = lite.encode_synchronize_response(updates=_encoded(updates))
        if not self.broken.is_set():  # else the runtime gave up on it meanwhile
            self.sessions += 1
            self.synchronized.set()
        return reply

    async def _shutdown(self, payload: bytes) -> bytes:
        await self.plugin.shutdown()
        return lite.EMPTY

    async def _state_change(self, payload: bytes) -> bytes:
        """Pre-v0.12 delivery of the notification events; others are ignored."""
        request = lite.decode_state_change(payload)
        spec = BY_EVENT.get(request.event)
        if spec is None or spec.delivery is not Delivery.NOTIFY:
            log.debug("ignoring StateChange for NRI event %d", request.event)
            return lite.EMPTY
        await self._notify(spec, request.pod, request.container)
        return lite.EMPTY

    async def _notify(
        self, spec: EventSpec, pod: PodSandboxView, container: ContainerView | None
    ) -> None:
        if spec.event not in self.handled:
            return
        handler = getattr(self.plugin, spec.handler)
        if spec.pod_only:
            await handler(pod)
        else:
            await handler(pod, container)

    # -- events with a reply -------------------------------------------------

    async def _create_container(self, payload: bytes) -> bytes:
        request = lite.decode_create_container_request(payload)
        result = await self.plugin.create_container(request.pod, request.container)
        adjust, updates = _create_reply(result)
        return lite.encode_create_container_response(adjust, _encoded(updates))

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

    async def _update_pod_sandbox(self, payload: bytes) -> bytes:
        request = lite.decode_update_pod_sandbox_request(payload)
        if Event.UPDATE_POD_SANDBOX in self.handled:  # else skip parsing the resources
            await self.plugin.update_pod_sandbox(
                request.pod, request.overhead_message(), request.resources_message()
            )
        return lite.EMPTY

    async def _validate_container_adjustment(self, payload: bytes) -> bytes:
        request = lite.decode_validate_adjustment_request(payload)
        try:
            await self.plugin.validate_container_adjustment(request.pod, request.container, request)
        except PluginError as exc:
            return lite.encode_validate_adjustment_response(reject=True, reason=str(exc))
        return lite.EMPTY  # accepted


def _create_reply(
    result: CreateResult,
) -> tuple[lite.Adjustment | None, Sequence[betterproto.Message]]:
    """What create_container returned, as (adjustment, updates), its adjustment
    the lite one: a betterproto ContainerAdjustment travels serialized in it,
    and as betterproto would send it (an empty one left out unless it was set)."""
    adjust, updates = result if isinstance(result, tuple) else (result, ())
    if isinstance(adjust, nri.ContainerAdjustment):
        serialized = bytes(adjust)
        if not serialized and not betterproto.serialized_on_wire(adjust):
            return None, updates
        return lite.Adjustment(serialized=serialized), updates
    return adjust, updates


def _encoded(updates: Iterable[betterproto.Message] | None) -> list[bytes]:
    return [bytes(update) for update in updates or ()]


Serve = Callable[[PluginService, bytes], Awaitable[bytes]]


def _notify_rpc(spec: EventSpec) -> Serve:
    """Serve a v0.12 per-event RPC; events the plugin does not handle answer
    Unimplemented, so the runtime falls back to StateChange (which we ignore)."""

    async def serve(service: PluginService, payload: bytes) -> bytes:
        if spec.event not in service.handled:
            raise TtrpcError(Code.UNIMPLEMENTED, f"{spec.event.name} not handled")
        what = f"{spec.rpc}Request"
        container: ContainerView | None = None
        if spec.pod_only:
            pod = lite.decode_pod_request(payload, what)
        else:
            request = lite.decode_pod_container_request(payload, what)
            pod, container = request.pod, request.container
        await service._notify(spec, pod, container)
        return lite.EMPTY

    return serve


_OWN_RPC: dict[Any, Serve] = {
    Event.CREATE_CONTAINER: PluginService._create_container,
    Event.UPDATE_CONTAINER: PluginService._update_container,
    Event.STOP_CONTAINER: PluginService._stop_container,
    Event.UPDATE_POD_SANDBOX: PluginService._update_pod_sandbox,
    Event.VALIDATE_CONTAINER_ADJUSTMENT: PluginService._validate_container_adjustment,
}
assert set(_OWN_RPC) == {s.event for s in EVENTS if s.delivery is Delivery.RPC}

_METHODS: dict[str, Serve] = {
    "Configure": PluginService._configure,
    "Synchronize": PluginService._synchronize,
    "Shutdown": PluginService._shutdown,
    "StateChange": PluginService._state_change,
    **{
        spec.rpc: _OWN_RPC[spec.event] if spec.delivery is Delivery.RPC else _notify_rpc(spec)
        for spec in EVENTS
    },
}
