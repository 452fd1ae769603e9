"""GPU health for the device plugin, from NVML where it answers.

A GPU whose handle or memory information NVML cannot give (fallen off the
bus, a driver error) is unhealthy: its devices are listed unhealthy and the
kubelet stops admitting containers that would need it.  Without NVML (no
library, no driver, ``use_nvml: false``) nothing is known to be wrong, so
every GPU is healthy.  All calls block: run them off the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)


class GpuHealth:
    """`unhealthy(indexes)` -> the indexes NVML cannot answer for.

    `nvml_module` replaces `pynvml` (tests use a fake, as for
    `nri_gpushare.host.devices.load_inventory`)."""

    def __init__(self, use_nvml: bool, nvml_module: ModuleType | Any | None = None) -> None:
        self._nvml: Any = None
        if not use_nvml:
            return
        try:
            nvml = nvml_module if nvml_module is not None else _import_pynvml()
            nvml.nvmlInit()
        except Exception as e:  # no library, no driver: nothing to ask
            log.info("NVML unavailable (%s): every GPU is reported healthy", e)
            return
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as e:
            count, why = 0, str(e)
        else:
            why = "it reports no GPUs"
        if count == 0:
            # The GPUs are the config's static inventory then (as for the
            # daemon): NVML has nothing to say about them.
            log.info("NVML is not asked for health: %s", why)
            _shutdown(nvml)
            return
        self._nvml = nvml

    @property
    def active(self) -> bool:
        """Whether NVML is asked at all."""
        return self._nvml is not None

    def unhealthy(self, indexes: Iterable[int]) -> frozenset[int]:
        if self._nvml is None:
            return frozenset()
        bad = set()
        for index in indexes:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as e:
                log.debug("GPU %d does not answer NVML: %s", index, e)
                bad.add(index)
        return frozenset(bad)

    def close(self) -> None:
        if self._nvml is not None:
            _shutdown(self._nvml)
            self._nvml = None


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as e:
        log.debug("nvmlShutdown: %s", e)


def _import_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module
