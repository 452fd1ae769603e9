"""The share service: the container lifecycle the daemon drives.

create_container parses the request (nothing reserved), places it
(all-or-nothing), registers it with the kernel module (a refused registration
leaves nothing reserved) answers with an injection plan and records it in the
daemon's store (a share that cannot be recorded is refused).  release
undoes it and is idempotent.  synchronize rebuilds the table after a plugin
restart from what the plugin and the module wrote (`records`), never from
anything a container carries, and finds the containers that asked for a share
but run without one (created while the plugin was down: `unserved`).

The parts live next door: `request` (what a container asks for), `placement`
(the per-GPU ledger), `kmod_link` (the kernel module), `records` (the daemon's
record and recovery), `assigned` (the annotation people read), `plan` (what is
injected), `interposer` (libgpushare.so: who gets it), `limits` (the driver's
per-cgroup memory limits), `usage` (memory in use), `report` (the status
document).

The methods that may ask the kernel module are coroutines: the module is
reached through the awaited `KernelModule` interface, so other containers are
served while it answers.  A share is reserved in the ledger before the module
is asked, so nothing placed meanwhile can take its room; a refusal frees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..kmod.client import KernelModule
from . import records
from .assigned import assigned_annotation
from .interposer import LibraryCheck, missing_message, wants_interposer
from .kmod_link import KernelLink
from .limits import LimitLink, MemoryLimits
from .model import (
    ASSIGNED,
    PREFIX,
    Allocation,
    ContainerInfo,
    Gpu,
    InjectionPlan,
    NodePolicy,
    ShareRefused,
)
from .placement import Ledger
from .plan import DeviceLookup, injection_plan
from .report import status_document
from .request import ShareRequest, ignored, parse_request
from .units import GiB, quote
from .usage import MemoryUsage, MemoryUse

log = logging.getLogger(__name__)

__all__ = ["ShareService", "Unserved", "assigned_annotation"]

_STRIP_ASSIGNED = InjectionPlan(devices=(), env={}, annotations={}, remove_annotations=(ASSIGNED,))


@dataclass
class Unserved:
    """A live container that asked for a share and runs without one."""

    container: ContainerInfo
    asked: str  # what it asked for, or why that request is refused
    action: str = "warned"  # what the node's `unserved` policy did about it
    settled: bool = False  # nothing more to do (deny: it was killed or is gone)

    def json(self) -> dict[str, Any]:
        c = self.container
        return {
            "container_id": c.id,
            "name": c.name,
            "pod": c.pod,
            "asked": self.asked,
            "action": self.action,
        }


class ShareService:
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
    ) -> None:
        """`library_check`: whether the interposer's file is on the node (None:
        taken as present); `limits`: the driver's memory limits (None: off);
        `usage`: memory in use from the kernel module (None: unknown)."""
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_index = {g.index: g for g in self.gpus}
        self.policy = policy
        self.link = KernelLink(self.gpus, policy.kmod_mode, kmod)
        self.devices = devices
        self.ledger = Ledger(self.gpus, policy)
        self.library_check = library_check
        self.limits = LimitLink(limits)
        self.usage = usage
        self.allocations: dict[str, Allocation] = {}
        self.store: records.AllocationStore = store or records.MemoryStore()
        self.unserved: dict[str, Unserved] = {}
        self._changes = 0  # records appended since the last snapshot
        self._pod_containers: dict[str, set[str]] = {}  # pod UID -> container names seen
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
            return self._plan(self.allocations[c.id], c)
        if c.pod_uid:
            self._pod_containers.setdefault(c.pod_uid, set()).add(c.name)
        if not_allowed := ignored(c, self.policy.sources_for(c)):
            log.warning(
                "%s: ignoring %s: this node does not take share requests from there "
                "(node config `sources`)",
                who,
                ", ".join(not_allowed),
            )
        forged = ASSIGNED in c.annotations
        if forged:
            log.warning("%s: ignoring the %s it carries: only the plugin writes it", who, ASSIGNED)
        req = parse_request(c, self.gpus, self.policy)
        if req is None:
            return _STRIP_ASSIGNED if forged else None
        shares = self.ledger.place(req, who)  # reserves nothing yet
        interposer = self._interposer_for(req, who)
        alloc = Allocation(c.id, c.name, c.pod, shares, req.priority, req.isolation, interposer)
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
            await self._undo(alloc, generation, registered)
            raise ShareRefused(
                f"gpushare: cannot create {who}: it was released while the kernel module "
                f"registered it",
                "conflict",
            )
        try:
            self._record(records.added(alloc))
        except OSError as e:
            await self._undo(alloc, generation, registered)
            raise ShareRefused(
                f"gpushare: cannot create {who}: its allocation cannot be recorded "
                f"({e}); the node's state directory needs attention",
                "state",
            ) from None
        self._check_memory_dev(req, alloc, c)
        log.info("%s: placed %s", who, alloc.describe_shares())
        return self._plan(alloc, c)

    def _interposer_for(self, req: ShareRequest, who: str) -> bool:
        """Whether the share gets the interposer; ShareRefused when it needs the
        library, the node lacks it and interposer.missing is refuse."""
        policy = self.policy.interposer
        if policy is None or not wants_interposer(req.isolation):
            return False
        problem = self.library_check(policy.library) if self.library_check else ""
        if not problem:
            return True
        if policy.missing == "refuse":
            raise ShareRefused(missing_message(policy, who, problem), "interposer")
        log.warning(
            "%s: %s %s: created without the CUDA interposer (interposer.missing: warn); "
            "only the kernel module and the driver's limits guard its memory",
            who,
            policy.library,
            problem,
        )
        return False

    async def start_container(self, c: ContainerInfo) -> None:
        """Bind the registration to the container's cgroup, which now exists,
        and set the driver's memory limits on it.

        A failure is logged; with kmod: required a failed bind raises ShareRefused.
        """
        await self.link.bind(c)
        alloc = self.allocations.get(c.id)
        if alloc is not None:
            await self.limits.apply(alloc, c.cgroups_path, c.describe())
            if self.allocations.get(c.id) is not alloc:  # released meanwhile
                await self.limits.clear(c.id)

    async def release(self, container_id: str) -> bool:
        """Unregister and free the container's shares (Stop and Remove); idempotent.

        True when this call freed an allocation.
        """
        alloc = self.allocations.pop(container_id, None)
        self.unserved.pop(container_id, None)
        if alloc is not None:
            self.ledger.remove(alloc)
            log.info("container %s: released %s", container_id, alloc.describe_shares())
            self._or_log(lambda: self._record(records.removed(container_id)))
        await self.link.release(container_id)
        await self.limits.clear(container_id)
        return alloc is not None

    def pod_stopped(self, uid: str, pod: str, annotations: Mapping[str, str]) -> None:
        """Pod `pod` ("namespace/name") stopped: warn about its per-container
        keys that named no container of it."""
        seen = self._pod_containers.pop(uid, set())
        prefix = PREFIX + "container."
        named = {
            key[len(prefix) :].rpartition(".")[0] for key in annotations if key.startswith(prefix)
        }
        for name in sorted(named - seen - {""}):
            log.warning(
                "%s: pod annotations %s%s.* name no container of this pod (its containers: "
                "%s); they were ignored",
                f"pod {quote(pod)}",
                prefix,
                name[:64],
                ", ".join(sorted(seen)) or "none seen",
            )

    async def synchronize(self, live: Sequence[ContainerInfo]) -> None:
        """Rebuild everything from the live containers, the daemon's records and
        the module's registry, and find the containers that run without the
        share they asked for (`unserved`).

        Registrations without a live container are removed; live shares the
        module lost are registered again.  Live shares are recorded even when
        they no longer fit (a smaller reserve or inventory): they exist, so
        nothing new is placed on top of them.  A bad record or container is
        logged and treated as absent: this never raises for what it reads.
        """
        live = list({c.id: c for c in live}.values())  # one entry per container
        module = await self.link.registrations()
        text = self.store.load()
        saved = records.decode(text, self.gpus) if text is not None else {}
        # From here to resync nothing is awaited: the table is replaced at once.
        self._generation += 1
        self.ledger = Ledger(self.gpus, self.policy)
        self.allocations = {}
        self.link.forget()
        self.limits.forget()
        self._pod_containers = {}
        for c in live:
            if c.pod_uid:
                self._pod_containers.setdefault(c.pod_uid, set()).add(c.name)
            try:
                alloc = records.recover(c, saved.get(c.id), (module or {}).get(c.id), self.gpus)
                if alloc is None:
                    continue
                for note in self.ledger.add(alloc):
                    log.warning("%s: recovered share: %s", c.describe(), note)
            except Exception:
                log.exception("%s: cannot recover its share; treated as having none", c.describe())
                continue
            self.allocations[c.id] = alloc
        if forgotten := sorted(set(saved) - set(self.allocations)):
            log.info("records of %d container(s) that are gone dropped", len(forgotten))
        self._or_log(self._snapshot)
        self._find_unserved(live)
        recovered = dict(self.allocations)
        await self.link.resync(module, recovered, {c.id: c.cgroups_path for c in live})
        dropped = {cid: saved[cid] for cid in forgotten}
        await self.limits.resync(recovered, {c.id: c for c in live}, dropped)

    def _find_unserved(self, live: Sequence[ContainerInfo]) -> None:
        """Live containers that ask for a share and hold none (fail-open); the
        ones already known keep what was done about them."""
        before, self.unserved = self.unserved, {}
        for c in live:
            if not c.running or c.id in self.allocations:
                continue
            try:
                req = parse_request(c, self.gpus, self.policy)
                if req is None:
                    continue
                asked = req.describe()
            except ShareRefused as e:
                asked = f"a share it would be refused: {e}"
            except Exception as e:  # never let one container stop the rest
                asked = f"a share that cannot be read ({type(e).__name__})"
            if c.id in before:
                kept = before[c.id]
                kept.container = c  # its pid may be known by now
                self.unserved[c.id] = kept
                continue
            self.unserved[c.id] = Unserved(c, asked)
            log.warning(
                "%s asked for %s but runs without a share: it was created while the plugin "
                "was not serving (containerd failed open); unserved policy: %s",
                c.describe(),
                asked,
                self.policy.unserved,
            )

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
        )
        if (interposer := self.policy.interposer) is not None:
            check = self.library_check
            document["interposer"]["problem"] = check(interposer.library) if check else ""
        document["unserved"] = [u.json() for u in self.unserved.values()]
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

    # -- helpers -----------------------------------------------------------------------

    def _record(self, line: str) -> None:
        """Append a change to the records, compacting now and then (raises OSError)."""
        if self._changes >= records.COMPACT_AFTER:
            self._snapshot()
        self.store.append(line)
        self._changes += 1

    def _snapshot(self) -> None:
        """Rewrite the records as the table (raises OSError)."""
        self.store.replace(records.snapshot(self.allocations.values()))
        self._changes = 0

    def _or_log(self, write: Callable[[], None]) -> None:
        try:
            write()
        except OSError as e:
            # Stale records are harmless: recovery checks them against live containers.
            log.error("cannot record allocations: %s", e)

    async def _undo(self, alloc: Allocation, generation: int, registered: bool) -> None:
        """Take back a share that will not be given: reservation and registration."""
        self._drop(alloc, generation)
        if registered:
            await self.link.release(alloc.container_id)

    def _drop(self, alloc: Allocation, generation: int) -> None:
        """Free a reservation that did not become an allocation."""
        if generation == self._generation and self.allocations.get(alloc.container_id) is alloc:
            del self.allocations[alloc.container_id]
            self.ledger.remove(alloc)

    def _plan(self, alloc: Allocation, c: ContainerInfo) -> InjectionPlan:
        registered = alloc.container_id in self.link.registered
        return injection_plan(
            alloc, self.by_index, self.devices, registered, self.policy.interposer, c.env
        )

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
