"""In-memory fakes for unit tests.

FakeKernelModule implements nri_gpushare.share.kernel.KernelModuleClient with
the module's rules: EEXIST on a double registration, ENOENT for an unknown
container, ENODEV when not loaded, and it refuses over-commit on its own (per
GPU: memory sum <= the declared memory, compute percent sum <= 100, at most
max_inst containers), all-or-nothing over a registration's GPUs.  A live
quota change (`update_quota`) follows the module's files: EBUSY
(`MemoryHeld`) for a memsize below what `held` says the container's
processes hold, ENOSPC without room.

`Inline` gives a blocking client the awaited `KernelModule` interface the
share domain uses, answering at once on the caller's thread; `done` runs a
coroutine that never waits (the service over `Inline`) without a loop.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from nri_gpushare.share.kernel import (
    AlreadyRegistered,
    GpuDeclaration,
    GpuQuota,
    GpusNotDeclared,
    KernelModuleClient,
    KmodError,
    MemoryHeld,
    ModuleNotLoaded,
    NotRegistered,
    OverCommitted,
    Registration,
)
from nri_gpushare.share.model import DeviceNode, Gpu


class FakeKernelModule:
    def __init__(self, loaded: bool = True, max_inst: int = 16) -> None:
        self.is_loaded = loaded
        self.max_inst = max_inst
        self.gpus: dict[int, int] = {}  # index -> memory bytes
        self.regs: dict[str, Registration] = {}
        self.frozen = False  # kmod-upgrade's freeze
        self.cgroups: dict[str, str] = {}
        self.fail_next: dict[str, KmodError] = {}  # method name -> error to raise once
        self.calls: list[tuple[str, object]] = []
        self.held: dict[tuple[str, int], int] = {}  # (container, GPU) -> bytes its processes hold

    def _enter(self, method: str, arg: object = None) -> None:
        self.calls.append((method, arg))
        if (error := self.fail_next.pop(method, None)) is not None:
            raise error
        if not self.is_loaded:
            raise ModuleNotLoaded("gpushare: module not loaded")

    # -- KernelModuleClient ---------------------------------------------------------

    def loaded(self) -> bool:
        return self.is_loaded

    def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        self._enter("declare_gpus", tuple(gpus))
        for g in gpus:
            self.gpus[g.index] = g.memory_bytes

    def register(self, registration: Registration) -> None:
        self._enter("register", registration)
        cid = registration.container_id
        if cid in self.regs:
            raise AlreadyRegistered(f"{cid}: already registered")
        for q in registration.quotas:
            if q.gpu_index not in self.gpus:
                raise GpusNotDeclared(f"GPU {q.gpu_index} not declared")
            if not 0 <= q.core_percent <= 100 or q.memory_bytes <= 0:
                raise KmodError(f"bad quota {q}", errno.EINVAL)
            memory, core, count = self.usage(q.gpu_index)
            if memory + q.memory_bytes > self.gpus[q.gpu_index]:
                raise OverCommitted(f"GPU {q.gpu_index}: memory over-committed")
            if core + q.core_percent > 100:
                raise OverCommitted(f"GPU {q.gpu_index}: compute over-committed")
            if count + 1 > self.max_inst:
                raise OverCommitted(f"GPU {q.gpu_index}: more than {self.max_inst} containers")
        if len({q.gpu_index for q in registration.quotas}) != len(registration.quotas):
            raise KmodError(f"{cid}: a GPU appears twice", errno.EINVAL)
        self.regs[cid] = registration

    def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        self._enter("bind_cgroup", (container_id, cgroup_path))
        if container_id not in self.regs:
            raise NotRegistered(f"{container_id}: not registered")
        self.cgroups[container_id] = cgroup_path

    def unregister(self, container_id: str) -> None:
        self._enter("unregister", container_id)
        if container_id not in self.regs:
            raise NotRegistered(f"{container_id}: not registered")
        del self.regs[container_id]
        self.cgroups.pop(container_id, None)

    def registrations(self) -> list[Registration]:
        self._enter("registrations")
        return list(self.regs.values())

    def upgrading(self) -> bool:
        return self.frozen

    def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        self._enter("update_quota", (container_id, quota))
        reg = self.regs.get(container_id)
        gpu = quota.gpu_index
        old = next((q for q in reg.quotas if q.gpu_index == gpu), None) if reg else None
        if reg is None or old is None:
            raise NotRegistered(f"{container_id}: not registered on GPU {gpu}")
        if not 0 <= quota.core_percent <= 100 or quota.memory_bytes <= 0:
            raise KmodError(f"bad quota {quota}", errno.EINVAL)
        held = self.held.get((container_id, gpu), 0)
        if quota.memory_bytes < held:
            raise MemoryHeld(f"{container_id}: holds {held} bytes on GPU {gpu}", gpu, held)
        memory, core, _ = self.usage(gpu)
        if memory - old.memory_bytes + quota.memory_bytes > self.gpus[gpu]:
            raise OverCommitted(f"GPU {gpu}: memory over-committed")
        if core - old.core_percent + quota.core_percent > 100:
            raise OverCommitted(f"GPU {gpu}: compute over-committed")
        quotas = tuple(quota if q.gpu_index == gpu else q for q in reg.quotas)
        self.regs[container_id] = Registration(container_id, quotas)

    # -- test helpers -----------------------------------------------------------------

    def usage(self, index: int) -> tuple[int, int, int]:
        """(memory bytes, compute percent, containers) registered on GPU `index`."""
        quotas = [q for r in self.regs.values() for q in r.quotas if q.gpu_index == index]
        return (
            sum(q.memory_bytes for q in quotas),
            sum(q.core_percent for q in quotas),
            len(quotas),
        )

    def unload(self) -> None:
        """Like rmmod: every registration and declaration is gone."""
        self.is_loaded = False
        self.gpus.clear()
        self.regs.clear()
        self.cgroups.clear()

    def load(self) -> None:
        self.is_loaded = True


class Inline:
    """KernelModule over a blocking client, answered on the caller's thread."""

    def __init__(self, client: KernelModuleClient) -> None:
        self.client = client

    async def loaded(self) -> bool:
        return self.client.loaded()

    async def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        self.client.declare_gpus(gpus)

    async def register(self, registration: Registration) -> None:
        self.client.register(registration)

    async def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        self.client.bind_cgroup(container_id, cgroup_path)

    async def unregister(self, container_id: str) -> None:
        self.client.unregister(container_id)

    async def registrations(self) -> list[Registration]:
        return self.client.registrations()

    async def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        self.client.update_quota(container_id, quota)

    async def upgrading(self) -> bool:
        return self.client.upgrading()


