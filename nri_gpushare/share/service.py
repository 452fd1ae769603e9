"""The share service: a node's share table and the parts that act on it,
assembled, and what the whole node shows (status, memory in use, GPU time).

Callers use the part that owns their concern:

- `lifecycle`: create (the one path every share is made by), start, release,
  a pod's stop (`nri_gpushare.share.lifecycle`);
- `local_shares`: containers NRI never sees (`local_shares`);
- `resizer`: a running container's share changed live (`resize`);
- `recovery`: Synchronize and a daemon restart (`recovery`);
- `unserved_watch`: containers that asked for a share and run without one
  (`unserved`);
- the service itself: `status`, `read_usage`, `sample_compute`, which read
  every part.

The parts' own modules say more: `request` (what a container asks for),
`placement` (the per-GPU ledger), `kmod_link` (the kernel module), `records`
(the daemon's record), `plan` (what is injected), `interposer`
(libgpushare.so: who gets it), `limits` (the driver's per-cgroup memory
limits), `usage` (memory in use, GPU time), `report` (the status document).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nri_gpushare.share import records
from nri_gpushare.share.claims import ClaimStore
from nri_gpushare.share.decisions import DecisionLog
from nri_gpushare.share.interposer import LibraryCheck
from nri_gpushare.share.kernel import KernelModule
from nri_gpushare.share.lifecycle import Lifecycle
from nri_gpushare.share.limits import MemoryLimits
from nri_gpushare.share.local_shares import LocalShares
from nri_gpushare.share.model import Allocation, Gpu, NodePolicy
from nri_gpushare.share.plan import DeviceLookup
from nri_gpushare.share.recovery import Recovery
from nri_gpushare.share.report import status_document
from nri_gpushare.share.resize import Resizer
from nri_gpushare.share.table import ShareTable
from nri_gpushare.share.unserved import UnservedWatch
from nri_gpushare.share.usage import (
    ComputeMeter,
    ComputeUse,
    GpuTimeRead,
    GpuTimeSource,
    MemoryUsage,
    MemoryUse,
)

log = logging.getLogger(__name__)

__all__ = ["ShareService"]


class ShareService(ShareTable):
    def __init__(
        self,
        gpus: Sequence[Gpu],
        policy: NodePolicy,
        kmod: KernelModule | None,
        devices: DeviceLookup,
        store: records.AllocationStore | None = None,
        *,
        library_check: LibraryCheck | None = None,
        limits: MemoryLimits | None = None,
        usage: MemoryUsage | None = None,
        gputime: GpuTimeSource | None = None,
        decisions: DecisionLog | None = None,
        claim_store: ClaimStore | None = None,
    ) -> None:
        """`library_check`: whether the interposer's file is on the node (None:
        taken as present); `limits`: the driver's memory limits (None: off);
        `usage`: memory in use from the kernel module (None: unknown);
        `gputime`: GPU time charged by the module, sampled by `sample_compute`
        (None: unknown); `decisions`: where placed, refused and released are
        logged and counted."""
        super().__init__(gpus, policy, kmod, store, limits, decisions, claim_store)
        self.library_check = library_check
        self.usage = usage
        self.gputime = gputime
        self.compute = ComputeMeter()
        self.lifecycle = Lifecycle(self, devices, library_check)
        self.local_shares = LocalShares(self, self.lifecycle)
        self.resizer = Resizer(self)
        self.unserved_watch = UnservedWatch(self)
        self.recovery = Recovery(self, self.unserved_watch, self.local_shares)

    async def start(self) -> None:
        """Look for the kernel module (declares the GPUs when it is loaded) and
        book the DRA claims prepared before a restart."""
        await self.link.start()
        self.claims.load()

    # -- what the node shows ------------------------------------------------------------

    def status(self, usage: Mapping[tuple[int, str], MemoryUse] | None = None) -> dict[str, Any]:
        """A JSON-able picture of GPUs, allocations, the module and what guards
        each share's memory; `usage` from `read_usage` (None: not read)."""
        document = status_document(
            self.gpus,
            self.policy,
            self.ledger,
            self.allocations,
            self.link.registered,
            self.link.state(),
            self.limits,
            usage or {},
            self._compute_use(),
            self.compute.gpus,
        )
        if (interposer := self.policy.interposer) is not None:
            check = self.library_check
            document["interposer"]["problem"] = check(interposer.library) if check else ""
        document["unserved"] = [u.json() for u in self.unserved.values()]
        document["claims"] = self.claims.status()
        return document

    async def read_usage(self) -> dict[tuple[int, str], MemoryUse]:
        """Memory in use per (GPU index, container ID), from the kernel module;
        unknown (with why) where it cannot say."""
        out: dict[tuple[int, str], MemoryUse] = {}
        wanted = []
        for cid, alloc in self.allocations.items():
            for s in alloc.shares:
                if self.link.mode == "off":
                    why = "unknown: kmod: off"
                elif alloc.isolation == "none":
                    why = "unknown: isolation none is not registered with the module"
                elif cid not in self.link.registered:
                    problem = self.link.problem or "did not register it"
                    why = f"unknown: not registered (the kernel module {problem})"
                elif self.usage is None:
                    why = "unknown: no meminfo reader"
                else:
                    wanted.append((s.index, cid, s.memory_bytes))
                    continue
                out[s.index, cid] = MemoryUse(None, why=why)
        if wanted and self.usage is not None:
            try:
                out.update(await self.usage.usage(wanted))
            except Exception as e:  # status must always answer
                log.exception("reading memory in use")
                for gpu, cid, _ in wanted:
                    out[gpu, cid] = MemoryUse(None, why=f"unknown: {type(e).__name__}")
        return out

    async def sample_compute(self, now: float | None = None) -> None:
        """Read the GPU time the module charged each registered container and
        add it to the compute windows status shows (`now`: time.monotonic()).
        Never raises for what it reads."""
        if now is None:
            now = time.monotonic()
        owners = {
            (s.index, cid): alloc
            for cid, alloc in self.allocations.items()
            if self._unmeasured(alloc) is None
            for s in alloc.shares
        }
        read = GpuTimeRead({})
        if owners and self.gputime is not None:
            try:
                read = await self.gputime.read(list(owners))
            except Exception as e:  # status must always answer
                log.exception("reading GPU time")
                read = GpuTimeRead({key: f"unknown: {type(e).__name__}" for key in owners})
        self.compute.record(
            now,
            {key: (a, read.gputime.get(key, "unknown: not read")) for key, a in owners.items()},
            read,
        )

    def _unmeasured(self, alloc: Allocation) -> str | None:
        """Why the module measures no GPU time for `alloc`, None when it does."""
        if alloc.isolation == "none":
            return "unknown: isolation none does not schedule compute"
        # isolation memory: registered with weight 0, scheduled as best effort.
        if alloc.container_id in self.link.registered:
            return None if self.gputime is not None else "unknown: no gputime reader"
        if alloc.interposer and any(s.core_percent for s in alloc.shares):
            return (
                "unknown: standalone (the interposer holds each process to its share "
                "itself; the kernel module is not there to measure)"
            )
        if self.link.mode == "off":
            return "unknown: kmod: off"
        problem = self.link.problem or "did not register it"
        return f"unknown: not registered (the kernel module {problem})"

    def _compute_use(self) -> dict[tuple[int, str], ComputeUse]:
        out = {}
        for cid, alloc in self.allocations.items():
            why = self._unmeasured(alloc)
            for s in alloc.shares:
                out[s.index, cid] = (
                    ComputeUse(None, None, why) if why else self.compute.use((s.index, cid))
                )
        return out
