"""The kubelet device plugin (`nri-gpushare device-plugin`): one gRPC server
per resource on the kubelet's device-plugin directory, registered with the
kubelet, advertising what `capacity` says the node can still place.

- `PluginState`: the device lists, refreshed about once a second from the
  daemon's status document and GPU health, plus the grants of
  ``Allocate`` calls whose containers the daemon does not show yet.
- `DevicePluginService`: the ``v1beta1.DevicePlugin`` service of one
  resource.  ``Allocate`` answers from memory (never waits for the daemon or
  the kubelet) with the annotation the NRI plugin reads; the IDs it handed
  out count as in use until the daemon shows them on a new live container,
  the kubelet shows it no longer holds them (it offers them again in
  ``GetPreferredAllocation`` or allocates them again), or an hour passes (the
  kubelet allocates at admission; the container is created after the image
  pull and the init containers, which can take long).
- `DevicePlugin`: the sockets and the registration.  The kubelet deletes
  every socket in the directory when it starts and creates a new
  ``kubelet.sock``; once a second this checks both, serves again where our
  socket is gone and registers again (with backoff while it fails) where the
  kubelet is new.  A second process on the same directory takes the sockets
  over; the first steps back and serves again only once they are gone.
- `serve`: all of it until SIGTERM/SIGINT, which removes our sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from nri_gpushare.config import Config
from nri_gpushare.host.sockets import bind_socket
from nri_gpushare.k8s import API_VERSION, HEALTHY, KUBELET_SOCKET, UNHEALTHY, endpoint
from nri_gpushare.k8s.capacity import Device, Grant, advertise, live_ids
from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.health import GpuHealth
from nri_gpushare.names import KUBELET_ANNOTATIONS, RESOURCES
from nri_gpushare.share.ids import BadIds, device_id, format_ids, id_number
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

PENDING_TTL = 3600.0
"""Seconds an Allocate's IDs count as in use at most, when neither the daemon
nor the kubelet shows what became of them."""
SLOT_TTL = 600.0
"""Seconds a grant also holds a container slot (max_inst).  A grant whose pod
was deleted before its container was seen holds memory and compute without
harm (its IDs stay admittable), but a slot held keeps the node's room out of
sight."""
RESTART_TTL = 360.0
"""Seconds the IDs of a container that stopped count as in use at most (the
kubelet restarts a container with the same IDs, after a back-off of up to
5 minutes), when neither the daemon nor the kubelet shows what became of them."""
POLL = 1.0
"""Seconds between refreshes of the device lists and checks of the sockets."""
STATUS_TIMEOUT = 2.0
"""Seconds the daemon's whole status reply may take."""
STATUS_MAX_BYTES = 64 << 20
"""Largest status reply read."""
HEALTH_TIMEOUT = 10.0
"""Seconds an NVML health check may take before every GPU counts as unhealthy."""
HEALTH_WAIT = 1.0
"""Seconds a refresh waits for a health check (the last result stands meanwhile)."""
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


class _Waiting(NamedTuple):
    """A grant whose container is not live yet."""

    stamp: float
    grant: Grant
    holders: frozenset[str]
    """Containers that held some of its IDs when it was made (the kubelet let
    go of them; the daemon had not yet): they do not make the grant live."""
    ttl: float = PENDING_TTL


