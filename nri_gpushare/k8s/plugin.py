"""The kubelet device plugin (`nri-gpushare device-plugin`): one gRPC server
per resource on the kubelet's device-plugin directory, registered with the
kubelet, advertising what `capacity` says the node can still place.

- `PluginState`: the device lists, refreshed about once a second from the
  daemon's status document and GPU health, plus the grants of recent
  ``Allocate`` calls whose containers the daemon does not show yet.
- `DevicePluginService`: the ``v1beta1.DevicePlugin`` service of one
  resource.  ``Allocate`` answers from memory (never waits for the daemon or
  the kubelet) with the annotation the NRI plugin reads; the IDs it handed
  out count as in use until the daemon shows them on a live container or ten
  minutes pass (the kubelet allocates at admission, the container is created
  after the image pull).
- `DevicePlugin`: the sockets and the registration.  The kubelet deletes
  every socket in the directory when it starts and creates a new
  ``kubelet.sock``; once a second this checks both, serves again where our
  socket is gone and registers again (with backoff while it fails) where the
  kubelet is new.
- `serve`: all of it until SIGTERM/SIGINT, which removes our sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from ..config import Config
from ..share.model import Gpu
from ..status import _bind, query_status
from . import ANNOTATIONS, API_VERSION, HEALTHY, KUBELET_SOCKET, RESOURCES, UNHEALTHY, endpoint
from .capacity import Device, Grant, advertise, live_ids
from .generated import v1beta1 as pb
from .health import GpuHealth
from .ids import BadIds, device_id, format_ids, id_number

log = logging.getLogger(__name__)

PENDING_TTL = 600.0
"""Seconds an Allocate's IDs count as in use before the daemon shows them."""
POLL = 1.0
"""Seconds between refreshes of the device lists and checks of the sockets."""
STATUS_TIMEOUT = 2.0
REGISTER_TIMEOUT = 5.0
REGISTER_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before each further Register attempt after a failure (then the last)."""
SOCKET_MODE = 0o600
STOP_GRACE = 2.0
"""Seconds streams get to end cleanly before a server is closed."""

StatusSource = Callable[[], Mapping[str, Any]]
"""The daemon's status document (blocking); raises when it cannot be had."""
HealthSource = Callable[[], Collection[int]]
"""The GPU indexes that are unhealthy (blocking)."""

OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)


