"""The node's GPUs: from NVML (nvidia-ml-py) when it answers, else the static
inventory of the config.

NVML is the truth when it is present and reports at least one GPU; any NVML
failure (no library, no driver, an error while asking) falls back to the static
list, with a log line saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .model import Gpu

log = logging.getLogger(__name__)


def load_inventory(static: Sequence[Gpu], nvml_module: ModuleType | Any | None = None) -> list[Gpu]:
    """GPUs by index; `nvml_module` replaces `pynvml` (tests use a fake)."""
    try:
        nvml = nvml_module if nvml_module is not None else _import_pynvml()
        gpus = _from_nvml(nvml)
    except Exception as e:  # any NVML trouble means: use the configuration
        log.info("NVML unavailable (%s); using the static inventory (%d GPUs)", e, len(static))
        return _checked(static)
    if not gpus:
        log.info("NVML reports no GPUs; using the static inventory (%d GPUs)", len(static))
        return _checked(static)
    if static:
        log.info("NVML found %d GPUs; the static inventory is not used", len(gpus))
    return gpus


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _from_nvml(nvml: Any) -> list[Gpu]:
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def _checked(static: Sequence[Gpu]) -> list[Gpu]:
    """The static list, sorted by index; duplicate indexes or UUIDs are config errors."""
    gpus = sorted(static, key=lambda g: g.index)
    for attr in ("index", "uuid", "minor"):
        values = [getattr(g, attr) for g in gpus]
        if len(set(values)) != len(values):
            raise ValueError(f"static GPU inventory: duplicate {attr} in {values}")
    for g in gpus:
        if g.memory_bytes <= 0:
            raise ValueError(f"static GPU inventory: GPU {g.index} has no memory")
    return gpus
