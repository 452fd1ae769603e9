"""The daemon: the only place where NRI messages meet the share domain.

`GpuShareHandler` is an NRI plugin (stub API) that turns NRI pods and
containers into `ContainerInfo` values, asks the `ShareService`, and turns its
`InjectionPlan` into a ContainerAdjustment.  `run_daemon` wires config,
inventory, kernel module, the interposer's files, the driver's memory limits
(NVML), status socket and the NRI stub, and shuts down cleanly on
SIGTERM/SIGINT.

The event loop never blocks on the kernel module: the service awaits it, and
the blocking procfs client runs on one worker thread under a timeout
(`nri_gpushare.kmod.worker`).

A pod refused for fragmentation (the kubelet admitted it, no GPU can take
it) also gets a ``GPUShareFragmented`` Warning event with config
``kubernetes.events`` (`PodEvents`), posted in the background: CreateContainer
never waits for the API server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.metadata
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from nri_gpushare.config import Config, ConfigError
from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.daemon.local_server import LocalApiServer
from nri_gpushare.daemon.metrics import HandlerLatency, MetricsServer, SnapshotCollector
from nri_gpushare.daemon.metrics import Snapshot as MetricsSnapshot
from nri_gpushare.daemon.status import StatusServer
from nri_gpushare.host.containerd.client import ContainerdClient, ContainerdUnavailable
from nri_gpushare.host.containerd.reconcile import Reconciler
from nri_gpushare.host.devices import (
    HostDevices,
    cgroup_of,
    kill_container,
    library_problem,
    load_inventory,
    write_preload_file,
)
from nri_gpushare.host.driver_limits import NvmlMemoryLimits
from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.host.meminfo import ModuleMemInfo
from nri_gpushare.host.statefile import StateDirError, StateFile
from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.k8s.events import PodRef, post_pod_event
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import Adjustment, ContainerView, Device, MountSpec, PodSandboxView
from nri_gpushare.nri.stub import EventMask, Plugin, PluginError, Stub
from nri_gpushare.nri.stub.runtime import RuntimeConnectionLost
from nri_gpushare.share.interposer import preload_file_text
from nri_gpushare.share.kernel import KernelModule
from nri_gpushare.share.model import (
    ContainerInfo,
    InjectionPlan,
    LocalRef,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS
from nri_gpushare.share.service import ShareService, Unserved
from nri_gpushare.share.usage import GpuTimeSource, MemoryUsage, ModuleGpuTime

log = logging.getLogger(__name__)

ANSWER_WITHIN = 0.8
"""Share of the runtime's request timeout CreateContainer may take (the rest
is the runtime's and the wire's)."""
SAMPLE_EVERY = 5.0
"""Seconds between two readings of every registered container's GPU time."""
MARK_REMOVAL = "-"
"""NRI: an adjustment's annotation key with this prefix removes the annotation."""


class PodFields(Protocol):
    """What the domain reads of a pod: a `PodSandboxView` or a `PodHead`."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class PodHead:
    """A pod as Synchronize keeps it between requests: no view, so no request
    buffer, stays referenced; annotations only for a pod that may ask."""

    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str]
    asking: bool


def container_info(pod: PodFields | None, container: ContainerView) -> ContainerInfo:
    """The domain's view of an NRI container (labels, annotations, env, cgroup)."""
    env: dict[str, str] = {}
    for entry in container.env:
        key, _, value = entry.partition("=")
        env[key] = value
    return ContainerInfo(
        id=container.id,
        name=container.name,
        pod_name=pod.name if pod else "",
        pod_namespace=pod.namespace if pod else "",
        pod_uid=pod.uid if pod else "",
        pod_annotations=pod.annotations if pod else {},
        annotations=container.annotations,
        labels=container.labels,
        env=env,
        cgroups_path=container.cgroups_path,
        pid=container.pid,
        running=container.state != nri.ContainerState.CONTAINER_STOPPED,
    )


def may_ask(*views: PodSandboxView | ContainerView) -> bool:
    """`may_ask_raw` on the views' serialized bytes, searched in place (no
    copy, nothing decoded)."""
    for view in views:
        if view.contains_any(COARSE_MARKERS) and view.contains_any(RAW_MARKERS):
            return True
    return False


