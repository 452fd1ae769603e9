"""Per-GPU accounting and placement.

A GPU takes a share when, counting the share, its allocated memory is at most
its total minus the node's reserve, its compute limits add up to at most 100%
(a share without a compute limit counts 0), it holds at most max_inst
containers, and at most max_high_priority_per_gpu high-priority ones.

Placement of an n-GPU request without explicit devices chooses n distinct GPUs
that all fit, or none.  The container's GPU order is ascending GPU index, so
the first value of a list goes to the lowest chosen index.  Preference:

- binpack: the GPU with the least free memory first (fill one GPU before the
  next); ties by index.
- spread: the GPU with the fewest containers first, then the most free memory,
  then index.

Explicit devices are taken in the order given.  A refusal names every GPU that
would not take its part, with the shortfall, and the key to change.

A request from ``resources.limits`` (`ShareRequest.kubelet`) was admitted by
the kubelet against the node's totals (`nri_gpushare.k8s`).  When the free
memory and compute of the GPUs those totals count (a container slot left, at
least 1 GiB free) add up to enough but no GPU (or not enough GPUs) has its
part free, the refusal's reason is "fragmentation", and its message says so
and lists what each GPU has free (docs/kubernetes.md "Fragmentation").  A GPU
that holds max_inst containers is left out of the totals, not a reason to
call the refusal something else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from nri_gpushare.names import CORE, COUNT, MEMORY, RESOURCES
from nri_gpushare.share.model import Allocation, Gpu, GpuShare, NodePolicy, ShareRefused
from nri_gpushare.share.request import ShareRequest
from nri_gpushare.units import GiB, format_bytes


@dataclass
class GpuUsage:
    gpu: Gpu
    memory_bytes: int = 0
    core_percent: int = 0
    containers: set[str] = field(default_factory=set)
    high_priority: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Shortfall:
    kind: str  # memory | core | containers | high
    text: str


class Ledger:
    """What every GPU holds; the single source for capacity decisions."""

    def __init__(self, gpus: Sequence[Gpu], policy: NodePolicy) -> None:
        self.policy = policy
        self.usage = {g.index: GpuUsage(g) for g in gpus}

    def capacity(self, index: int) -> int:
        gpu = self.usage[index].gpu
        return max(0, gpu.memory_bytes - self.policy.memory_reserve_bytes)

    def free_memory(self, index: int) -> int:
        return max(0, self.capacity(index) - self.usage[index].memory_bytes)

    def add(self, alloc: Allocation) -> list[str]:
        """Record an allocation without checks (recovery); returns over-capacity notes."""
        notes = []
        for share in alloc.shares:
            u = self.usage[share.index]
            u.memory_bytes += share.memory_bytes
            u.core_percent += share.core_percent
            u.containers.add(alloc.container_id)
            if alloc.high_priority:
                u.high_priority.add(alloc.container_id)
            if self._over(u):
                notes.append(f"GPU {share.index} ({u.gpu.uuid}) is over capacity")
        return notes

    def remove(self, alloc: Allocation) -> None:
        for share in alloc.shares:
            u = self.usage[share.index]
            u.memory_bytes -= share.memory_bytes
            u.core_percent -= share.core_percent
            u.containers.discard(alloc.container_id)
            u.high_priority.discard(alloc.container_id)

    def _over(self, u: GpuUsage) -> bool:
        p = self.policy
        return (
            u.memory_bytes > self.capacity(u.gpu.index)
            or u.core_percent > 100
            or len(u.containers) > p.max_inst
            or len(u.high_priority) > p.max_high_priority_per_gpu
        )

    def _fits(self, index: int, memory: int, core: int, high: bool) -> bool:
        """Whether `shortfalls` is empty, without writing why."""
        u, p = self.usage[index], self.policy
        return (
            memory <= self.free_memory(index)
            and core <= max(0, 100 - u.core_percent)
            and len(u.containers) < p.max_inst
            and not (high and len(u.high_priority) >= p.max_high_priority_per_gpu)
        )

    def shortfalls(self, index: int, memory: int, core: int, high: bool) -> list[_Shortfall]:
        """Why GPU `index` cannot take this part of a request (empty: it can)."""
        u, p = self.usage[index], self.policy
        out = []
        free = self.free_memory(index)
        if memory > free:
            out.append(
                _Shortfall(
                    "memory",
                    f"has {format_bytes(u.gpu.memory_bytes)} total, "
                    f"{format_bytes(p.memory_reserve_bytes)} reserved, "
                    f"{format_bytes(u.memory_bytes)} allocated: "
                    f"gpu-memory {format_bytes(memory)} exceeds the free "
                    f"{format_bytes(free)} by {format_bytes(memory - free)}",
                )
            )
        core_free = max(0, 100 - u.core_percent)
        if core > core_free:
            out.append(
                _Shortfall(
                    "core",
                    f"has {u.core_percent}% compute allocated: gpu-core {core}% exceeds "
                    f"the free {core_free}% by {core - core_free}%",
                )
            )
        if len(u.containers) >= p.max_inst:
            out.append(
                _Shortfall(
                    "containers",
                    f"already holds {len(u.containers)} containers (max_inst {p.max_inst})",
                )
            )
        if high and len(u.high_priority) >= p.max_high_priority_per_gpu:
            out.append(
                _Shortfall(
                    "high",
                    f"already holds {len(u.high_priority)} high-priority container(s) "
                    f"(at most {p.max_high_priority_per_gpu} per GPU)",
                )
            )
        return out

    def place(self, req: ShareRequest, who: str) -> tuple[GpuShare, ...]:
        """Choose GPUs for `req` (nothing is recorded); raises ShareRefused."""
        slots = list(zip(req.memory_bytes, req.core_percent, strict=True))
        high = req.priority == "high"

        # Each (GPU, slot) is judged once; the search below only looks them up.
        fit = {
            (i, s): self._fits(i, *slots[s], high) for i in self.usage for s in range(len(slots))
        }

        def fits(index: int, slot: int) -> bool:
            return fit.get((index, slot), False)

        if req.devices is not None:
            chosen = list(req.devices)
            if all(fits(i, s) for s, i in enumerate(chosen)):
                return self._shares(chosen, slots)
            raise self._refusal(req, who, list(zip(chosen, slots, strict=True)), high, "")
        order = self._preference(req.placement)
        candidates = [i for i in order if any(fits(i, s) for s in range(len(slots)))]
        homeless = any(not any(fits(i, s) for i in candidates) for s in range(len(slots)))
        for combo in () if homeless else combinations(candidates, len(slots)):
            chosen = sorted(combo)
            if all(fits(i, s) for s, i in enumerate(chosen)):
                return self._shares(chosen, slots)
        if (fragmented := self._fragmented(req, who, slots, high)) is not None:
            raise fragmented
        if len(slots) == 1:  # any GPU would do: say why each one does not
            raise self._refusal(req, who, [(i, slots[0]) for i in sorted(self.usage)], high, "")
        preferred = sorted(order[: len(slots)])
        pairs = list(zip(preferred, slots, strict=True))
        raise self._refusal(req, who, pairs, high, self._summary(slots, high))

    def _fragmented(
        self, req: ShareRequest, who: str, slots: list[tuple[int, int]], high: bool
    ) -> ShareRefused | None:
        """The refusal of a request from resources.limits that the node's free
        total can take but its GPUs one by one cannot; None for any other."""
        if not req.kubelet:
            return None
        parts = set(slots)
        # The GPUs the device plugin counts in what it advertises (nri_gpushare.k8s.capacity):
        # a container slot left and at least 1 GiB free.  The others were never in the
        # totals the kubelet admitted against, so they neither count nor decide the reason.
        counted = [
            i
            for i, u in sorted(self.usage.items())
            if len(u.containers) < self.policy.max_inst and self.free_memory(i) >= GiB
        ]
        if not counted or any(
            s.kind not in ("memory", "core")
            for i in counted
            for slot in parts
            for s in self.shortfalls(i, *slot, high)
        ):
            return None  # high-priority slots: the usual refusal says which
        free_memory = sum(self.free_memory(i) for i in counted)
        free_core = sum(max(0, 100 - self.usage[i].core_percent) for i in counted)
        if free_memory < sum(req.memory_bytes) or free_core < sum(req.core_percent):
            return None  # not enough in total either: what the kubelet saw is out of date
        k = req.count
        ask = f"{RESOURCES[MEMORY]}={sum(req.memory_bytes) // GiB}"
        if any(req.core_percent):
            ask += f" {RESOURCES[CORE]}={sum(req.core_percent)}"
        if k > 1:
            ask += f" {RESOURCES[COUNT]}={k}"
        part = " or ".join(_free_part(slot) for slot in dict.fromkeys(slots))
        able = sum(1 for i in self.usage if any(not self.shortfalls(i, *s, high) for s in parts))
        if able == 0:
            lacking = f"no GPU has {part} free"
        else:
            has = "GPU has" if able == 1 else "GPUs have"
            lacking = f"only {able} {has} {part} free, {k} needed"
        each = "; ".join(
            f"GPU {i} ({u.gpu.uuid}) {format_bytes(self.free_memory(i))} and "
            f"{max(0, 100 - u.core_percent)}% compute free"
            + ("" if i in counted else f" ({self._uncounted(i)}: not in the node's total)")
            for i, u in sorted(self.usage.items())
        )
        spread = (
            f" or ask for the same total over more GPUs ({RESOURCES[COUNT]})"
            if k < len(counted)
            else ""
        )
        gpus = "GPU" if len(counted) == 1 else "GPUs"
        text = (
            f"gpushare: cannot place {who}: the kubelet admitted resources.limits {ask} "
            f"because the node's free total is enough ({format_bytes(free_memory)} and "
            f"{free_core}% compute over {len(counted)} {gpus}), but {lacking}: {each}. "
            f"The free room is split over the GPUs (fragmentation, see docs/kubernetes.md "
            f'"Fragmentation"): the kubelet retries the container, which starts once a share '
            f"on these GPUs ends; or delete the pod so that the scheduler places it again"
            f"{spread}"
        )
        return ShareRefused(text, "fragmentation", req.keys.get("memory"))

    def _uncounted(self, index: int) -> str:
        """Why the device plugin leaves GPU `index` out of what it advertises."""
        held = len(self.usage[index].containers)
        if held >= self.policy.max_inst:
            return f"holds {held} containers, max_inst {self.policy.max_inst}"
        return "less than 1024Mi free"

    def _summary(self, slots: list[tuple[int, int]], high: bool) -> str:
        """Why no combination of GPUs works, for a multi-GPU request."""

        def room(slot: tuple[int, int]) -> int:
            return sum(1 for i in self.usage if not self.shortfalls(i, *slot, high))

        if homeless := [s for s in dict.fromkeys(slots) if room(s) == 0]:
            return "no GPU has room for " + " or ".join(_part(s) for s in homeless)
        able = sum(1 for i in self.usage if any(not self.shortfalls(i, *s, high) for s in slots))
        text = f"{able} of {len(self.usage)} GPUs have room for a part, {len(slots)} needed"
        if able >= len(slots):
            text += "; the values go to the chosen GPUs in ascending index order"
        return text

    def _preference(self, placement: str) -> list[int]:
        def binpack(i: int) -> tuple[int, int]:
            return (self.free_memory(i), i)

        def spread(i: int) -> tuple[int, int, int]:
            return (len(self.usage[i].containers), -self.free_memory(i), i)

        return sorted(self.usage, key=binpack if placement == "binpack" else spread)

    def _shares(self, chosen: Iterable[int], slots: list[tuple[int, int]]) -> tuple[GpuShare, ...]:
        return tuple(
            GpuShare(i, self.usage[i].gpu.uuid, memory, core)
            for i, (memory, core) in zip(chosen, slots, strict=True)
        )

    def _refusal(
        self,
        req: ShareRequest,
        who: str,
        pairs: list[tuple[int, tuple[int, int]]],
        high: bool,
        summary: str,
    ) -> ShareRefused:
        problems: list[str] = []
        kinds: list[str] = []
        for index, slot in pairs:
            short = self.shortfalls(index, *slot, high)
            if short:
                uuid = self.usage[index].gpu.uuid
                problems.append(f"GPU {index} ({uuid}) " + " and ".join(s.text for s in short))
                kinds += [s.kind for s in short if s.kind not in kinds]
        gpus = "GPU" if req.count == 1 else "GPUs"
        hints = {
            "memory": f"lower {req.keys.get('memory')}",
            "core": f"lower {req.keys.get('core')}",
            "containers": "stop a container on that GPU or raise max_inst in the node config",
            "high": f"set {req.keys.get('priority')} to normal",
        }
        keys = {
            "memory": req.keys.get("memory"),
            "core": req.keys.get("core"),
            "high": req.keys.get("priority"),
        }
        if req.count > 1 and req.devices is None and req.keys.get("count") != keys["memory"]:
            hints["memory"] += f" or {req.keys.get('count')}"
        text = f"gpushare: cannot place {who}: {req.describe()} on {req.count} {gpus}: "
        text += "; ".join(problems)
        if summary:
            text += f" ({summary})"
        text += "; " + " or ".join(hints[k] for k in kinds)
        return ShareRefused(text, "capacity", keys.get(kinds[0]) if kinds else None)


def _free_part(slot: tuple[int, int]) -> str:
    memory, core = slot
    return format_bytes(memory) + (f" and {core}% compute" if core else "")


def _part(slot: tuple[int, int]) -> str:
    memory, core = slot
    return f"gpu-memory {format_bytes(memory)}" + (f" with gpu-core {core}%" if core else "")
