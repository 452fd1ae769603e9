"""The host adapter: what the share domain needs to know about this machine,
looked up here so that the domain works on plain values.

- `load_inventory`: the node's GPUs from NVML (nvidia-ml-py) when it answers,
  else the static inventory of the config.  NVML is the truth when it is
  present and reports at least one GPU; any NVML failure (no library, no
  driver, an error while asking) falls back to the static list, with a log
  line saying so.
- `HostDevices`: the device nodes to give a container (a `DeviceLookup`).
- `kill_container`: the node's `unserved: deny` action.

NVIDIA's nodes: /dev/nvidiactl and /dev/nvidia<minor> have the fixed major 195
(nvidiactl is minor 255); where the host lacks them (no driver, test machines)
the configured values are used.  /dev/nvidia-uvm and /dev/nvidia-uvm-tools have
a dynamic major, so they are given only when the host has them, and so is the
kernel module's control device (/dev/gpushare).
"""

from __future__ import annotations

import logging
import os
import signal
import stat as statmod
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from nri_gpushare.share.model import DeviceNode, Gpu

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
_RACY_NS = 2_000_000_000
"""A directory changed this recently may change again within the same mtime tick."""


class HostDevices:
    """DeviceLookup on the host; `stat` and `dev_dir` are injectable for tests."""

    def __init__(
        self,
        dev_dir: str = "/dev",
        nvidia_major: int = NVIDIA_MAJOR,
        nvidiactl_minor: int = NVIDIACTL_MINOR,
        control_name: str = "gpushare",
        stat: Callable[[str], os.stat_result] = os.stat,
    ) -> None:
        self.dev_dir = dev_dir
        self.nvidia_major = nvidia_major
        self.nvidiactl_minor = nvidiactl_minor
        self.control_name = control_name
        self._stat = stat
        self._seen: tuple[int, int, int] | None = None
        self._nodes: dict[str, DeviceNode | None] = {}

    def find(self, name: str) -> DeviceNode | None:
        """The host's character device /dev/<name> (path as seen in containers)."""
        return self._find(name, self._stamp())

    def _find(self, name: str, stamp: tuple[int, int, int] | None) -> DeviceNode | None:
        if stamp is None:
            return self._lookup(name)
        if stamp != self._seen:
            self._nodes.clear()
            self._seen = stamp
        try:
            return self._nodes[name]
        except KeyError:
            node = self._nodes[name] = self._lookup(name)
            return node

    def _stamp(self) -> tuple[int, int, int] | None:
        """What identifies the device directory's entries: nodes are only looked
        up again when it changes (an entry added, removed or replaced changes its
        mtime).  None when it cannot be trusted: no such directory, or changed
        too recently (within the mtime's granularity), so look up each time."""
        try:
            st = self._stat(self.dev_dir)
            mtime = st.st_mtime_ns
            if time.time_ns() - mtime < _RACY_NS:
                return None
            return (st.st_dev, st.st_ino, mtime)
        except (OSError, AttributeError):
            return None

    def _lookup(self, name: str) -> DeviceNode | None:
        try:
            st = self._stat(os.path.join(self.dev_dir, name))
        except OSError:
            return None
        if not statmod.S_ISCHR(st.st_mode):
            return None
        return DeviceNode(f"/dev/{name}", "c", os.major(st.st_rdev), os.minor(st.st_rdev))

    def common(self) -> tuple[DeviceNode, ...]:
        stamp = self._stamp()
        ctl = self._find("nvidiactl", stamp) or DeviceNode(
            "/dev/nvidiactl", "c", self.nvidia_major, self.nvidiactl_minor
        )
        found = (self._find("nvidia-uvm", stamp), self._find("nvidia-uvm-tools", stamp))
        uvm = [d for d in found if d]
        return (ctl, *uvm)

    def gpu(self, minor: int) -> DeviceNode:
        name = f"nvidia{minor}"
        return self.find(name) or DeviceNode(f"/dev/{name}", "c", self.nvidia_major, minor)

    def control(self) -> DeviceNode | None:
        return self.find(self.control_name)


# -- GPUs -----------------------------------------------------------------------------


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

    module: ModuleType = pynvml
    return module


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


def kill_container(container_id: str, pid: int, proc: Path = Path("/proc")) -> str:
    """SIGKILL a container's first process, which ends the container (as the
    OOM killer would; its restart policy brings it back through the plugin).

    containerd 1.7 applies no device rules in an NRI update and NRI there has
    no eviction, so this is how `unserved: deny` takes a GPU away.  The process
    is held by a pidfd and checked to be in the container's cgroup before the
    signal, so a reused PID is never hit.  Returns what happened, for status.
    """
    if pid <= 0:
        return "not running: nothing to kill"
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "already gone"
    except OSError as e:
        return f"not killed: {e.strerror}"
    try:
        try:
            cgroups = (proc / str(pid) / "cgroup").read_text()
        except OSError:
            return "already gone"
        if container_id not in cgroups:
            return f"not killed: process {pid} is not in the container's cgroup"
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    except OSError as e:
        return f"not killed: {e.strerror}"
    finally:
        os.close(fd)
    return f"killed (process {pid})"