def bare_info(pod: PodFields | None, container: ContainerView) -> ContainerInfo:
    """`container_info` for a container that cannot ask for a share (`may_ask_raw`
    said no): its labels, annotations and environment are neither read nor
    kept, since nothing in the domain reads them for such a container."""
    return ContainerInfo(
        id=container.id,
        name=container.name,
        pod_name=pod.name if pod else "",
        pod_namespace=pod.namespace if pod else "",
        pod_uid=pod.uid if pod else "",
        cgroups_path=container.cgroups_path,
        pid=container.pid,
        running=container.state != nri.ContainerState.CONTAINER_STOPPED,
    )


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


PostEvent = Callable[[PodRef, str, str], Awaitable[None]]
"""Posts an event: (pod, reason, message); raises when it was not posted."""

FRAGMENTED = "GPUShareFragmented"
"""The event reason of a pod refused for fragmentation."""


async def post_event(pod: PodRef, reason: str, message: str) -> None:
    """The API server's, through `nri_gpushare.k8s.events`."""
    await post_pod_event(pod, reason, message)


class PodEvents:
    """Kubernetes events about pods (config ``kubernetes.events``), each
    posted by a task of its own, so that the NRI handler that decides never
    waits for the API server; a failure is logged.  At most `MAX_IN_FLIGHT`
    are under way: more are logged and dropped (the kubelet's own "Failed"
    event on the pod carries the same message anyway).

    The kubelet retries a refused container every few seconds for as long as
    the pod exists, and each post is a new Event object in the API server
    (the kubelet's own events are aggregated, ours are not): so one
    container gets at most one event per `REPEAT_AFTER` seconds, whatever
    number of pods are stuck, remembering the last `MAX_REMEMBERED`
    containers."""

    MAX_IN_FLIGHT = 16
    REPEAT_AFTER = 600.0
    MAX_REMEMBERED = 4096

    def __init__(
        self, post: PostEvent = post_event, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.post = post
        self.clock = clock
        self.tasks: set[asyncio.Task[None]] = set()
        #: (namespace, pod, uid, container) -> clock() of its last event, oldest first
        self.posted: dict[tuple[str, str, str, str], float] = {}

    def fragmented(self, c: ContainerInfo, message: str) -> None:
        """Post `FRAGMENTED` on the container's pod (none outside Kubernetes)."""
        if not c.pod_name:
            return
        now = self.clock()
        key = (c.pod_namespace[:256], c.pod_name[:256], c.pod_uid[:256], c.name[:256])
        last = self.posted.get(key)
        if last is not None and now - last < self.REPEAT_AFTER:
            log.debug("%s: the %s event was posted lately; not again", c.describe(), FRAGMENTED)
            return
        if len(self.tasks) >= self.MAX_IN_FLIGHT:
            log.warning(
                "%s: %d Kubernetes events still being posted; the %s event is dropped",
                c.describe(),
                len(self.tasks),
                FRAGMENTED,
            )
            return
        self.posted.pop(key, None)
        self.posted[key] = now
        while len(self.posted) > self.MAX_REMEMBERED:
            del self.posted[next(iter(self.posted))]
        pod = PodRef(c.pod_namespace, c.pod_name, c.pod_uid)
        task = asyncio.get_running_loop().create_task(
            self._send(c, pod, FRAGMENTED, message), name="kubernetes-event"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, c: ContainerInfo, pod: PodRef, reason: str, message: str) -> None:
        try:
            await self.post(pod, reason, message)
        except Exception as e:  # the event is extra: its failure is only logged
            log.warning("%s: the %s event was not posted: %s", c.describe(), reason, e)
        else:
            log.info("%s: posted the %s event", c.describe(), reason)

    async def close(self) -> None:
        """Cancel the events still under way."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


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


@dataclass
class _SyncState:
    """One Synchronize's pods and containers, gathered request by request."""

    pods: dict[str, PodHead] = field(default_factory=dict)
    live: list[ContainerInfo] = field(default_factory=list)
    #: containers whose pod was not sent yet (kept as views: rare)
    waiting: list[ContainerView] = field(default_factory=list)
    pods_seen: int = 0
    containers_seen: int = 0

    def gather(self, pods: list[PodSandboxView], containers: list[ContainerView]) -> None:
        self.pods_seen += len(pods)
        self.containers_seen += len(containers)
        for p in pods:
            try:
                asking = may_ask(p)  # its containers are read in full
                self.pods[p.id] = PodHead(
                    p.name, p.namespace, p.uid, dict(p.annotations) if asking else {}, asking
                )
            except Exception:  # one odd pod must not stop the rest
                log.exception("a pod unreadable in Synchronize; its containers have no pod")
        for c in containers:
            self._container(c, last=False)

    def finish(self) -> list[ContainerInfo]:
        """The live containers, every request gathered."""
        for c in self.waiting:
            self._container(c, last=True)
        self.waiting = []
        return self.live

    def _container(self, c: ContainerView, last: bool) -> None:
        try:
            pod = self.pods.get(c.pod_sandbox_id)
            if pod is None and not last:
                self.waiting.append(c)
            elif (pod is not None and pod.asking) or may_ask(c):
                self.live.append(container_info(pod, c))
            else:  # the usual container: nothing of ours in it nor in its pod
                self.live.append(bare_info(pod, c))
        except Exception:  # one odd container must not stop the rest
            log.exception("a container unreadable in Synchronize; ignored")


class GpuShareHandler(Plugin):
    """NRI events -> share domain."""

    def __init__(
        self,
        service: ShareService,
        request_timeout: Callable[[], float] = lambda: 2.0,
        events: PodEvents | None = None,
    ) -> None:
        self.service = service
        #: Kubernetes events on refused pods; None: config kubernetes.events is off.
        self.events = events
        #: Seconds the runtime waits for an answer (the stub knows; 2 s is NRI's default).
        self.request_timeout = request_timeout
        #: Time spent in each handler, per event (the metrics' histogram).
        self.latency = HandlerLatency()
        self._sync = _SyncState()

    async def configure(
        self, config: str, runtime_name: str, runtime_version: str
    ) -> EventMask | None:
        self._sync = _SyncState()  # a new connection: what a broken one gathered goes
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
        sync, self._sync = self._sync, _SyncState()
        sync.gather(pods, containers)
        live = sync.finish()
        await self.service.synchronize(live)
        for entry in list(self.service.unserved.values()):
            self._deny(entry)
        log.info(
            "synchronized: %d pod(s), %d container(s), %d GPU allocation(s), %d unserved",
            sync.pods_seen,
            sync.containers_seen,
            len(self.service.allocations),
            len(self.service.unserved),
        )
        return []

    def _deny(self, entry: Unserved) -> None:
        """With unserved: deny, end an unserved container (once it has a process)."""
        if self.service.policy.unserved != "deny" or entry.settled:
            return
        info = entry.container
        outcome = kill_container(info.id, info.pid)
        entry.action = "denied: " + outcome
        entry.settled = outcome.startswith(("killed", "already gone"))
        log.warning("%s: unserved policy deny: %s", info.describe(), entry.action)

    @timed("create_container")
    async def create_container(
        self, pod: PodSandboxView, container: ContainerView
    ) -> Adjustment | None:
        loop = asyncio.get_running_loop()
        # Answer before the runtime gives up: a late answer is lost (containerd
        # creates the container without it), so its share must not stay booked.
        deadline = loop.time() + ANSWER_WITHIN * self.request_timeout()
        if not may_ask(container, pod) and not self.service.holds(container.id):
            return None  # nothing of ours in it: nothing decoded, nothing to do
        info = container_info(pod, container)
        try:
            async with asyncio.timeout_at(deadline):
                plan = await self.service.create_container(info)  # logs placed / refused
        except ShareRefused as exc:
            if exc.reason == "fragmentation" and self.events is not None:
                self.events.fragmented(info, str(exc))
            raise PluginError(str(exc)) from None
        except TimeoutError:
            raise PluginError(self._late(info)) from None
        if plan is not None and loop.time() > deadline:
            await self.service.release(container.id, "placed too late: the runtime gave up")
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
        entry = self.service.unserved.get(container.id)
        if entry is not None:  # created while the plugin was away: now it has a process
            entry.container = container_info(pod, container)
            self._deny(entry)

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
        if cid not in service.allocations and cid not in service.registered:
            # Nothing to bind or limit: nothing decoded (most containers).  One
            # that asks was created without the plugin: unserved (post-start
            # applies the node's policy once it has a process).
            if cid not in service.unserved and may_ask(container, pod):
                service.started_unserved(container_info(pod, container))
            return
        info = container_info(pod, container)
        try:
            await self.service.start_container(info)
        except ShareRefused as exc:
            self.service.decisions.refused_container(info, exc.reason, str(exc))
            raise PluginError(str(exc)) from None

    @timed("stop_container")
    async def stop_container(
        self, pod: PodSandboxView, container: ContainerView
    ) -> list[nri.ContainerUpdate]:
        if not self._hand_started(container.id):
            await self.service.release(container.id, "stopped (StopContainer)")
        return []

    @timed("remove_container")
    async def remove_container(self, pod: PodSandboxView, container: ContainerView) -> None:
        if not self._hand_started(container.id):
            await self.service.release(container.id, "removed (RemoveContainer)")

    @timed("stop_pod_sandbox")
    async def stop_pod_sandbox(self, pod: PodSandboxView) -> None:
        self.service.pod_stopped(pod.uid, f"{pod.namespace}/{pod.name}", pod.annotations)


def kmod_worker(config: Config) -> OffLoopKernelModule | None:
    """The real kernel-module client on its worker thread; None with kmod: off."""
    if config.kmod == "off":
        return None
    from nri_gpushare.kmod.procfs import ProcfsKernelModule

    return OffLoopKernelModule(ProcfsKernelModule(config.kmod_root))


def meminfo_reader(config: Config) -> ModuleMemInfo | None:
    """Memory in use from the module's meminfo, on its own worker; None with kmod: off."""
    if config.kmod == "off":
        return None
    from nri_gpushare.kmod.procfs import ProcfsKernelModule

    return ModuleMemInfo(
        ProcfsKernelModule(config.kmod_root), BlockingWorker("gpushare-meminfo", 0.5)
    )


def gputime_reader(config: Config) -> ModuleGpuTime | None:
    """GPU time charged by the module, on its own worker; None with kmod: off."""
    if config.kmod == "off":
        return None
    from nri_gpushare.kmod.procfs import ProcfsKernelModule

    return ModuleGpuTime(
        ProcfsKernelModule(config.kmod_root), BlockingWorker("gpushare-gputime", 0.5)
    )


async def sample_compute(service: ShareService, every: float = SAMPLE_EVERY) -> None:
    """Sample every registered container's GPU time, every `every` seconds,
    for status's compute used over the last minute (until cancelled); also
    lands the unregistrations and binds a module upgrade held up."""
    while True:
        try:
            await service.link.catch_up()
        except Exception:  # nor keep the sampling from running
            log.exception("landing what a module upgrade held up")
        try:
            await service.sample_compute()
        except Exception:  # one bad pass must not end the sampling
            log.exception("sampling GPU time")
        await asyncio.sleep(every)


def nvml_limits(config: Config) -> NvmlMemoryLimits | None:
    """The driver's memory limits (probed in build_service); None when off."""
    return NvmlMemoryLimits() if config.nvml_memory_limits == "auto" else None


async def build_service(
    config: Config,
    kmod: KernelModule | None,
    *,
    limits: NvmlMemoryLimits | None = None,
    usage: MemoryUsage | None = None,
    gputime: GpuTimeSource | None = None,
) -> ShareService:
    """The service for `config`, its kernel module looked for (`kmod`: None
    with kmod: off or no client), the driver's memory limits probed (`limits`:
    None when off), memory in use read through `usage`, GPU time through
    `gputime`.  ConfigError when it cannot serve."""
    # The config has already refused duplicate indexes, UUIDs and minors.
    if config.use_nvml:  # NVML can take seconds: not on the loop
        gpus = await asyncio.to_thread(load_inventory, config.inventory)
    else:
        gpus = list(config.inventory)
    if not gpus:
        raise ConfigError("no GPUs: NVML found none and the config has no `inventory:`")
    store = StateFile(config.state_dir)
    try:
        store.prepare()
    except StateDirError as e:
        raise ConfigError(str(e)) from None
    interposer = config.interposer
    if interposer.preload == "ld.so.preload":
        try:
            preload_file = write_preload_file(config.state_dir, preload_file_text(interposer))
        except OSError as e:
            raise ConfigError(
                f"state_dir {config.state_dir}: cannot write the ld.so.preload file "
                f"containers get: {e.strerror}"
            ) from None
        interposer = dataclasses.replace(interposer, preload_file=preload_file)
    if problem := library_problem(interposer.library):
        log.warning(
            "interposer %s %s: shares with isolation full|memory will be %s (interposer.missing)",
            interposer.library,
            problem,
            "refused" if interposer.missing == "refuse" else "created without it",
        )
    else:
        log.info(
            "interposer %s: given to shares with isolation full|memory at %s (%s)",
            interposer.library,
            interposer.container_path,
            interposer.preload,
        )
    if limits is not None:
        await asyncio.to_thread(limits.start, gpus)
    policy = NodePolicy(
        memory_reserve_bytes=config.memory_reserve_bytes,
        max_inst=config.max_inst,
        default_placement=config.placement,
        max_high_priority_per_gpu=config.max_high_priority_per_gpu,
        kmod_mode=config.kmod,
        pod_sources=config.pod_sources,
        standalone_sources=config.standalone_sources,
        unserved=config.unserved,
        interposer=interposer,
    )
    service = ShareService(
        gpus,
        policy,
        kmod,
        HostDevices(),
        store,
        library_check=library_problem,
        limits=limits,
        usage=usage,
        gputime=gputime,
    )
    await service.start()
    kmod_state = service.status()["kmod"]
    if config.kmod == "required" and not kmod_state["loaded"]:
        raise ConfigError(
            f"kmod: required, but the gpushare kernel module {kmod_state['problem']} "
            f"({config.kmod_root}): load gpushare.ko or set kmod: optional"
        )
    return service


class ContainerdLabels:
    """Containers' labels from containerd, over one connection opened when
    first needed (containerd may start after the daemon) and reopened after
    it broke."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._client: ContainerdClient | None = None

    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        if self._client is None:
            # Shorter than the hook's and the wrapper's wait for the daemon.
            client = ContainerdClient(self.socket_path, timeout=3.0)
            await client.__aenter__()
            self._client = client
        try:
            return await self._client.labels(namespace, container_id)
        except ContainerdUnavailable:
            self.close()
            raise

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ReconcileOwner:
    """The share service as the containerd reconciler's owner of local allocations."""

    def __init__(self, service: ShareService) -> None:
        self.service = service
        self._refused: set[tuple[str, str, int]] = set()  # warned once each

    def local_allocations(self) -> list[LocalRef]:
        return [
            r
            for r in self.service.local_allocations()
            if r.namespace  # a container containerd does not run cannot be checked there
        ]

    async def release_local(self, namespace: str, container_id: str, why: str) -> None:
        await self.service.release_local(namespace, container_id, why)

    async def adopt_local(self, namespace: str, container_id: str, pid: int) -> None:
        """Bind a recovered local share to the cgroup of the task containerd runs."""
        try:
            # /proc/PID/cgroup takes the kernel's cgroup lock: off the event loop.
            path = await asyncio.to_thread(cgroup_of, container_id, pid)
        except ValueError as e:
            if (namespace, container_id, pid) not in self._refused:
                if len(self._refused) >= 4096:  # bounded: at worst a warning again
                    self._refused.clear()
                self._refused.add((namespace, container_id, pid))
                log.warning(
                    "container %s/%s: its share cannot be bound to the task containerd runs: %s",
                    namespace,
                    container_id,
                    e,
                )
            return
        await self.service.adopt_local(namespace, container_id, pid, path)


@functools.cache
def plugin_version() -> str:
    """The installed package's version ("unknown" when run from a bare tree)."""
    try:
        return importlib.metadata.version("nri-gpushare")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _summary(samples: Iterable[float]) -> dict[str, float]:
    """Count, median and p99 of recent handler times, in milliseconds."""
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"count": len(ordered), "p50": pick(0.5), "p99": pick(0.99)}


