"""The daemon: wiring and startup.

`build_service` makes the share service from the config (inventory, kernel
module, the interposer's files, the driver's memory limits (NVML), the
records); `run_daemon` wires it to the NRI stub (`nri_handler`), the local
API, the containerd reconciler (`adapters`: it releases hand-started shares
and tells the unserved list what containerd says of CRI's tasks), the status
socket and the metrics (`status`), and shuts down cleanly on SIGTERM/SIGINT.

The event loop never blocks on the kernel module: the service awaits it, and
the blocking procfs client runs on one worker thread under a timeout
(`nri_gpushare.host.kmod_worker`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal

from nri_gpushare.config import Config, ConfigError
from nri_gpushare.daemon.adapters import (
    ContainerdLabels,
    PodEvents,
    ReconcileOwner,
    UnservedObserver,
)
from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.daemon.local_server import LocalApiServer
from nri_gpushare.daemon.metrics import MetricsServer, SnapshotCollector
from nri_gpushare.daemon.metrics import Snapshot as MetricsSnapshot
from nri_gpushare.daemon.nri_handler import GpuShareHandler
from nri_gpushare.daemon.status import StatusDocument, StatusServer
from nri_gpushare.host.containerd.reconcile import Reconciler
from nri_gpushare.host.devices import (
    HostDevices,
    library_problem,
    load_inventory,
    write_preload_file,
)
from nri_gpushare.host.driver_limits import NvmlMemoryLimits
from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.host.meminfo import ModuleMemInfo
from nri_gpushare.host.statefile import ClaimFile, StateDirError, StateFile
from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.nri.stub import Stub
from nri_gpushare.nri.stub.runtime import RuntimeConnectionLost
from nri_gpushare.share.interposer import preload_file_text
from nri_gpushare.share.kernel import KernelModule
from nri_gpushare.share.model import NodePolicy
from nri_gpushare.share.service import ShareService
from nri_gpushare.share.usage import GpuTimeSource, MemoryUsage, ModuleGpuTime

log = logging.getLogger(__name__)

SAMPLE_EVERY = 5.0
"""Seconds between two readings of every registered container's GPU time."""


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
    lands the unregistrations and binds a module upgrade held up, and
    settles the resizes whose outcome the module left unknown."""
    while True:
        try:
            await service.link.catch_up()
            await service.resizer.settle()
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
        raise ConfigError(str(e)) from None  # its message says it all
    interposer = config.interposer
    if interposer.preload == "ld.so.preload":
        try:
            preload_file = write_preload_file(config.state_dir, preload_file_text(interposer))
        except OSError as e:
            raise ConfigError(
                f"state_dir {config.state_dir}: cannot write the ld.so.preload file "
                f"containers get: {e.strerror}"
            ) from e
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
        # The config has checked each against the model's values.
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
        claim_store=ClaimFile(store),
    )
    await service.start()
    kmod_state = service.status()["kmod"]
    if config.kmod == "required" and not kmod_state["loaded"]:
        raise ConfigError(
            f"kmod: required, but the gpushare kernel module {kmod_state['problem']} "
            f"({config.kmod_root}): load gpushare.ko or set kmod: optional"
        )
    return service


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
        await service.recovery.recover_local()
    except BaseException:
        close()
        raise
    events = PodEvents() if config.kubernetes_events else None
    reconciler = (
        Reconciler(
            config.containerd_socket,
            ReconcileOwner(service.local_shares),
            observer=UnservedObserver(service.unserved_watch),
        )
        if config.containerd_socket
        else None
    )
    handler = GpuShareHandler(service, events=events, follower=reconciler)
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

    snapshot = StatusDocument(
        service,
        stub,
        local_api,
        config.api_socket,
        config.containerd_socket,
        reconciler,
    )

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