class Gated(Inline):
    """Inline, but each update_quota waits for `gate` first (a slow module
    worker: what happens while a resize waits for the module)."""

    def __init__(self, client: KernelModuleClient) -> None:
        super().__init__(client)
        self.gate = asyncio.Event()

    async def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        await self.gate.wait()
        await super().update_quota(container_id, quota)


T = TypeVar("T")


def done(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that completes without waiting."""
    try:
        coro.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    coro.close()
    raise AssertionError("the coroutine waited for something")


# -- share-domain helpers ---------------------------------------------------------------

GiB = 1 << 30
MiB = 1 << 20


def make_gpus(count: int = 4, memory_bytes: int = 32 * GiB) -> list[Gpu]:
    """`count` identical GPUs with UUIDs GPU-<index>-..., minor = index."""
    return [
        Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", "Fake GPU", memory_bytes, i)
        for i in range(count)
    ]


class FakeDevices:
    """A DeviceLookup without a host: nvidiactl 195:255, GPU nodes 195:<minor>;
    the uvm nodes and the control device only when `uvm` / `control` are set."""

    def __init__(self, uvm: bool = False, control: bool = True) -> None:
        self.uvm = uvm
        self.has_control = control

    def common(self) -> tuple[DeviceNode, ...]:
        nodes = [DeviceNode("/dev/nvidiactl", "c", 195, 255)]
        if self.uvm:
            nodes += [
                DeviceNode("/dev/nvidia-uvm", "c", 510, 0),
                DeviceNode("/dev/nvidia-uvm-tools", "c", 510, 1),
            ]
        return tuple(nodes)

    def gpu(self, minor: int) -> DeviceNode:
        return DeviceNode(f"/dev/nvidia{minor}", "c", 195, minor)

    def control(self) -> DeviceNode | None:
        return DeviceNode("/dev/gpushare", "c", 240, 0) if self.has_control else None
