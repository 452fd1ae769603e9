"""A running container's share resized live (`nri-gpushare resize`).

The operation, in order, each step refusing with nothing changed:

1. find the container (its ID, else a name or ID prefix naming one container);
2. the new values, checked like a new request's (`resize_ask`);
3. refused for a share the kubelet accounted (memory or compute from the
   pod's resources.limits);
4. placed against the free room of the GPUs it already has (never another
   GPU, never over-commit; a part that shrinks or stays always fits), and
   refused for a share the kernel module does not hold (its limits are the
   environment it started with: nothing can change live);
5. applied to the module GPU by GPU (memsize, weight, highprio; refused while
   an upgrade has frozen it); when the module refuses one GPU, those changed
   before it are changed back, so a multi-GPU share changes on all its GPUs
   or none.  While the module answers, the ledger books the larger of the old
   and new share and the table keeps the old one.  A change back that fails
   leaves the resize unsettled (answered "may have been applied", booked as
   both) until `settle` reads the module again;
6. recorded (the journal's new line: a daemon restart rebuilds the resized
   share), the driver's memory limits set again, logged as a decision.

The module's refusals become the caller's: a memsize below what the
container's processes hold names the amount held; a GPU whose module has no
room (orphaned memory the daemon does not count) says so.
"""

from __future__ import annotations

import logging

from nri_gpushare.share import records
from nri_gpushare.share.kernel import KernelModule, KmodError
from nri_gpushare.share.kmod_link import quotas, registered_as
from nri_gpushare.share.model import Allocation, ShareRefused
from nri_gpushare.share.resize_ask import (
    ResizeAsk,
    check_kubelet,
    check_live,
    larger,
    refusal,
    resized,
    unsure,
    who,
)
from nri_gpushare.share.table import ShareTable
from nri_gpushare.units import format_bytes, quote

log = logging.getLogger(__name__)


