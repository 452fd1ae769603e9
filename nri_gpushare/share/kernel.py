"""The kernel-module client interface: what the share domain needs from gpushare.ko.

`KernelModuleClient` is the blocking interface: the real one (procfs + ioctl,
`nri_gpushare.kmod.procfs`) and an in-memory fake used by unit tests
(`tests/fakes.py`) implement it.  `KernelModule` is the same requests, awaited:
the share domain uses only that one, and the daemon gives it a
`KernelModuleClient` run off the event loop (`nri_gpushare.host.kmod_worker`).

Both follow the module's rules: a double registration is `AlreadyRegistered`
(EEXIST), an unknown container is `NotRegistered` (ENOENT), over-commit is
`OverCommitted` (ENOSPC), a GPU the module was not told about is
`GpusNotDeclared` (ENXIO: the module was reloaded since the GPUs were declared),
a live memsize below what the container's processes hold is `MemoryHeld`
(EBUSY, with the bytes held).
The errno values stay here: callers catch the classes.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuDeclaration:
    """A physical GPU as the module knows it."""

    index: int
    memory_bytes: int


@dataclass(frozen=True)
class GpuQuota:
    """One container's share of one GPU."""

    gpu_index: int
    memory_bytes: int
    core_percent: int  # 0 = no compute limit requested
    high_priority: bool = False


@dataclass(frozen=True)
class Registration:
    container_id: str
    quotas: tuple[GpuQuota, ...]


class KmodError(Exception):
    """A request the module refused; `errno` is the module's answer."""

    errno: int = errno.EIO

    def __init__(self, message: str, err: int | None = None) -> None:
        super().__init__(message)
        if err is not None:
            self.errno = err


class ModuleNotLoaded(KmodError):
    errno = errno.ENODEV


class AlreadyRegistered(KmodError):
    errno = errno.EEXIST


class NotRegistered(KmodError):
    errno = errno.ENOENT


class OverCommitted(KmodError):
    errno = errno.ENOSPC


class GpusNotDeclared(KmodError):
    errno = errno.ENXIO


class MemoryHeld(KmodError):
    """A live memsize below what the container's processes hold on that GPU."""

    errno = errno.EBUSY

    def __init__(self, message: str, gpu_index: int, held_bytes: int) -> None:
        super().__init__(message)
        self.gpu_index = gpu_index
        self.held_bytes = held_bytes


class UpgradeInProgress(KmodError):
    """The module is frozen for an upgrade (`nri-gpushare kmod-upgrade`): it
    refuses every change (EBUSY) until the next version has taken its state."""

    errno = errno.EBUSY


class KernelModuleClient(Protocol):
    def loaded(self) -> bool:
        """True when the module is present and answering."""

    def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        """Tell the module which GPUs exist (idempotent)."""

    def register(self, registration: Registration) -> None:
        """Register a container on all its GPUs, all-or-nothing."""

    def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        """Bind a registration to the container's cgroup (v2 path, relative
        to the cgroup2 mount, or absolute)."""

    def unregister(self, container_id: str) -> None:
        """Remove a registration from every GPU; NotRegistered if unknown."""

    def registrations(self) -> list[Registration]:
        """Everything the module holds now."""

    def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        """Change a registered container's memsize, weight and highprio on
        one GPU, live; all or nothing on that GPU.  MemoryHeld below what
        its processes hold, OverCommitted when the GPU has no room."""

    def upgrading(self) -> bool:
        """Whether `nri-gpushare kmod-upgrade` has frozen the module."""


class KernelModule(Protocol):
    """`KernelModuleClient`'s requests, awaited; what the share domain talks to."""

    async def loaded(self) -> bool: ...

    async def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None: ...

    async def register(self, registration: Registration) -> None: ...

    async def bind_cgroup(self, container_id: str, cgroup_path: str) -> None: ...

    async def unregister(self, container_id: str) -> None: ...

    async def registrations(self) -> list[Registration]: ...

    async def update_quota(self, container_id: str, quota: GpuQuota) -> None: ...

    async def upgrading(self) -> bool: ...
