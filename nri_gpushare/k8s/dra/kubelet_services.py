"""The gRPC services the DRA driver serves the kubelet: ``DRAPlugin`` (v1 and
v1beta1, one handler: `Claims`), ``DRAResourceHealth`` (v1alpha1 and v1, fed
by `HealthFeed`) and the plugin watcher's ``pluginregistration.Registration``.

A claim's failure is that claim's ``error`` in the answer (the kubelet shows
it in the pod's events and asks again), never a gRPC error: a `ClaimError`'s
text as it is, anything else as an internal error, a prepare that takes
longer than the timeout as a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from nri_gpushare.k8s.dra import (
    DRIVER,
    ClaimError,
    ClaimRef,
    DeviceHealth,
    PreparedDevice,
    Preparer,
)
from nri_gpushare.k8s.generated.dra import pluginregistration as reg
from nri_gpushare.k8s.generated.dra import v1 as health_v1
from nri_gpushare.k8s.generated.dra import v1alpha1 as health_v1alpha1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from nri_gpushare.k8s.generated.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1

log = logging.getLogger(__name__)

T = TypeVar("T")

PREPARE_TIMEOUT = 60.0
"""Seconds one claim's prepare or unprepare may take before it is an error."""
PARALLEL = 16
"""Claims prepared or unprepared at once (all requests together)."""
HEALTH_POLL = 1.0
"""Seconds between looks at the devices' health."""
HEALTH_REFRESH = 10.0
"""Seconds after which an unchanged health list is sent again, so that its
last_updated_time stays fresh for the kubelet."""
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def label(claim: ClaimRef) -> str:
    """The claim for logs and messages: ``namespace/name (uid)``."""
    return f"{claim.namespace}/{claim.name} ({claim.uid})"


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Done callback: a task given up on has its exception read (no warning)."""
    if not task.cancelled():
        task.exception()


class Claims:
    """Prepares and unprepares claims through `preparer`: one call per UID at
    a time, at most `parallel` calls at once, each within `timeout` seconds."""

    def __init__(
        self,
        preparer: Preparer,
        *,
        driver: str = DRIVER,
        timeout: float = PREPARE_TIMEOUT,
        parallel: int = PARALLEL,
    ) -> None:
        self._preparer = preparer
        self._driver = driver
        self._timeout = timeout
        self._slots = asyncio.Semaphore(parallel)
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def prepare(
        self, claims: Sequence[ClaimRef]
    ) -> dict[str, tuple[list[PreparedDevice], str]]:
        """Per claim UID: its devices and "", or no devices and the error."""
        outcomes = await self._each(claims, "preparing", self._preparer.prepare)
        return {uid: (list(devices or ()), error) for uid, (devices, error) in outcomes.items()}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID: "" or the error."""
        outcomes = await self._each(claims, "unpreparing", self._preparer.unprepare)
        return {uid: error for uid, (_, error) in outcomes.items()}

    async def _each(
        self, claims: Sequence[ClaimRef], verb: str, call: Callable[[ClaimRef], Awaitable[T]]
    ) -> dict[str, tuple[T | None, str]]:
        unique: dict[str, ClaimRef] = {}
        for claim in claims:
            unique.setdefault(claim.uid, claim)  # a UID twice: once
        results = await asyncio.gather(*(self._one(c, verb, call) for c in unique.values()))
        return dict(zip(unique, results, strict=True))

    async def _one(
        self, claim: ClaimRef, verb: str, call: Callable[[ClaimRef], Awaitable[T]]
    ) -> tuple[T | None, str]:
        task = asyncio.ensure_future(self._locked(claim, call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            task.cancel()  # not awaited: a call that ignores it holds no request
            log.error("%s claim %r took more than %g s", verb, label(claim), self._timeout)
            return None, (
                f"{self._driver}: {verb} claim {label(claim)} took more than "
                f"{self._timeout:g} s (the kubelet will try again)"
            )
        try:
            result = task.result()
        except ClaimError as e:
            log.warning("%s claim %r failed: %s", verb, label(claim), e)
            return None, str(e) or f"{verb} the claim failed"
        except Exception as e:
            log.error("%s claim %r failed", verb, label(claim), exc_info=e)
            return None, f"internal error in the {self._driver} driver: {type(e).__name__}: {e}"
        log.info("%s claim %r: done", verb, label(claim))
        return result, ""

    async def _locked(self, claim: ClaimRef, call: Callable[[ClaimRef], Awaitable[T]]) -> T:
        uid = claim.uid
        lock = self._locks.setdefault(uid, asyncio.Lock())
        self._users[uid] = self._users.get(uid, 0) + 1
        try:
            async with lock, self._slots:
                return await call(claim)
        finally:
            self._users[uid] -= 1
            if not self._users[uid]:
                del self._users[uid], self._locks[uid]

    async def close(self) -> None:
        """Cancel the calls still running (given up on by a timeout or a
        kubelet that went away)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 1.0)


def _device(pb: Any, device: PreparedDevice) -> Any:
    return pb.Device(
        request_names=list(device.requests),
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=list(device.cdi_ids),
        share_id=device.share_id or None,
    )


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class _DraPlugin:
    """``DRAPlugin`` of the generated module `pb` (one per API version)."""

    pb: Any

    def __init__(self, claims: Claims) -> None:
        self._claims = claims

    async def node_prepare_resources(self, request: Any) -> Any:
        pb = self.pb
        outcomes = await self._claims.prepare(_refs(request.claims))
        return pb.NodePrepareResourcesResponse(
            claims={
                uid: pb.NodePrepareResourceResponse(
                    devices=[_device(pb, d) for d in devices], error=error
                )
                for uid, (devices, error) in outcomes.items()
            }
        )

    async def node_unprepare_resources(self, request: Any) -> Any:
        pb = self.pb
        errors = await self._claims.unprepare(_refs(request.claims))
        return pb.NodeUnprepareResourcesResponse(
            claims={uid: pb.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()}
        )


class DraPluginV1(_DraPlugin, dra_v1.DraPluginBase):  # type: ignore[misc]  # untyped bindings
    pb = dra_v1


class DraPluginV1beta1(_DraPlugin, dra_v1beta1.DraPluginBase):  # type: ignore[misc]
    pb = dra_v1beta1


class HealthFeed:
    """The preparer's device health for the streams of one server: a list
    when it changes (looked at every `poll` seconds) or is `refresh` seconds
    old; `stop()` ends every stream."""

    def __init__(
        self, preparer: Preparer, poll: float = HEALTH_POLL, refresh: float = HEALTH_REFRESH
    ) -> None:
        self._preparer = preparer
        self._poll = poll
        self._refresh = refresh
        self._stopped = asyncio.Event()
        self._failing = False
        self.streams = 0

    def stop(self) -> None:
        self._stopped.set()

    def _look(self) -> list[DeviceHealth] | None:
        try:
            devices = list(self._preparer.health())
        except Exception:  # a bug: keep the last list, say so once
            if not self._failing:
                log.exception("reading the devices' health failed")
            self._failing = True
            return None
        self._failing = False
        return devices

    async def updates(self) -> AsyncIterator[list[DeviceHealth]]:
        self.streams += 1
        try:
            sent: list[DeviceHealth] | None = None
            sent_at = 0.0
            while not self._stopped.is_set():
                now = self._look()
                if now is not None and (now != sent or time.monotonic() - sent_at >= self._refresh):
                    yield now
                    sent, sent_at = now, time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self._poll)
        finally:
            self.streams -= 1


class _Health:
    """``DRAResourceHealth`` of the generated module `pb` (one per version)."""

    pb: Any

    def __init__(self, feed: HealthFeed) -> None:
        self._feed = feed

    async def node_watch_resources(self, request: Any) -> AsyncIterator[Any]:
        pb = self.pb
        async for devices in self._feed.updates():
            now = int(time.time())
            yield pb.NodeWatchResourcesResponse(
                devices=[
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                        health=pb.HealthStatus.HEALTHY if d.healthy else pb.HealthStatus.UNHEALTHY,
                        last_updated_time=now,
                        health_check_timeout_seconds=0,  # the kubelet's default
                        message=d.message,
                    )
                    for d in devices
                ]
            )


class HealthV1alpha1(_Health, health_v1alpha1.DraResourceHealthBase):  # type: ignore[misc]
    pb = health_v1alpha1


class HealthV1(_Health, health_v1.DraResourceHealthBase):  # type: ignore[misc]
    pb = health_v1


class Registration(reg.RegistrationBase):  # type: ignore[misc]  # untyped bindings
    """``pluginregistration.Registration``: what the kubelet's plugin watcher
    asks, and what it answers (`registered`, `error`)."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = False
        self.error = ""

    async def get_info(self, request: reg.InfoRequest) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def notify_registration_status(
        self, status: reg.RegistrationStatus
    ) -> reg.RegistrationStatusResponse:
        self.registered = bool(status.plugin_registered)
        self.error = status.error
        if self.registered:
            log.info("the kubelet registered the %s DRA plugin (%s)", self.driver, self.endpoint)
        else:
            log.error("the kubelet refused the %s DRA plugin: %r", self.driver, status.error)
        return reg.RegistrationStatusResponse()