class PluginState:
    """The device lists of every resource and what they are computed from."""

    def __init__(
        self,
        inventory: Sequence[Gpu],
        memory_reserve_bytes: int,
        max_inst: int,
        status: StatusSource,
        health: HealthSource = frozenset,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inventory = tuple(inventory)
        self._reserve = memory_reserve_bytes
        self._max_inst = max_inst
        self._status_source = status
        self._health_source = health
        self._clock = clock
        self._status: Mapping[str, Any] | None = None
        self._unhealthy: frozenset[int] = frozenset()
        self._pending: list[tuple[float, Grant]] = []
        self._reachable: bool | None = None
        self._changed = asyncio.Event()
        self.version = 0
        self.devices: dict[str, tuple[Device, ...]] = {}
        self._publish(self._advertise(None))

    @property
    def pending(self) -> tuple[Grant, ...]:
        return tuple(grant for _, grant in self._pending)

    def listed(self, short: str) -> frozenset[int]:
        """The numbers of the devices `short` lists (healthy or not)."""
        return frozenset(id_number(d.id) for d in self.devices[short])

    async def refresh(self) -> None:
        """Ask the daemon and NVML (off the loop) and recompute."""
        try:
            status: Mapping[str, Any] | None = await asyncio.to_thread(self._status_source)
            problem = ""
        except Exception as e:  # down, restarting, a garbled reply: nothing is free
            status, problem = None, str(getattr(e, "strerror", None) or e)
        try:
            unhealthy = frozenset(await asyncio.to_thread(self._health_source))
        except Exception as e:
            log.warning("GPU health check failed (%s); keeping the last result", e)
            unhealthy = self._unhealthy
        self.update(status, unhealthy, problem)

    def update(
        self, status: Mapping[str, Any] | None, unhealthy: frozenset[int], problem: str = ""
    ) -> None:
        """Take a new status document (None: the daemon cannot be reached,
        `problem` says why) and the unhealthy GPUs; drop the grants the
        daemon now shows or that are too old; recompute."""
        if unhealthy != self._unhealthy:
            log.warning("unhealthy GPUs (NVML): %s", sorted(unhealthy) or "none")
        self._unhealthy = unhealthy
        try:
            live = live_ids(status) if status is not None else {}
            self._drop_grants(live)
            devices = self._advertise(status)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if status is None:
                raise
            # A daemon of another version, say: treat it as unreachable.
            status, problem = None, f"the document is not understood: {type(e).__name__} {e}"
            devices = self._advertise(None)
        if (status is not None) != self._reachable:
            if status is None:
                log.warning(
                    "the daemon's status cannot be read (%s): every device is reported "
                    "unhealthy until it can (is `nri-gpushare run` running?)",
                    problem or "no reply",
                )
            else:
                log.info("the daemon's status can be read: advertising its free capacity")
            self._reachable = status is not None
        self._status = status
        self._publish(devices)

    def _drop_grants(self, live: Mapping[str, frozenset[int]]) -> None:
        """Forget the grants whose IDs are live and those too old."""
        now = self._clock()
        kept = []
        for stamp, grant in self._pending:
            if grant.ids & live.get(grant.short, frozenset()):
                log.debug("grant %s %s is live", grant.short, format_ids(grant.ids))
            elif now - stamp >= PENDING_TTL:
                log.info(
                    "grant %s %s expired: no container took it within %.0f s",
                    grant.short,
                    format_ids(grant.ids),
                    PENDING_TTL,
                )
            else:
                kept.append((stamp, grant))
        self._pending = kept

    def grant(self, grants: Iterable[Grant]) -> None:
        """Count what an Allocate call handed out as in use from now on."""
        now = self._clock()
        self._pending.extend((now, grant) for grant in grants)
        self._publish(self._advertise(self._status))

    def _advertise(self, status: Mapping[str, Any] | None) -> dict[str, tuple[Device, ...]]:
        return advertise(
            status, self._inventory, self._reserve, self._max_inst, self.pending, self._unhealthy
        )

    def _publish(self, devices: dict[str, tuple[Device, ...]]) -> None:
        if devices != self.devices:
            self.devices = devices
            self.version += 1
            self.wake()

    def wake(self) -> None:
        """Wake every `changed` waiter."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, version: int) -> None:
        """Return once `version` is not current, or on `wake`."""
        if self.version == version:
            await self._changed.wait()


def _response(devices: Sequence[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(
        devices=[pb.Device(id=d.id, health=HEALTHY if d.healthy else UNHEALTHY) for d in devices]
    )


def _refuse(message: str) -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, message)


class DevicePluginService(pb.DevicePluginBase):  # type: ignore[misc]  # untyped bindings
    """``v1beta1.DevicePlugin`` for one resource (`short`)."""

    def __init__(self, short: str, state: PluginState) -> None:
        self.short = short
        self.resource = RESOURCES[short]
        self._state = state
        self._stopped = False
        self.streams = 0

    def stop(self) -> None:
        """End every ListAndWatch stream (cleanly, with status OK)."""
        self._stopped = True
        self._state.wake()

    async def get_device_plugin_options(self, empty: pb.Empty) -> pb.DevicePluginOptions:
        return OPTIONS

    async def list_and_watch(self, empty: pb.Empty) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.streams += 1
        try:
            sent: tuple[Device, ...] | None = None
            while not self._stopped:
                version, devices = self._state.version, self._state.devices[self.short]
                if devices != sent:
                    yield _response(devices)
                    sent = devices
                    continue  # the lists may have changed while it was sent
                await self._state.changed(version)
        finally:
            self.streams -= 1

    async def get_preferred_allocation(
        self, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        """must_include first, then the lowest-numbered available IDs."""
        responses = []
        for container in request.container_requests:
            available = self._numbers(container.available_device_i_ds)
            must = self._numbers(container.must_include_device_i_ds)
            size = container.allocation_size
            if not 0 <= size <= len(available | must):
                raise _refuse(
                    f"{self.resource}: allocation size {size} is not between 0 and the "
                    f"{len(available | must)} available devices"
                )
            chosen = sorted(must) + sorted(available - must)[: max(0, size - len(must))]
            responses.append(
                pb.ContainerPreferredAllocationResponse(device_i_ds=[device_id(n) for n in chosen])
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """Each container's IDs as the annotation the NRI plugin reads; every
        container's IDs are checked before any counts as handed out."""
        listed = self._state.listed(self.short)
        grants = []
        for container in request.container_requests:
            ids = self._numbers(container.devices_ids)
            if not ids:
                raise _refuse(f"{self.resource}: a container request without device IDs")
            if len(ids) != len(container.devices_ids):
                raise _refuse(f"{self.resource}: a container request repeats device IDs")
            unknown = ids - listed
            if unknown:
                raise _refuse(
                    f"{self.resource}: device IDs {format_ids(unknown)[:64]} are not "
                    f"advertised by this plugin (it lists {len(listed)} devices, "
                    f"IDs {format_ids(listed) or 'none'})"
                )
            grants.append(Grant(self.short, ids))
        self._state.grant(grants)
        annotation = ANNOTATIONS[self.short]
        texts = [format_ids(grant.ids) for grant in grants]
        log.info("Allocate %s: %s", self.resource, "; ".join(texts))
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(annotations={annotation: text}) for text in texts
            ]
        )

    def _numbers(self, devices: Sequence[str]) -> frozenset[int]:
        try:
            return frozenset(id_number(d) for d in devices)
        except BadIds as e:
            raise _refuse(f"{self.resource}: {e}") from None


