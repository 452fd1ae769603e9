"""The NRI handler: NRI pods and containers become `ContainerInfo` values
for the share domain, and its `InjectionPlan` a ContainerAdjustment.

CreateContainer asks `ShareService.lifecycle` and answers within
`ANSWER_WITHIN` of the runtime's request timeout (a late answer is lost, so
its share is released); a pod refused for fragmentation (the kubelet admitted
it, no GPU can take it) also gets a ``GPUShareFragmented`` Warning event with
config ``kubernetes.events`` (`PodEvents`), posted in the background.
Synchronize rebuilds the table (`ShareService.recovery`) and applies the
node's `unserved` policy, as PostStartContainer does to a container found
unserved; Configure first waits (briefly) until containerd's events are
followed (`Follower`): they keep the unserved list exact while the plugin
registers (`UnservedPolicy`).  Each handler's time is counted (`timed`) for
the metrics' histogram.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from nri_gpushare.daemon.adapters import PodEvents
from nri_gpushare.daemon.nri_views import container_info, may_ask
from nri_gpushare.daemon.sync_gather import SyncState
from nri_gpushare.daemon.unserved_policy import Follower, UnservedPolicy
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import Adjustment, ContainerView, Device, MountSpec, PodSandboxView
from nri_gpushare.nri.stub import EventMask, Plugin, PluginError
from nri_gpushare.share.model import ContainerInfo, InjectionPlan, ShareRefused
from nri_gpushare.share.service import ShareService

log = logging.getLogger(__name__)

ANSWER_WITHIN = 0.8
"""Share of the runtime's request timeout CreateContainer may take (the rest
is the runtime's and the wire's)."""
MARK_REMOVAL = "-"
"""NRI: an adjustment's annotation key with this prefix removes the annotation."""


def adjustment(plan: InjectionPlan) -> Adjustment:
    """The NRI container adjustment carrying the plan's devices, env, mounts, annotations."""
    removals = {MARK_REMOVAL + key: "" for key in plan.remove_annotations}
    return Adjustment(
        annotations={**plan.annotations, **removals},
        env=list(plan.env.items()),
        devices=[
            Device(path=d.path, type=d.type, major=d.major, minor=d.minor, file_mode=d.mode)
            for d in plan.devices
        ],
        mounts=[
            MountSpec(destination=m.destination, type=m.type, source=m.source, options=m.options)
            for m in plan.mounts
        ],
    )


# -- the time each handler takes (the metrics' histogram) ------------------------------

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds (seconds) of the NRI handler latency histogram (+Inf added)."""


@dataclass
class Histogram:
    """Observations in `LATENCY_BUCKETS` (non-cumulative; the last is +Inf)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        i = next((i for i, le in enumerate(LATENCY_BUCKETS) if seconds <= le), -1)
        self.counts[i] += 1
        self.total += seconds

    def copy(self) -> Histogram:
        return Histogram(list(self.counts), self.total)