def _holders(status: Mapping[str, Any] | None) -> list[tuple[str, Mapping[str, frozenset[int]]]]:
    """(container ID, resource -> IDs) of every live allocation in `status`."""
    out: list[tuple[str, Mapping[str, frozenset[int]]]] = []
    for alloc in (status or {}).get("allocations", ()):
        if isinstance(alloc, Mapping):
            out.append((str(alloc.get("container_id")), live_ids({"allocations": [alloc]})))
    return out


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
        health_timeout: float = HEALTH_TIMEOUT,
    ) -> None:
        self._inventory = tuple(inventory)
        self._reserve = memory_reserve_bytes
        self._max_inst = max_inst
        self._status_source = status
        self._health_source = health
        self._health_timeout = health_timeout
        self._health_job: asyncio.Future[Collection[int]] | None = None
        self._health_since = 0.0
        self._health_known = False
        self._clock = clock
        self._status: Mapping[str, Any] | None = None
        self._unhealthy: frozenset[int] = frozenset()
        self._pending: list[_Waiting] = []
        self._live: dict[str, Mapping[str, frozenset[int]]] = {}
        self._gone: set[str] = set()
        """Live containers whose IDs the kubelet handed out again: it let go of them."""
        self._reachable: bool | None = None
        self._changed = asyncio.Event()
        self.version = 0
        self.devices: dict[str, tuple[Device, ...]] = {}
        self._publish(self._advertise(None))

    @property
    def pending(self) -> tuple[Grant, ...]:
        return tuple(w.grant for w in self._pending)

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
        self.update(status, await self._health(), problem)

    async def _health(self) -> frozenset[int]:
        """The unhealthy GPUs.  One NVML check runs at a time, in a thread; a
        refresh waits for it a second at most and keeps the last result
        meanwhile.  One that has not answered within the timeout (a GPU
        wedged in the driver) makes every GPU unhealthy until it answers,
        as does having no answer yet."""
        if self._health_job is None:
            self._health_job = _in_daemon_thread(self._health_source)
            self._health_since = time.monotonic()
        job = self._health_job
        deadline = self._health_since + self._health_timeout
        await asyncio.wait({job}, timeout=max(0.0, min(deadline - time.monotonic(), HEALTH_WAIT)))
        if not job.done():
            late = time.monotonic() >= deadline
            if not late and self._health_known:
                return self._unhealthy
            if late and self._unhealthy != self._all():
                log.warning(
                    "NVML has not answered a health check for %.0f s: every GPU is reported "
                    "unhealthy until it does",
                    self._health_timeout,
                )
            return self._all()
        self._health_job = None
        try:
            unhealthy = frozenset(job.result())
        except Exception as e:
            log.warning("GPU health check failed (%s); keeping the last result", e)
            return self._unhealthy
        self._health_known = True
        return unhealthy

    @property
    def health_busy(self) -> bool:
        """Whether a health check is still running (NVML may hang in it)."""
        return self._health_job is not None and not self._health_job.done()

    def _all(self) -> frozenset[int]:
        return frozenset(g.index for g in self._inventory)

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
            holders = _holders(status)
            if status is not None:
                self._stopped(dict(holders))
            self._drop_grants(holders)
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

    def _stopped(self, live: dict[str, Mapping[str, frozenset[int]]]) -> None:
        """A container that held kubelet IDs and is gone may be restarted by
        the kubelet with the same IDs (no Allocate then): its IDs count as a
        grant again until a new container holds them, the kubelet shows it
        let go of them, or `RESTART_TTL` passes.  Its memory and compute,
        not its container slot: most such containers belong to deleted pods,
        and holding their slots would keep the node's room out of sight."""
        now = self._clock()
        for cid, held in self._live.items():
            if cid in live or cid in self._gone:
                continue
            for short, ids in held.items():
                if ids:
                    log.debug("container %s stopped: its %s %s wait", cid, short, format_ids(ids))
                    grant = Grant(short, ids, slot=False)
                    self._pending.append(_Waiting(now, grant, frozenset({cid}), RESTART_TTL))
        self._live = live
        self._gone &= live.keys()

    def _drop_grants(self, holders: Sequence[tuple[str, Mapping[str, frozenset[int]]]]) -> None:
        """Forget the grants a new live container holds and those too old."""
        now = self._clock()
        kept = []
        for waiting in self._pending:
            grant = waiting.grant
            if any(
                grant.ids & ids.get(grant.short, frozenset())
                for cid, ids in holders
                if cid not in waiting.holders
            ):
                log.debug("grant %s %s is live", grant.short, format_ids(grant.ids))
            elif now - waiting.stamp >= waiting.ttl:
                log.info(
                    "grant %s %s expired: no container took it within %.0f s",
                    grant.short,
                    format_ids(grant.ids),
                    waiting.ttl,
                )
            else:
                kept.append(waiting)
        self._pending = kept

    def grant(self, grants: Iterable[Grant]) -> None:
        """Count what an Allocate call handed out as in use from now on.  A
        new grant replaces older ones sharing its IDs: the kubelet hands IDs
        out again only once it let go of them (that container will not come)
        or to a container reusing its pod's init container's IDs."""
        now = self._clock()
        holders = _holders(self._status)
        for grant in grants:
            self._forget(grant.short, grant.ids, "the kubelet allocated its IDs again")
            old = frozenset(
                cid for cid, ids in holders if grant.ids & ids.get(grant.short, frozenset())
            )
            self._gone |= old
            self._pending.append(_Waiting(now, grant, old))
        self._publish(self._advertise(self._status))

    def kubelet_frees(self, short: str, ids: frozenset[int]) -> None:
        """The kubelet offers `ids` as available: it holds none of them, so
        grants with any of them belong to containers it gave up."""
        if self._forget(short, ids, "the kubelet lists its IDs as free"):
            self._publish(self._advertise(self._status))

    def _forget(self, short: str, ids: frozenset[int], why: str) -> bool:
        kept = [w for w in self._pending if w.grant.short != short or not w.grant.ids & ids]
        if len(kept) == len(self._pending):
            return False
        for w in self._pending:
            if w not in kept:
                log.info("grant %s %s dropped: %s", short, format_ids(w.grant.ids), why)
        self._pending = kept
        return True

    def _advertise(self, status: Mapping[str, Any] | None) -> dict[str, tuple[Device, ...]]:
        if status is not None and self._gone:
            # Their share is still in the daemon's figures, but their IDs are
            # the kubelet's to hand out: not healthy as a live container's.
            status = dict(status)
            status["allocations"] = [
                a
                for a in status.get("allocations", ())
                if not (isinstance(a, Mapping) and str(a.get("container_id")) in self._gone)
            ]
        now = self._clock()
        pending = [
            w.grant if now - w.stamp < SLOT_TTL else dataclasses.replace(w.grant, slot=False)
            for w in self._pending
        ]
        return advertise(
            status, self._inventory, self._reserve, self._max_inst, pending, self._unhealthy
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


def _in_daemon_thread(call: Callable[[], Collection[int]]) -> asyncio.Future[Collection[int]]:
    """`call()` in a thread of its own that the process does not wait for at
    exit (the default executor's would be: a hung NVML call would hang SIGTERM)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Collection[int]] = loop.create_future()

    def settle(result: Collection[int] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def run() -> None:
        try:
            result, error = call(), None
        except Exception as e:
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="gpushare-health", daemon=True).start()
    return future


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
            # must_include: an init container's IDs the pod's next container reuses.
            self._state.kubelet_frees(self.short, available - must)
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
        annotation = KUBELET_ANNOTATIONS[self.short]
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


def read_status(
    path: str, timeout: float = STATUS_TIMEOUT, limit: int = STATUS_MAX_BYTES
) -> dict[str, Any]:
    """The daemon's status document (blocking): the whole reply within
    `timeout` seconds and `limit` bytes, so that a daemon that hangs or
    trickles holds neither this thread nor memory for long."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                raise TimeoutError(f"the status reply took more than {timeout:g} s") from None
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ValueError(f"the status reply is larger than {limit} bytes")
            chunks.append(chunk)
    try:
        document = json.loads(b"".join(chunks))
    except RecursionError:
        raise ValueError("the status reply is nested too deeply") from None
    if not isinstance(document, dict):
        raise ValueError("the status reply is not a JSON object")
    return document


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
                if _identity(path) is not None:
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
                if _identity(path) is not None:
                    continue
                self._yielded.discard(short)
                log.info("%s is gone: serving %s again", path, RESOURCES[short])
            if current is None or not current.serving():
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
    indexes = [gpu.index for gpu in gpus]
    nvml: list[GpuHealth] = []

    def health() -> frozenset[int]:
        # NVML is set up in the first check: a hung nvmlInit is a hung check
        # (every GPU unhealthy), not a device plugin that never serves.
        if not nvml:
            nvml.append(GpuHealth(config.use_nvml, nvml_module))
        return nvml[0].unhealthy(indexes)

    state = PluginState(
        gpus,
        config.memory_reserve_bytes,
        config.max_inst,
        status=lambda: read_status(config.status_socket),
        health=health,
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
        "asked" if config.use_nvml else "off",
    )
    try:
        await state.refresh()
        await asyncio.gather(refresh_loop(state, stop), plugin.run(stop))
    finally:
        await plugin.close()
        if nvml and not state.health_busy:  # a hung NVML call stays in its own thread
            nvml[0].close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("nri-gpushare device-plugin: stopped")
    return 0
