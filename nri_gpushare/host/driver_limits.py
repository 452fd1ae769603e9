"""Driver-native memory limits through NVML (nvidia-ml-py): the `MemoryLimits`
the daemon wires into the share domain (`nri_gpushare.share.limits`).

NVML 13.615 (R615 drivers) added

    nvmlDeviceSetMemoryLimits_v1(device, nvmlSetMemoryLimits_v1_t*)
        {nameSpace: char*, softLimit: u64, hardLimit: u64}
    nvmlDeviceGetMemoryLimits_v1(device, nvmlGetMemoryLimits_v1_t*)
        {nameSpace: char*, softLimit, hardLimit, currentUsed: u64}

where nameSpace is the full path of a cgroup v2 directory
(/sys/fs/cgroup/...): the limits are per cgroup and per GPU.  Setting needs
root; softLimit 0 and hardLimit NVML_DEVICE_MEMORY_LIMIT_MAX mean no limit;
removing the cgroup clears them.  MIG devices are refused (NOT_SUPPORTED).
nvidia-ml-py 13.615 has both functions and structures; an older one, or a
driver without the functions (FUNCTION_NOT_FOUND), means no driver limits.

Support is found once at start, per GPU: nvidia-ml-py has the functions,
NVML starts, the GPU (by UUID) is known to NVML, and reading the limits of
this daemon's own cgroup is answered (success, or NOT_FOUND: that cgroup has
none) rather than FUNCTION_NOT_FOUND, NOT_SUPPORTED or another error.  The
calls block, so they run on one worker thread under a timeout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.kmod.cgroup import cgroup2_mounts, cgroup_v2_path
from nri_gpushare.share.limits import LimitError
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

NEEDED = (
    "nvmlDeviceSetMemoryLimits_v1",
    "nvmlDeviceGetMemoryLimits_v1",
    "c_nvmlSetMemoryLimits_v1_t",
    "c_nvmlGetMemoryLimits_v1_t",
)
# NVML return codes (nvml.h)
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
FUNCTION_NOT_FOUND = 13
LIMIT_MAX = (1 << 64) - 1  # NVML_DEVICE_MEMORY_LIMIT_MAX


def _code(e: BaseException) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


def explain(e: BaseException) -> str:
    """An NVML error in words a person can act on."""
    code = _code(e)
    if code == FUNCTION_NOT_FOUND:
        return "the driver has no per-cgroup memory limits (R615 or later has them)"
    if code == NOT_SUPPORTED:
        return (
            "the driver does not support per-cgroup memory limits on this GPU (MIG mode, "
            "or memory partitioning turned off)"
        )
    if code == NO_PERMISSION:
        return "NVML refused: setting memory limits needs root"
    if code == NOT_FOUND:
        return (
            "the driver found no memory controller for this cgroup (with the dmem backend, "
            "its parent's cgroup.subtree_control needs +dmem)"
        )
    return f"NVML error: {e}"


class NvmlMemoryLimits:
    """`MemoryLimits` over pynvml; `nvml_module` replaces pynvml (tests use a
    fake), `cgroup_root` the cgroup v2 mount, `self_cgroup` the cgroup probed."""

    def __init__(
        self,
        nvml_module: ModuleType | Any | None = None,
        *,
        cgroup_root: str | None = None,
        self_cgroup: str | None = None,
        timeout: float = 0.5,
    ) -> None:
        self.gpus: dict[int, Gpu] = {}
        self._module = nvml_module
        self.nvml: Any = None
        self.cgroup_root = cgroup_root
        self.self_cgroup = self_cgroup
        self.timeout = timeout
        self.problems: dict[int, str] = {}
        self._handles: dict[int, Any] = {}
        self._initialised = False
        self.worker: BlockingWorker | None = None

    # -- start and stop (blocking: the daemon calls them off the loop) ----------------

    def start(self, gpus: Sequence[Gpu]) -> None:
        """Find which of `gpus` the driver can limit; logs the outcome."""
        self.gpus = {g.index: g for g in gpus}
        problem = self._probe_node()
        if problem:
            self.problems = dict.fromkeys(self.gpus, problem)
        else:
            self.problems = {i: self._probe_gpu(g) for i, g in self.gpus.items()}
            self.worker = BlockingWorker("nvml", self.timeout)
        usable = sorted(i for i, p in self.problems.items() if not p)
        if usable:
            log.info("driver memory limits (NVML) on GPU %s", ", ".join(map(str, usable)))
        for index, p in sorted(self.problems.items()):
            if p:
                log.info("no driver memory limit on GPU %d: %s", index, p)

    def _probe_node(self) -> str:
        try:
            self.nvml = self._module if self._module is not None else _import_pynvml()
        except ImportError:
            return "nvidia-ml-py is not installed"
        if missing := [name for name in NEEDED if not hasattr(self.nvml, name)]:
            version = getattr(self.nvml, "__version__", "installed")
            return f"nvidia-ml-py {version} has no {missing[0]} (13.615 or later has it)"
        if self.cgroup_root is None:
            mounts = cgroup2_mounts()
            if not mounts:
                return "no cgroup v2 file system is mounted (the driver limits cgroup v2 groups)"
            self.cgroup_root = "/sys/fs/cgroup" if "/sys/fs/cgroup" in mounts else mounts[-1]
        if self.self_cgroup is None:
            self.self_cgroup = _own_cgroup(self.cgroup_root)
        try:
            self.nvml.nvmlInit()
        except Exception as e:  # no library, no driver
            return f"NVML is not available ({e})"
        self._initialised = True
        return ""

    def _probe_gpu(self, gpu: Gpu) -> str:
        try:
            handle = self.nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        except Exception as e:
            return f"NVML does not know {gpu.uuid} ({e})"
        probe = self.nvml.c_nvmlGetMemoryLimits_v1_t()
        probe.nameSpace = str(self.self_cgroup).encode()
        try:
            self.nvml.nvmlDeviceGetMemoryLimits_v1(handle, probe)
        except Exception as e:
            if _code(e) != NOT_FOUND:  # NOT_FOUND: the function works, that group has none
                return explain(e)
        self._handles[gpu.index] = handle
        return ""

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except Exception as e:
                log.debug("nvmlShutdown: %s", e)

    # -- MemoryLimits -------------------------------------------------------------------

    def problem(self, gpu: int) -> str:
        return self.problems.get(gpu, "not a GPU of this node")

    def state(self) -> dict[str, Any]:
        return {"mode": "auto", "gpus": {str(i): p for i, p in sorted(self.problems.items())}}

    def cgroup_dir(self, cgroups_path: str) -> str:
        """The full path of the container's cgroup v2 directory (NVML's nameSpace)."""
        assert self.cgroup_root is not None
        try:
            relative = cgroup_v2_path(cgroups_path, [self.cgroup_root])
        except ValueError as e:
            raise LimitError(f"cannot find the container's cgroup ({e})") from None
        parts = relative.split("/")
        if any(p in (".", "..") for p in parts) or not any(parts):
            # The runtime names the path (kubelet's cgroup_parent, or any
            # containerd client): never the root, nor a way out of the tree.
            raise LimitError(f"refusing the container's cgroup path {cgroups_path!r}")
        path = self.cgroup_root.rstrip("/") + "/" + "/".join(p for p in parts if p)
        own = (self.self_cgroup or "").rstrip("/")
        if own and (own == path or own.startswith(path + "/")):
            raise LimitError(
                f"refusing the container's cgroup path {cgroups_path!r}: it is this daemon's "
                f"cgroup {own} or one of its parents"
            )
        return path

    async def set_limit(self, gpu: int, cgroups_path: str, hard_bytes: int) -> None:
        path = self.cgroup_dir(cgroups_path)

        def call() -> None:
            if not os.path.isdir(path):
                raise LimitError(f"cgroup {path} does not exist")
            limits = self.nvml.c_nvmlSetMemoryLimits_v1_t()
            limits.nameSpace = path.encode()
            limits.softLimit = 0
            limits.hardLimit = hard_bytes
            self.nvml.nvmlDeviceSetMemoryLimits_v1(self._handles[gpu], limits)

        await self._call(call, f"setting GPU {gpu}'s limit for {path}")

    async def clear_limit(self, gpu: int, cgroups_path: str) -> None:
        path = self.cgroup_dir(cgroups_path)

        def call() -> None:
            if not os.path.isdir(path):
                return  # the cgroup is gone, and its limits with it
            limits = self.nvml.c_nvmlSetMemoryLimits_v1_t()
            limits.nameSpace = path.encode()
            limits.softLimit = 0
            limits.hardLimit = LIMIT_MAX
            try:
                self.nvml.nvmlDeviceSetMemoryLimits_v1(self._handles[gpu], limits)
            except Exception as e:
                if _code(e) != NOT_FOUND:  # removed meanwhile
                    raise

        await self._call(call, f"clearing GPU {gpu}'s limit for {path}")

    async def _call(self, fn: Callable[[], None], what: str) -> None:
        if self.worker is None:
            raise LimitError("NVML memory limits are not in use")
        try:
            await self.worker.call(fn, what)
        except LimitError:
            raise
        except TimeoutError as e:
            raise LimitError(str(e)) from None
        except Exception as e:
            raise LimitError(explain(e)) from e


def _import_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def _own_cgroup(root: str, proc_self: str = "/proc/self/cgroup") -> str:
    """This process's cgroup v2 directory (the unified "0::" line)."""
    try:
        for line in Path(proc_self).read_text().splitlines():
            if line.startswith("0::"):
                return root.rstrip("/") + line[3:].rstrip("/")
    except OSError:
        pass
    return root
