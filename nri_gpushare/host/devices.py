"""The host adapter: what the share domain needs to know about this machine,
looked up here so that the domain works on plain values.

- `load_inventory`: the node's GPUs from NVML (nvidia-ml-py) when it answers,
  else the static inventory of the config.  NVML is the truth when it is
  present and reports at least one GPU; any NVML failure (no library, no
  driver, an error while asking) falls back to the static list, with a log
  line saying so.
- `HostDevices`: the device nodes to give a container (a `DeviceLookup`).
- `kill_container`: the node's `unserved: deny` action.
- `library_problem`, `write_preload_file`: the interposer's file on the node,
  and the one-line file mounted over a container's /etc/ld.so.preload.

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

from nri_gpushare.host.statefile import replace_file
from nri_gpushare.share.model import DeviceNode, Gpu
from nri_gpushare.units import quote

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
    if not container_id:
        return "not killed: no container ID to check the process against"
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "already gone"
    except OSError as e:
        return f"not killed: {e.strerror}"
    try:
        try:
            cgroups = (proc / str(pid) / "cgroup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return "already gone"
        except OSError as e:  # e.g. hidepid: not gone, only unreadable
            return f"not killed: process {pid} cannot be read ({e.strerror})"
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


def cgroup_of(container_id: str, pid: int, proc: Path = Path("/proc")) -> str:
    """The cgroup v2 path (as in /proc/PID/cgroup's "0::" line, e.g.
    "/default/ctr-1") of the container's first process `pid`, as containerd
    reported it.  ValueError saying why when there is none, or when the path
    is not the container's own cgroup: its last component must be the ID
    (cgroupfs) or "<prefix>-<ID>.scope" / "<ID>.scope" (systemd), and no
    component above it may name the ID (a process moved below its
    container's cgroup, into a child it made, is not the container)."""
    if pid <= 0:
        raise ValueError("no process")
    try:
        text = (proc / str(pid) / "cgroup").read_text(errors="replace")
    except OSError as e:
        raise ValueError(f"process {pid} cannot be read ({e.strerror})") from None
    paths = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    if len(paths) != 1 or not paths[0].startswith("/"):
        raise ValueError(f"process {pid} has no single cgroup v2 path")
    path = paths[0]
    *above, last = path.split("/")
    own = last in (container_id, f"{container_id}.scope") or last.endswith(f"-{container_id}.scope")
    if not own or any(container_id in part for part in above):
        raise ValueError(f"process {pid}'s cgroup {quote(path)} is not the container's")
    return path


# -- the interposer -------------------------------------------------------------------

PRELOAD_FILE_NAME = "ld.so.preload"


def library_problem(path: str) -> str:
    """Why the file at `path` cannot be the interposer every container user
    loads ("" when it can): a `LibraryCheck`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if not statmod.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size == 0:
        return "is empty"
    if not st.st_mode & 0o004:
        return (
            f"is not readable by every user (mode {statmod.S_IMODE(st.st_mode):04o}; a "
            f"container's non-root processes could not load it: chmod 0644 it)"
        )
    return ""


def write_preload_file(directory: str, text: str) -> str:
    """Write `text` to <directory>/ld.so.preload, mode 0644 (read inside
    containers by every user), unless it already holds exactly that; returns
    its path.  Atomic: a fresh file renamed over the old one, so a container
    being created meanwhile mounts the old file or the new one.  Raises
    OSError.  `directory` is the daemon's state directory (root's, 0700)."""
    path = os.path.join(directory, PRELOAD_FILE_NAME)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            fd = os.open(PRELOAD_FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                same = (
                    statmod.S_ISREG(st.st_mode)
                    and statmod.S_IMODE(st.st_mode) == 0o644
                    and st.st_uid == os.geteuid()
                    and os.read(fd, len(text) + 1) == text.encode()
                )
            finally:
                os.close(fd)
            if same:
                return path
        except OSError:
            pass  # absent, or not a plain file (a link): replaced below
        replace_file(dir_fd, PRELOAD_FILE_NAME, text.encode(), 0o644)
    finally:
        os.close(dir_fd)
    return path
