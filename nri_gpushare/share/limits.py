"""Driver-native memory limits: the share domain's side.

NVIDIA drivers from R615 on can cap the device memory of a cgroup on one GPU
(NVML `nvmlDeviceSetMemoryLimits_v1`; the "namespace" it takes is the full
path of a cgroup v2 directory).  A container's cgroup holds all of its
processes, so the limit is per container and per GPU, as a share is: the
bytes of all of the container's processes on that GPU together.  It is
enforced by the driver (or the kernel's dmem controller) at allocation time,
whatever the process does, so it also binds programs the interposer never
sees (static binaries, direct ioctls).  It counts all device memory the
cgroup's processes use, CUDA contexts included, so a program gets somewhat
less than its quota under it.

What the link does: at StartContainer (the cgroup exists from then on, and
no program of the container has run yet) it sets the hard limit of each of
the container's GPUs that supports it to the share's memory (soft limit 0:
nothing is reserved, so the driver has no ancestor reservation to undo
later); at Stop/Remove it clears them (removing the cgroup clears them too);
at Synchronize it sets them again for the live shares and clears them for
live containers that no longer hold one.  A failure is logged and shown in
status: the other guards still apply.  Isolation none gets no limit.

The domain never imports NVML: the daemon wires in `MemoryLimits`
(`nri_gpushare.host.driver_limits`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nri_gpushare.share.model import Allocation, ContainerInfo

log = logging.getLogger(__name__)


class LimitError(Exception):
    """The driver did not set or clear a limit; str() says why."""


class MemoryLimits(Protocol):
    def problem(self, gpu: int) -> str:
        """Why GPU `gpu`'s memory cannot be limited per cgroup ("" when it can)."""

    def state(self) -> dict[str, Any]:
        """For status: {"mode", "gpus": {index: problem or ""}}."""

    async def set_limit(self, gpu: int, cgroups_path: str, hard_bytes: int) -> None:
        """Cap the cgroup the runtime calls `cgroups_path` on GPU `gpu`; LimitError."""

    async def clear_limit(self, gpu: int, cgroups_path: str) -> None:
        """Lift the cap (a cgroup already gone has none); LimitError."""


@dataclass(frozen=True)
class Applied:
    cgroups_path: str
    gpus: tuple[int, ...]  # GPU indexes limited


class LimitLink:
    def __init__(self, limits: MemoryLimits | None) -> None:
        self.limits = limits
        self.applied: dict[str, Applied] = {}  # container ID -> what was set
        self.notes: dict[str, str] = {}  # container ID -> why (some) limits are not set

    def state(self) -> dict[str, Any]:
        if self.limits is None:
            return {"mode": "off", "gpus": {}}
        return self.limits.state()

    def limited(self, container_id: str) -> tuple[int, ...]:
        """The GPUs the driver limits for this container."""
        applied = self.applied.get(container_id)
        return applied.gpus if applied else ()

    def why_not(self, alloc: Allocation) -> str:
        """Why some or all of `alloc`'s GPUs have no driver limit ("" when all do)."""
        if self.limits is None:
            return "nvml_memory_limits: off"
        if note := self.notes.get(alloc.container_id):
            return note
        if alloc.container_id not in self.applied:
            return "set when the container starts"
        return ""

    async def apply(self, alloc: Allocation, cgroups_path: str, who: str) -> None:
        """Set the container's limits (its cgroup exists); failures are logged."""
        if self.limits is None or alloc.isolation == "none":
            return
        if not cgroups_path:
            self.notes[alloc.container_id] = "the runtime gave no cgroup path"
            log.warning("%s: no cgroup path: no driver memory limit", who)
            return
        done: list[int] = []
        problems: list[str] = []
        for s in alloc.shares:
            if problem := self.limits.problem(s.index):
                problems.append(f"GPU {s.index}: {problem}")
                continue
            try:
                await self.limits.set_limit(s.index, cgroups_path, s.memory_bytes)
            except LimitError as e:
                problems.append(f"GPU {s.index}: {e}")
                log.warning("%s: driver memory limit on GPU %d not set: %s", who, s.index, e)
                continue
            done.append(s.index)
        self.applied[alloc.container_id] = Applied(cgroups_path, tuple(done))
        if problems:
            self.notes[alloc.container_id] = "; ".join(problems)
        else:
            self.notes.pop(alloc.container_id, None)
        if done:
            log.info("%s: driver memory limit set on GPU %s", who, ", ".join(map(str, done)))

    async def clear(self, container_id: str) -> None:
        """Lift what `apply` set for this container (idempotent; failures logged)."""
        self.notes.pop(container_id, None)
        applied = self.applied.pop(container_id, None)
        if applied is not None:
            await self._clear(container_id, applied.cgroups_path, applied.gpus)

    async def _clear(self, container_id: str, cgroups_path: str, gpus: Sequence[int]) -> None:
        if self.limits is None:
            return
        for gpu in gpus:
            try:
                await self.limits.clear_limit(gpu, cgroups_path)
            except LimitError as e:
                log.warning(
                    "container %s: driver memory limit on GPU %d not cleared (%s); removing "
                    "its cgroup clears it",
                    container_id,
                    gpu,
                    e,
                )

    def forget(self) -> None:
        self.applied = {}
        self.notes = {}

    async def resync(
        self,
        allocations: Mapping[str, Allocation],
        live: Mapping[str, ContainerInfo],
        dropped: Mapping[str, Allocation],
    ) -> None:
        """After `forget`: set the limits of live, running shares again (a
        created container gets them at its start), and clear them on live
        containers whose recorded share was dropped (`dropped`)."""
        if self.limits is None:
            return
        for cid, alloc in allocations.items():
            c = live.get(cid)
            if c is not None and c.running and c.pid:
                await self.apply(alloc, c.cgroups_path, c.describe())
        for cid, alloc in dropped.items():
            c = live.get(cid)
            if c is not None and c.running and c.cgroups_path and alloc.isolation != "none":
                usable = [s.index for s in alloc.shares if not self.limits.problem(s.index)]
                await self._clear(cid, c.cgroups_path, usable)