def _identity(path: str) -> tuple[int, int, int] | None:
    """What tells one file at `path` from a later one; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class _Endpoint:
    """One resource's server and the socket it was started on."""

    def __init__(self, service: DevicePluginService, server: Server, path: str) -> None:
        self.service = service
        self.server = server
        self.path = path
        self.identity = _identity(path)

    def serving(self) -> bool:
        return self.identity is not None and _identity(self.path) == self.identity

    async def close(self) -> None:
        self.service.stop()
        deadline = time.monotonic() + STOP_GRACE
        while self.service.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the ended streams' trailers go out
        self.server.close()
        try:
            await asyncio.wait_for(self.server.wait_closed(), STOP_GRACE)
        except TimeoutError:
            log.warning("%s: requests still running after %.0f s", self.path, STOP_GRACE)
        if _identity(self.path) == self.identity:
            _unlink(self.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
        self.registrations = 0

    def socket_path(self, short: str) -> str:
        return os.path.join(self.directory, endpoint(short))

    @property
    def registered(self) -> frozenset[str]:
        return frozenset(self._registered)

    async def run(self, stop: asyncio.Event, poll: float = POLL) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # a bug: keep serving what is served
                log.exception("checking the sockets and the registration failed")
            try:
                await asyncio.wait_for(stop.wait(), poll)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """Serve where our socket is gone, register where the kubelet is new
        or an attempt is due."""
        for short in RESOURCES:
            current = self._endpoints.get(short)
            if current is None or not current.serving():
                if current is not None:
                    log.info("%s was removed (the kubelet restarted?): serving again", current.path)
                if await self._serve(short):
                    self._registered.discard(short)
        kubelet = _identity(self.kubelet_socket)
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
            _unlink(path)  # a stale socket of an earlier run
            sock = _bind(path, SOCKET_MODE)
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


async def refresh_loop(state: PluginState, stop: asyncio.Event, poll: float = POLL) -> None:
    while not stop.is_set():
        try:
            await state.refresh()
        except Exception:  # a bug: keep the last lists
            log.exception("refreshing the device lists failed")
        try:
            await asyncio.wait_for(stop.wait(), poll)
        except TimeoutError:
            pass


async def serve(config: Config, gpus: Sequence[Gpu], nvml_module: Any = None) -> int:
    """Run the device plugin until SIGTERM or SIGINT; 0 when stopped so."""
    health = await asyncio.to_thread(GpuHealth, config.use_nvml, nvml_module)
    indexes = [gpu.index for gpu in gpus]
    state = PluginState(
        gpus,
        config.memory_reserve_bytes,
        config.max_inst,
        status=lambda: query_status(config.status_socket, STATUS_TIMEOUT),
        health=lambda: health.unhealthy(indexes),
    )
    plugin = DevicePlugin(config.device_plugin_dir, state)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "nri-gpushare device-plugin: %d GPU(s), device-plugin dir %s, daemon status %s, NVML %s",
        len(gpus),
        config.device_plugin_dir,
        config.status_socket,
        "on" if health.active else "off",
    )
    try:
        await state.refresh()
        await asyncio.gather(refresh_loop(state, stop), plugin.run(stop))
    finally:
        await plugin.close()
        await asyncio.to_thread(health.close)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("nri-gpushare device-plugin: stopped")
    return 0