class Resizer:
    def __init__(self, table: ShareTable) -> None:
        self.table = table
        # Resizes whose change the module could not undo, until `settle`:
        # container ID -> (generation, old, new).
        self.unsettled: dict[str, tuple[int, Allocation, Allocation]] = {}
        self._undo_error = ""  # the last change back the module refused

    async def resize(self, ref: str, ask: ResizeAsk) -> tuple[Allocation, bool]:
        """The container's share after the resize, and whether it changed.
        Raises ShareRefused, logged as a refused decision; a refusal changes
        nothing."""
        old: Allocation | None = None
        try:
            old = self.find(ref)
            return await self._resize(old, ask)
        except ShareRefused as e:
            self.table.decisions.refused(
                old.container_id if old else ref,
                e.reason,
                str(e),
                pod=old.pod if old else "",
                name=old.name if old else "",
                origin=old.where if old and old.local else "",
                operation="resize",
            )
            raise

    def find(self, ref: str) -> Allocation:
        """The allocation `ref` names: a container ID, else a unique name
        ("name" or "namespace/pod/name") or ID prefix; refused when the names
        and prefixes it matches are more than one container."""
        allocations = self.table.allocations
        if (exact := allocations.get(ref)) is not None:
            return exact
        named = [a for a in allocations.values() if ref in (a.name, f"{a.pod}/{a.name}")]
        prefixed = [a for cid, a in allocations.items() if ref and cid.startswith(ref)]
        found = list({a.container_id: a for a in named + prefixed}.values())
        if len(found) == 1:
            return found[0]
        if not found:
            raise ShareRefused(
                f"gpushare: cannot resize '{quote(ref)}': no container holding a share on "
                f"this node has that ID, ID prefix or name ('nri-gpushare status' lists them)",
                "invalid",
            )
        listed = ", ".join(sorted(f"{a.container_id[:13]} '{quote(a.name)}'" for a in found)[:8])
        raise ShareRefused(
            f"gpushare: cannot resize '{quote(ref)}': it names {len(found)} containers "
            f"by name or ID prefix ({listed}); give more of the container ID",
            "invalid",
        )

    async def _resize(self, old: Allocation, ask: ResizeAsk) -> tuple[Allocation, bool]:
        table = self.table
        cid = old.container_id
        new = resized(old, ask, table.policy)
        if (new.shares, new.priority) == (old.shares, old.priority):
            return old, False
        check_kubelet(old, new)
        if cid in table.creating or cid in table.resizing or cid in self.unsettled:
            raise ShareRefused(
                f"gpushare: cannot resize {who(old)}: it is being created or resized; try again",
                "conflict",
            )
        new = records.keeping_creation(old, new)
        # Until the module says yes the table keeps `old` (what a compaction
        # records) and the ledger books the larger of the two, so nothing
        # placed meanwhile takes room a refusal would need back.
        generation = table.generation
        table.booked[cid] = (generation, self._place(old, new))
        table.resizing.add(cid)
        try:
            registered = cid in table.link.registered and await table.link.ready()
            off = table.link.mode == "off"
            check_live(old, registered, "is off (kmod: off)" if off else table.link.problem)
            await self._check_not_upgrading(old)
            await self._apply(old, new)
        except BaseException as e:
            if cid not in self.unsettled:  # else booked as both until `settle`
                self._book(old, generation)
            if isinstance(e, ShareRefused) and self._gone(old, generation):
                raise self._gone_refusal(old) from None
            raise
        finally:
            table.resizing.discard(cid)  # its writes are done (Synchronize waits on these)
        if self._gone(old, generation):
            table.booked.pop(cid, None)
            raise self._gone_refusal(old)
        table.allocations[cid] = new  # before the append: a compaction records it
        try:
            table.journal.append(records.added(new))
        except OSError as e:
            table.allocations[cid] = old
            if not await self._unapply(old, list(range(len(new.shares)))):
                raise self._unsure(old, new, f"the change cannot be recorded: {e}") from None
            self._book(old, generation)
            raise ShareRefused(
                f"gpushare: cannot resize {who(old)}: the change cannot be recorded ({e}); "
                f"it was undone; the node's state directory needs attention",
                "state",
            ) from None
        self._book(new, generation)
        table.decisions.resized(old, new)
        if (applied := table.limits.applied.get(cid)) is not None:
            await table.limits.apply(new, applied.cgroups_path, who(new))
            if cid not in table.allocations:  # released meanwhile: no limits left behind
                await table.limits.clear(cid)
        return new, True

    def _place(self, old: Allocation, new: Allocation) -> Allocation:
        """Book the larger of `old` and `new` per GPU in place of `old` and
        return that booking, or raise ShareRefused ("capacity") naming each
        GPU without room (the ledger unchanged)."""
        ledger = self.table.ledger
        ledger.remove(old)
        problems = []
        for was, now in zip(old.shares, new.shares, strict=True):
            i = now.index
            short = []
            free = ledger.free_memory(i)
            if now.memory_bytes > max(was.memory_bytes, free):
                short.append(
                    f"memory {format_bytes(now.memory_bytes)} exceeds the "
                    f"{format_bytes(free)} it can have (its {format_bytes(was.memory_bytes)} "
                    f"and the GPU's free memory) by {format_bytes(now.memory_bytes - free)}"
                )
            core_free = max(0, 100 - ledger.usage[i].core_percent)
            if now.core_percent > max(was.core_percent, core_free):
                short.append(
                    f"core {now.core_percent}% exceeds the {core_free}% it can have by "
                    f"{now.core_percent - core_free}%"
                )
            u = ledger.usage[i]
            most = self.table.policy.max_high_priority_per_gpu
            if new.high_priority and not old.high_priority and len(u.high_priority) >= most:
                short.append(
                    f"already holds {len(u.high_priority)} high-priority container(s) "
                    f"(at most {most} per GPU)"
                )
            if short:
                problems.append(f"GPU {i} ({u.gpu.uuid}) " + " and ".join(short))
        if problems:
            ledger.add(old)
            raise ShareRefused(
                f"gpushare: cannot resize {who(old)} to {new.describe_shares()}: "
                + "; ".join(problems)
                + " (a share keeps its GPUs; nothing was changed)",
                "capacity",
            )
        booking = larger(old, new)
        ledger.add(booking)
        return booking

    def _book(self, alloc: Allocation, generation: int) -> None:
        """The ledger books `alloc` in place of the resize's booking, when the
        container still holds its share in this generation of the table."""
        table = self.table
        booked = table.booked.pop(alloc.container_id, None)
        if booked is not None and booked[0] == generation == table.generation:
            table.ledger.remove(booked[1])
            table.ledger.add(alloc)

    def _gone(self, alloc: Allocation, generation: int) -> bool:
        """Whether the container was released, or the table rebuilt, meanwhile."""
        table = self.table
        return (
            generation != table.generation or table.allocations.get(alloc.container_id) is not alloc
        )

    def _gone_refusal(self, old: Allocation) -> ShareRefused:
        return ShareRefused(
            f"gpushare: resizing {who(old)}: it was released, or the table rebuilt, while the "
            f"kernel module changed it; see 'nri-gpushare status'",
            "conflict",
        )

    async def _apply(self, old: Allocation, new: Allocation) -> None:
        """The new quotas in the module, GPU by GPU; on a refusal the GPUs
        already asked are changed back and ShareRefused is raised."""
        attempted: list[int] = []
        try:
            for k, (was, now) in enumerate(zip(quotas(old), quotas(new), strict=True)):
                if was != now:
                    attempted.append(k)
                    await self._kmod().update_quota(new.container_id, now)
        except KmodError as e:
            if not await self._unapply(old, attempted):
                raise self._unsure(old, new, str(e)) from None
            raise refusal(old, new, e) from None
        except BaseException:
            # Cancelled, or a client bug: a write may still land; change it back.
            if not await self._unapply(old, attempted):
                self._unsure(old, new, "cancelled")
            raise

    async def _unapply(self, old: Allocation, which: list[int]) -> bool:
        """`old`'s quotas written back on GPUs `which` (queued behind the
        writes they undo); whether all were."""
        if old.container_id not in self.table.link.registered:
            return True  # released meanwhile: unregistered, nothing to change back
        kmod, undone = self._kmod(), True
        for k in reversed(which):
            quota = quotas(old)[k]
            try:
                await kmod.update_quota(old.container_id, quota)
            except KmodError as e:
                undone = False
                self._undo_error = str(e)
                log.error(
                    "%s: the kernel module's quota on GPU %d could not be changed back (%s); "
                    "the daemon reads it again later",
                    who(old),
                    quota.gpu_index,
                    e,
                )
        return undone

    def _unsure(self, old: Allocation, new: Allocation, why: str) -> ShareRefused:
        """Remember a resize the module may hold in part (booked as the larger
        of both, no other resize of it) until `settle` reads the module."""
        self.unsettled[old.container_id] = (self.table.generation, old, new)
        return unsure(old, new, why, self._undo_error)

    async def settle(self) -> None:
        """Settle each resize whose outcome the module left unknown on what it
        holds now: the old share where it holds the old quotas (or none), the
        new where it holds the new ones, else the old quotas written again and
        read again next time.  The daemon calls this every few seconds."""
        for generation, old, _ in list(self.unsettled.values()):
            if self._gone(old, generation):  # released, or the table rebuilt
                self._settled(old, old, generation)
        if not self.unsettled:
            return
        module = await self.table.link.registrations()
        if module is None:
            return  # not answering: next time
        for cid, (generation, old, new) in list(self.unsettled.items()):
            reg = module.get(cid)
            if self._gone(old, generation) or reg is None or registered_as(old, reg):
                self._settled(old, old, generation)
            elif registered_as(new, reg):
                await self._adopt(old, new, generation)
            else:
                held = {q.gpu_index: q for q in reg.quotas}
                which = [k for k, q in enumerate(quotas(old)) if held.get(q.gpu_index) != q]
                if await self._unapply(old, which):
                    self._settled(old, old, generation)

    def _settled(self, old: Allocation, alloc: Allocation, generation: int) -> None:
        cid = old.container_id
        if self.unsettled.pop(cid, None) is None:
            return
        self._book(alloc, generation)
        if not self._gone(alloc, generation):
            log.info("%s: the module holds %s: settled", who(old), alloc.describe_shares())

    async def _adopt(self, old: Allocation, new: Allocation, generation: int) -> None:
        """The module took the whole resize after all: so do the books."""
        table = self.table
        table.allocations[old.container_id] = new
        table.journal.or_log(lambda: table.journal.append(records.added(new)))
        self._settled(old, new, generation)
        table.decisions.resized(old, new)
        if (applied := table.limits.applied.get(new.container_id)) is not None:
            await table.limits.apply(new, applied.cgroups_path, who(new))

    async def _check_not_upgrading(self, old: Allocation) -> None:
        """Refuse while `nri-gpushare kmod-upgrade` has frozen the module: a
        change it carries over could not be undone meanwhile."""
        try:
            frozen = await self._kmod().upgrading()
        except KmodError:
            frozen = False  # the writes will say what is wrong
        if frozen:
            raise ShareRefused(
                f"gpushare: cannot resize {who(old)}: gpushare.ko is being upgraded "
                f"(nri-gpushare kmod-upgrade); nothing was changed; try again once it is done",
                "kmod",
            )

    def _kmod(self) -> KernelModule:
        kmod = self.table.link.kmod
        assert kmod is not None  # registered: the link has a module
        return kmod