async def run_daemon(
    config: Config, *, socket_path: str | None = None, prelaunched: bool = False
) -> int:
    kmod = kmod_worker(config)
    limits = nvml_limits(config)
    usage = meminfo_reader(config)
    gputime = gputime_reader(config)

    def close() -> None:
        for part in (kmod, limits, usage, gputime):
            if part is not None:
                part.close()

    try:
        service = await build_service(config, kmod, limits=limits, usage=usage, gputime=gputime)
        await service.recover_local()
    except BaseException:
        close()
        raise
    events = PodEvents() if config.kubernetes_events else None
    handler = GpuShareHandler(service, events=events)
    if prelaunched:
        stub = Stub.from_environment(
            handler,
            request_timeout=config.request_timeout,
            registration_timeout=config.registration_timeout,
        )
    else:
        stub = Stub(
            handler,
            name=config.plugin_name,
            index=config.plugin_index,
            socket_path=socket_path or config.socket,
            request_timeout=config.request_timeout,
            registration_timeout=config.registration_timeout,
        )

    handler.request_timeout = lambda: stub.request_timeout
    labels = ContainerdLabels(config.containerd_socket) if config.containerd_socket else None
    local_handler = LocalApiHandler(service, labels, config.containerd_socket)
    local_api = LocalApiServer(config.api_socket, local_handler, local_handler.undelivered)
    reconciler = (
        Reconciler(config.containerd_socket, ReconcileOwner(service))
        if config.containerd_socket
        else None
    )

    async def snapshot() -> dict[str, Any]:
        memory = await service.read_usage()
        nri_state = {
            "connected": stub.synchronized.is_set(),
            "sessions": stub.sessions,
            "last_error": stub.last_error,
            "handler_ms": {
                method: _summary(samples) for method, samples in stub.handler_seconds.items()
            },
        }
        containerd = (
            {"socket": config.containerd_socket, **reconciler.state()}
            if reconciler is not None
            else {"socket": "", "connected": False, "last_error": "containerd.socket is off"}
        )
        return {
            "version": plugin_version(),
            **service.status(memory),
            "nri": nri_state,
            "local_api": {"socket": config.api_socket, "requests": local_api.requests},
            "containerd": containerd,
        }

    async def metrics_snapshot() -> MetricsSnapshot:
        document = await snapshot()  # then, with nothing awaited, the counters
        decisions = service.decisions
        return MetricsSnapshot(
            document, dict(decisions.counts), dict(decisions.refusals), handler.latency.copy()
        )

    metrics = (
        MetricsServer(
            config.metrics_listen,
            SnapshotCollector(asyncio.get_running_loop(), metrics_snapshot),
        )
        if config.metrics_listen
        else None
    )
    status = StatusServer(config.status_socket, snapshot)
    started: list[StatusServer | LocalApiServer] = []
    try:
        for server in (status, local_api):
            await server.start()
            started.append(server)
        if metrics is not None:
            metrics.start()  # fails at start, naming metrics.listen
    except BaseException:
        for server in reversed(started):
            await server.close()
        close()
        raise
    following = (
        asyncio.create_task(reconciler.run(), name="containerd-reconciler")
        if reconciler is not None
        else None
    )
    sampling = asyncio.create_task(sample_compute(service), name="gputime-sampler")
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []  # keep the task referenced until it ends
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: stopping.append(loop.create_task(stub.stop())))
    log.info(
        "nri-gpushare: %d GPU(s), NRI socket %s, status socket %s, local API %s, containerd %s",
        len(service.gpus),
        stub.socket_path or "fd 3 (pre-launched by the runtime)",
        config.status_socket,
        config.api_socket,
        config.containerd_socket or "off",
    )
    try:
        await stub.run()
    except RuntimeConnectionLost as exc:
        # Launched by the runtime on fd 3: only a restart (by the runtime or
        # systemd) can connect again.
        log.error("nri-gpushare: the runtime connection is lost (%s); exiting", exc)
        return 1
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        if following is not None:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        if metrics is not None:
            await asyncio.to_thread(metrics.close)  # waits for a scrape in flight
        await local_api.close()
        await status.close()
        if events is not None:
            await events.close()
        if labels is not None:
            labels.close()
        close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("nri-gpushare: stopped")
    return 0
