"""The kubelet device plugin (`nri-gpushare device-plugin`): one gRPC server
per resource on the kubelet's device-plugin directory, registered with the
kubelet, advertising what `capacity` says the node can still place.

- `nri_gpushare.k8s.state.PluginState`: the device lists, refreshed about
  once a second from the daemon's status document (`read_status`) and GPU
  health, plus the grants of ``Allocate`` calls whose containers the daemon
  does not show yet.
- `nri_gpushare.k8s.service.DevicePluginService`: the ``v1beta1.DevicePlugin``
  service of one resource.
- `nri_gpushare.k8s.registration.DevicePlugin`: the sockets and the
  registration.
- `serve`: all of it until SIGTERM/SIGINT, which removes our sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from nri_gpushare.config import Config
from nri_gpushare.k8s.health import GpuHealth
from nri_gpushare.k8s.registration import POLL, DevicePlugin
from nri_gpushare.k8s.state import PluginState
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 2.0
"""Seconds the daemon's whole status reply may take."""
STATUS_MAX_BYTES = 64 << 20
"""Largest status reply read."""


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