@dataclass
class HandlerLatency:
    """Time spent in the plugin's NRI handlers, per event (on the event loop)."""

    events: dict[str, Histogram] = field(default_factory=dict)

    def observe(self, event: str, seconds: float) -> None:
        self.events.setdefault(event, Histogram()).observe(seconds)

    def copy(self) -> dict[str, Histogram]:
        return {event: h.copy() for event, h in self.events.items()}


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def timed(event: str) -> Callable[[Handler], Handler]:
    """Count the time the handler takes in its plugin's `latency` under `event`."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(self: GpuShareHandler, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return await handler(self, *args)
            finally:
                self.latency.observe(event, time.perf_counter() - started)

        return cast(Handler, run)

    return decorate


class GpuShareHandler(Plugin):
    """NRI events -> share domain."""

    def __init__(
        self,
        service: ShareService,
        request_timeout: Callable[[], float] = lambda: 2.0,
        events: PodEvents | None = None,
        follower: Follower | None = None,
    ) -> None:
        self.service = service
        #: Kubernetes events on refused pods; None: config kubernetes.events is off.
        self.events = events
        self.unserved = UnservedPolicy(service, follower)
        #: Seconds the runtime waits for an answer (the stub knows; 2 s is NRI's default).
        self.request_timeout = request_timeout
        #: Time spent in each handler, per event (the metrics' histogram).
        self.latency = HandlerLatency()
        self._sync = SyncState()

    async def configure(
        self, config: str, runtime_name: str, runtime_version: str
    ) -> EventMask | None:
        self._sync = SyncState()  # a new connection: what a broken one gathered goes
        await self.unserved.followed(self.request_timeout())
        return None

    def synchronize_part(self, pods: list[PodSandboxView], containers: list[ContainerView]) -> bool:
        """A Synchronize request more follow: reduced to what the domain needs
        right away, so that no view (and no request buffer) outlives it."""
        self._sync.gather(pods, containers)
        return True

    @timed("synchronize")
    async def synchronize(
        self, pods: list[PodSandboxView], containers: list[ContainerView]
    ) -> list[nri.ContainerUpdate]:
        sync, self._sync = self._sync, SyncState()
        sync.gather(pods, containers)
        live = sync.finish()
        await self.service.recovery.synchronize(live)
        for entry in list(self.service.unserved.values()):
            self.unserved.deny(entry)
        log.info(
            "synchronized: %d pod(s), %d container(s), %d GPU allocation(s), %d unserved",
            sync.pods_seen,
            sync.containers_seen,
            len(self.service.allocations),
            len(self.service.unserved),
        )
        return []

    @timed("create_container")
    async def create_container(
        self, pod: PodSandboxView, container: ContainerView
    ) -> Adjustment | None:
        if not may_ask(container, pod) and not self.service.holds(container.id):
            return None  # nothing of ours in it: nothing decoded, nothing to do
        loop = asyncio.get_running_loop()
        # The decision line is written once the answer is on its way (call_soon
        # runs after the transport wrote it): containerd does not wait for it.
        with self.service.decisions.held(loop.call_soon):
            return await self._create(loop, pod, container)

    async def _create(
        self, loop: asyncio.AbstractEventLoop, pod: PodSandboxView, container: ContainerView
    ) -> Adjustment | None:
        # Answer before the runtime gives up: a late answer is lost (containerd
        # creates the container without it), so its share must not stay booked.
        deadline = loop.time() + ANSWER_WITHIN * self.request_timeout()
        info = container_info(pod, container)
        try:
            async with asyncio.timeout_at(deadline):
                plan = await self.service.lifecycle.create_container(info)  # logs placed / refused
        except ShareRefused as exc:
            if exc.reason == "fragmentation" and self.events is not None:
                self.events.fragmented(info, str(exc))
            raise PluginError(str(exc)) from None
        except TimeoutError:
            raise PluginError(self._late(info)) from None
        if plan is not None and loop.time() > deadline:
            why = "placed too late: the runtime gave up"
            await self.service.lifecycle.release(container.id, why)
            raise PluginError(self._late(info))
        return adjustment(plan) if plan is not None else None

    def _late(self, info: ContainerInfo) -> str:
        message = (
            f"gpushare: {info.describe()}: not placed within the "
            f"runtime's request timeout ({self.request_timeout():g} s); nothing was reserved, "
            f"retry"
        )
        self.service.decisions.refused_container(info, "timeout", message)
        return message

    @timed("post_start_container")
    async def post_start_container(self, pod: PodSandboxView, container: ContainerView) -> None:
        cid = container.id
        entry = self.service.unserved.get(cid)
        if entry is not None:  # created while the plugin was away: now it has a process
            entry.container = container_info(pod, container)
        elif self._unheld(cid) and may_ask(container, pod):
            # Its StartContainer was the event containerd dropped while this
            # plugin registered (queued behind Synchronize).
            info = container_info(pod, container)
            if await self.service.lifecycle.readopt(info):
                await self._start(info)
                return
            entry = self.service.unserved_watch.started(info)
        if entry is not None:
            self.unserved.deny(entry)

    def _unheld(self, container_id: str) -> bool:
        """Nothing is bound or limited for the container: no share of it is known."""
        service = self.service
        return container_id not in service.allocations and container_id not in service.registered

    def _hand_started(self, container_id: str) -> bool:
        """The ID holds a share asked for outside NRI: NRI events about a
        container of the same ID (another namespace) must not touch it."""
        held = self.service.allocations.get(container_id)
        return held is not None and held.local

    @timed("start_container")
    async def start_container(self, pod: PodSandboxView, container: ContainerView) -> None:
        cid = container.id
        if self._hand_started(cid):
            return
        service = self.service
        if self._unheld(cid):
            # Nothing to bind or limit: nothing decoded (most containers).  One
            # that asks was created without the plugin: unserved (post-start
            # applies the node's policy once it has a process), unless it was
            # placed just before a Synchronize that did not list it yet.
            if cid not in service.unserved and may_ask(container, pod):
                info = container_info(pod, container)
                if await service.lifecycle.readopt(info):
                    await self._start(info)
                else:
                    service.unserved_watch.started(info)
            return
        await self._start(container_info(pod, container))

    async def _start(self, info: ContainerInfo) -> None:
        try:
            await self.service.lifecycle.start_container(info)
        except ShareRefused as exc:
            self.service.decisions.refused_container(info, exc.reason, str(exc))
            raise PluginError(str(exc)) from None

    @timed("stop_container")
    async def stop_container(
        self, pod: PodSandboxView, container: ContainerView
    ) -> list[nri.ContainerUpdate]:
        if not self._hand_started(container.id):
            await self.service.lifecycle.release(container.id, "stopped (StopContainer)")
        return []

    @timed("remove_container")
    async def remove_container(self, pod: PodSandboxView, container: ContainerView) -> None:
        if not self._hand_started(container.id):
            await self.service.lifecycle.release(container.id, "removed (RemoveContainer)")
            self.service.unserved_watch.gone(container.id)

    @timed("stop_pod_sandbox")
    async def stop_pod_sandbox(self, pod: PodSandboxView) -> None:
        self.service.lifecycle.pod_stopped(pod.uid, f"{pod.namespace}/{pod.name}", pod.annotations)
