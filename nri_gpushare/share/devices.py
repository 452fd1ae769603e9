"""Device nodes to give a container, looked up on the host.

NVIDIA's nodes: /dev/nvidiactl and /dev/nvidia<minor> have the fixed major 195
(nvidiactl is minor 255); where the host lacks them (no driver, test machines)
the configured values are used.  /dev/nvidia-uvm and /dev/nvidia-uvm-tools have
a dynamic major, so they are given only when the host has them, and so is the
kernel module's control device (/dev/gpushare).
"""

from __future__ import annotations

import os
import stat as statmod
from collections.abc import Callable
from typing import Protocol

from .model import DeviceNode

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255


class DeviceLookup(Protocol):
    def common(self) -> tuple[DeviceNode, ...]:
        """Nodes every GPU container needs: nvidiactl, and uvm ones when present."""

    def gpu(self, minor: int) -> DeviceNode:
        """/dev/nvidia<minor>, from the host or the configured fallback."""

    def control(self) -> DeviceNode | None:
        """The kernel module's control device, when present."""


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

    def find(self, name: str) -> DeviceNode | None:
        """The host's character device /dev/<name> (path as seen in containers)."""
        try:
            st = self._stat(os.path.join(self.dev_dir, name))
        except OSError:
            return None
        if not statmod.S_ISCHR(st.st_mode):
            return None
        return DeviceNode(f"/dev/{name}", "c", os.major(st.st_rdev), os.minor(st.st_rdev))

    def common(self) -> tuple[DeviceNode, ...]:
        ctl = self.find("nvidiactl") or DeviceNode(
            "/dev/nvidiactl", "c", self.nvidia_major, self.nvidiactl_minor
        )
        uvm = [d for d in (self.find("nvidia-uvm"), self.find("nvidia-uvm-tools")) if d]
        return (ctl, *uvm)

    def gpu(self, minor: int) -> DeviceNode:
        name = f"nvidia{minor}"
        return self.find(name) or DeviceNode(f"/dev/{name}", "c", self.nvidia_major, minor)

    def control(self) -> DeviceNode | None:
        return self.find(self.control_name)
