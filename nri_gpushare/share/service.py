"""The share service: the container lifecycle the daemon drives.

create_container parses the request (nothing reserved), places it
(all-or-nothing), registers it with the kernel module (a refused registration
leaves nothing reserved) and answers with an injection plan.  release undoes
it and is idempotent.  synchronize rebuilds the table after a plugin restart
from the live containers' ``gpushare.io/assigned`` annotations and the
module's registry.

The parts live next door: `request` (what a container asks for), `placement`
(the per-GPU ledger), `kmod_link` (the kernel module), `assigned` (the
annotation), `plan` (what is injected), `report` (the status document).

The methods that may ask the kernel module are coroutines: the module is
reached through the awaited `KernelModule` interface, so other containers are
served while it answers.  A share is reserved in the ledger before the module
is asked, so nothing placed meanwhile can take its room; a refusal frees it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..kmod.client import KernelModule
from .assigned import assigned_annotation, recover
from .kmod_link import KernelLink
from .model import Allocation, ContainerInfo, Gpu, InjectionPlan, NodePolicy, ShareRefused
from .placement import Ledger
from .plan import DeviceLookup, injection_plan
from .report import status_document
from .request import ShareRequest, parse_request
from .units import GiB

log = logging.getLogger(__name__)

__all__ = ["ShareService", "assigned_annotation"]


class ShareService:
    def __init__(
        self,
        gpus: Sequence[Gpu],
        policy: NodePolicy,
        kmod: KernelModule | None,
        devices: DeviceLookup,
    ) -> None:
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_index = {g.index: g for g in self.gpus}
        self.policy = policy
        self.link = KernelLink(self.gpus, policy.kmod_mode, kmod)
        self.devices = devices
        self.ledger = Ledger(self.gpus, policy)
        self.allocations: dict[str, Allocation] = {}
        self._creating: set[str] = set()  # waiting for the module
        self._generation = 0  # bumped when synchronize replaces the table

    @property
    def registered(self) -> set[str]:
        """Container IDs registered with the kernel module."""
        return self.link.registered

    async def start(self) -> None:
        """Look for the kernel module (declares the GPUs when it is loaded)."""
        await self.link.start()

    # -- container lifecycle -------------------------------------------------------

    async def create_container(self, c: ContainerInfo) -> InjectionPlan | None:
        """The plan for a new container, or None when it asks for no share.

        Raises ShareRefused; a refusal leaves nothing reserved.
        """
        who = c.describe()
        if c.id in self._creating:
            raise ShareRefused(f"gpushare: {who} is already being created", "conflict")
        if c.id in self.allocations:  # asked again: same answer
            return self._plan(self.allocations[c.id])
        req = parse_request(c, self.gpus, self.policy)
        if req is None:
            return None
        shares = self.ledger.place(req, who)
        alloc = Allocation(c.id, c.name, c.pod, shares, req.priority, req.isolation)
        # Reserved before the module is asked: what is placed meanwhile sees it.
        self.ledger.add(alloc)
        self.allocations[c.id] = alloc
        generation = self._generation
        self._creating.add(c.id)
        try:
            registered = await self.link.register(alloc, who)
        except BaseException:
            # Refused, cancelled (the runtime went away) or a bug: nothing stays reserved.
            self._drop(alloc, generation)
            raise
        finally:
            self._creating.discard(c.id)
        if generation != self._generation or self.allocations.get(c.id) is not alloc:
            # Released, or the table was rebuilt, while the module answered.
            self._drop(alloc, generation)
            if registered:
                await self.link.release(c.id)
            raise ShareRefused(
                f"gpushare: cannot create {who}: it was released while the kernel module "
                f"registered it",
                "conflict",
            )
        self._check_memory_dev(req, alloc, c)
        log.info("%s: placed %s", who, alloc.describe_shares())
        return self._plan(alloc)

    async def start_container(self, c: ContainerInfo) -> None:
        """Bind the registration to the container's cgroup, which now exists.

        A failure is logged; with kmod: required it raises ShareRefused.
        """
        await self.link.bind(c)

    async def release(self, container_id: str) -> bool:
        """Unregister and free the container's shares (Stop and Remove); idempotent.

        True when this call freed an allocation.
        """
        alloc = self.allocations.pop(container_id, None)
        if alloc is not None:
            self.ledger.remove(alloc)
            log.info("container %s: released %s", container_id, alloc.describe_shares())
        await self.link.release(container_id)
        return alloc is not None

    async def synchronize(self, live: Sequence[ContainerInfo]) -> None:
        """Rebuild everything from the live containers and the module's registry.

        Allocations come from each container's gpushare.io/assigned annotation,
        else from the module's registration of it.  Registrations without a live
        container are removed; live shares the module lost are registered again.
        Live shares are recorded even when they no longer fit (a smaller reserve
        or inventory): they exist, so nothing new is placed on top of them.
        """
        module = await self.link.registrations()
        # From here to resync nothing is awaited: the table is replaced at once.
        self._generation += 1
        self.ledger = Ledger(self.gpus, self.policy)
        self.allocations = {}
        self.link.forget()
        for c in live:
            alloc = recover(c, (module or {}).get(c.id), self.gpus)
            if alloc is None:
                continue
            for note in self.ledger.add(alloc):
                log.warning("%s: recovered share: %s", c.describe(), note)
            self.allocations[c.id] = alloc
        recovered = dict(self.allocations)
        await self.link.resync(module, recovered, {c.id: c.cgroups_path for c in live})

    def status(self) -> dict[str, Any]:
        """A JSON-able picture of GPUs, allocations and the module."""
        return status_document(
            self.gpus,
            self.policy,
            self.ledger,
            self.allocations,
            self.link.registered,
            self.link.state(),
        )

    # -- helpers -----------------------------------------------------------------------

    def _drop(self, alloc: Allocation, generation: int) -> None:
        """Free a reservation that did not become an allocation."""
        if generation == self._generation and self.allocations.get(alloc.container_id) is alloc:
            del self.allocations[alloc.container_id]
            self.ledger.remove(alloc)

    def _plan(self, alloc: Allocation) -> InjectionPlan:
        registered = alloc.container_id in self.link.registered
        return injection_plan(alloc, self.by_index, self.devices, registered)

    def _check_memory_dev(self, req: ShareRequest, alloc: Allocation, c: ContainerInfo) -> None:
        if req.memory_dev_bytes is None:
            return
        for s in alloc.shares:
            total = self.by_index[s.index].memory_bytes
            if abs(total - req.memory_dev_bytes) >= GiB:
                log.warning(
                    "%s: ALIYUN_COM_GPU_MEM_DEV=%d GiB but GPU %d has %.1f GiB (informative only)",
                    c.describe(),
                    req.memory_dev_bytes // GiB,
                    s.index,
                    total / GiB,
                )
