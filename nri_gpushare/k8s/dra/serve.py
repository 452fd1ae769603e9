"""`nri-gpushare dra-driver` run: the kubelet plugin and the slice publisher
until SIGTERM or SIGINT (see `driver`)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nri_gpushare.config import Config
from nri_gpushare.k8s.dra.driver import COLLECT_EVERY, Daemon, DraDriver, SlicePublisher
from nri_gpushare.k8s.dra.kubeapi import KubeApi
from nri_gpushare.k8s.dra.kubelet import PLUGIN_DIR, REGISTRY_DIR, KubeletPlugin
from nri_gpushare.k8s.events import Settings
from nri_gpushare.k8s.health import GpuHealth
from nri_gpushare.k8s.plugin import read_status
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

CDI_DIR = "/var/run/cdi"


@dataclass(frozen=True)
class Places:
    """Where the driver serves and writes, and how often it looks for claims
    whose ResourceClaim is gone (`DraDriver.collect`)."""

    plugin_dir: str = PLUGIN_DIR
    registry_dir: str = REGISTRY_DIR
    cdi_dir: str = CDI_DIR
    collect_every: float = COLLECT_EVERY


class _Health:
    """The GPUs NVML says failed, refreshed by the publisher's loop (the
    kubelet's health stream reads the last answer: it never waits for NVML)."""

    def __init__(self, config: Config, indexes: list[int], nvml_module: Any) -> None:
        self.config = config
        self.indexes = indexes
        self.nvml_module = nvml_module
        self.nvml: GpuHealth | None = None
        self.bad: frozenset[int] = frozenset()

    def check(self) -> frozenset[int]:  # blocking: the publisher calls it in a thread
        if self.nvml is None:
            self.nvml = GpuHealth(self.config.use_nvml, self.nvml_module)
        self.bad = self.nvml.unhealthy(self.indexes)
        return self.bad

    def last(self) -> frozenset[int]:
        return self.bad


def driver_version(use_nvml: bool) -> str:
    """The NVIDIA driver's version from NVML, "" when it cannot say."""
    if not use_nvml:
        return ""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


async def serve(
    config: Config,
    gpus: Sequence[Gpu],
    node: str,
    settings: Settings,
    places: Places = Places(),
    nvml_module: Any = None,
) -> int:
    """Run the DRA driver until SIGTERM or SIGINT; 0 when stopped so."""
    health = _Health(config, [g.index for g in gpus], nvml_module)
    api = KubeApi(settings)
    daemon = Daemon(config.api_socket)
    driver = DraDriver(node, gpus, api, daemon, places.cdi_dir, health.last)
    publisher = SlicePublisher(
        node,
        gpus,
        api,
        lambda: read_status(config.status_socket),
        health.check,
        memory_reserve_bytes=config.memory_reserve_bytes,
        max_inst=config.max_inst,
        driver_version=await asyncio.to_thread(driver_version, config.use_nvml),
    )
    plugin = KubeletPlugin(driver, plugin_dir=places.plugin_dir, registry_dir=places.registry_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "nri-gpushare dra-driver: node %s, %d GPU(s), API server %s, daemon %s, kubelet "
        "plugin %s, CDI specs in %s",
        node,
        len(gpus),
        settings.server,
        config.api_socket,
        places.plugin_dir,
        places.cdi_dir,
    )
    try:
        await driver.forget_stale_specs()
        await asyncio.gather(
            publisher.run(stop), plugin.run(stop), driver.collect_loop(stop, places.collect_every)
        )
    finally:
        await plugin.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if health.nvml is not None:
            health.nvml.close()
    log.info("nri-gpushare dra-driver: stopped")
    return 0
