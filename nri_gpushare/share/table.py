"""The node's share table: what every part of the share service reads and
changes (GPUs, the ledger, the allocations and their records, the kernel
module, the driver's limits, the unserved containers).

The parts that act on it live next door: `lifecycle` (create, start, release),
`resize` (a running container's share changed), `local_shares` (containers
NRI never sees), `unserved`, `recovery`
(synchronize, a daemon restart) and `service` (the parts assembled, and the
status they show).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nri_gpushare.share import records
from nri_gpushare.share.claims import Claims, ClaimStore
from nri_gpushare.share.decisions import DecisionLog
from nri_gpushare.share.kernel import KernelModule
from nri_gpushare.share.kmod_link import KernelLink
from nri_gpushare.share.limits import LimitLink, MemoryLimits
from nri_gpushare.share.model import Allocation, Gpu, NodePolicy
from nri_gpushare.share.placement import Ledger

if TYPE_CHECKING:
    from nri_gpushare.share.unserved import Unserved


@dataclass
class LocalState:
    """What the service knows of a container asked for outside NRI (not recorded)."""

    pid: int = 0  # its first process; 0 until started (or after a daemon restart)
    since: float = 0.0  # time.time() when placed; 0 for one recovered after a restart
    cgroups_path: str = ""


class ShareTable:
    def __init__(
        self,
        gpus: Sequence[Gpu],
        policy: NodePolicy,
        kmod: KernelModule | None,
        store: records.AllocationStore | None,
        limits: MemoryLimits | None,
        decisions: DecisionLog | None,
        claim_store: ClaimStore | None = None,
    ) -> None:
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_index = {g.index: g for g in self.gpus}
        self.policy = policy
        self.link = KernelLink(self.gpus, policy.kmod_mode, kmod)
        self.limits = LimitLink(limits)
        self.ledger = Ledger(self.gpus, policy)
        self.decisions = decisions or DecisionLog()
        self.allocations: dict[str, Allocation] = {}
        self.journal = records.Journal(
            store or records.MemoryStore(), lambda: self.allocations.values()
        )
        self.unserved: dict[str, Unserved] = {}
        self.local: dict[str, LocalState] = {}  # container ID -> state, local allocations
        self.pod_containers: dict[str, set[str]] = {}  # pod UID -> container names seen
        self.creating: set[str] = set()  # waiting for the module
        self.resizing: set[str] = set()  # a resize whose module writes are in flight
        # While a resize waits for the module, the ledger books the larger of
        # the old and new share: container ID -> (generation, that booking).
        self.booked: dict[str, tuple[int, Allocation]] = {}
        self.generation = 0  # bumped when synchronize replaces the table
        # Records a Synchronize dropped (no live container of that ID): a
        # container placed just before it is listed only later; see
        # `Lifecycle.readopt`.  Oldest first, at most recovery.FORGOTTEN_KEPT.
        self.forgotten: dict[str, Allocation] = {}
        # Prepared DRA claims, booked in the ledger while no container holds them.
        self.claims = Claims(self.gpus, lambda: self.ledger, lambda: self.allocations, claim_store)

    @property
    def store(self) -> records.AllocationStore:
        """Where the records are kept."""
        return self.journal.store

    @property
    def registered(self) -> set[str]:
        """Container IDs registered with the kernel module."""
        return self.link.registered

    def unbook(self, alloc: Allocation) -> None:
        """Take `alloc`'s container out of the ledger: what a resize booked
        for it, if any (of this generation of the table), else `alloc`."""
        generation, booked = self.booked.pop(alloc.container_id, (self.generation, alloc))
        self.ledger.remove(booked if generation == self.generation else alloc)

    def holds(self, container_id: str) -> bool:
        """Whether the ID holds a share or is being placed."""
        return container_id in self.allocations or container_id in self.creating
