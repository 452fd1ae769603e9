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

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nri_gpushare.names import ASSIGNED, KEY_PREFIX
from nri_gpushare.share import records
from nri_gpushare.share.assigned import assigned_annotation
from nri_gpushare.share.decisions import DecisionLog
from nri_gpushare.share.interposer import LibraryCheck, missing_message, wants_interposer
from nri_gpushare.share.kernel import KernelModule
from nri_gpushare.share.kmod_link import KernelLink, registered_as
from nri_gpushare.share.limits import LimitLink, MemoryLimits
from nri_gpushare.share.model import (
    Allocation,
    ContainerInfo,
    Gpu,
    InjectionPlan,
    LocalRef,
    NodePolicy,
    ShareRefused,
)
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.plan import DeviceLookup, injection_plan
from nri_gpushare.share.report import status_document
from nri_gpushare.share.request import ShareRequest, ignored, may_ask, parse_request
from nri_gpushare.share.request.kubelet import recorded_ids
from nri_gpushare.share.request.sources import kubelet_allowed
from nri_gpushare.share.usage import (
    ComputeMeter,
    ComputeUse,
    GpuTimeRead,
    GpuTimeSource,
    MemoryUsage,
    MemoryUse,
)
from nri_gpushare.units import GiB, quote

log = logging.getLogger(__name__)

__all__ = ["ShareService", "Unserved", "assigned_annotation"]

MAX_PODS_REMEMBERED = 4096
"""Pods whose container names are kept for the warning at their stop (a pod
whose StopPodSandbox never came is forgotten oldest first)."""

_STRIP_ASSIGNED = InjectionPlan(devices=(), env={}, annotations={}, remove_annotations=(ASSIGNED,))


@dataclass
class LocalState:
    """What the service knows of a container asked for outside NRI (not recorded)."""

    pid: int = 0  # its first process; 0 until started (or after a daemon restart)
    since: float = 0.0  # time.time() when placed; 0 for one recovered after a restart
    cgroups_path: str = ""


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
        gputime: GpuTimeSource | None = None,
        decisions: DecisionLog | None = None,
    ) -> None:
        """`library_check`: whether the interposer's file is on the node (None:
        taken as present); `limits`: the driver's memory limits (None: off);
        `usage`: memory in use from the kernel module (None: unknown);
        `gputime`: GPU time charged by the module, sampled by `sample_compute`
        (None: unknown); `decisions`: where placed, refused and released are
        logged and counted."""
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_index = {g.index: g for g in self.gpus}
        self.policy = policy
        self.link = KernelLink(self.gpus, policy.kmod_mode, kmod)
        self.devices = devices
        self.ledger = Ledger(self.gpus, policy)
        self.library_check = library_check
        self.limits = LimitLink(limits)
        self.usage = usage
        self.gputime = gputime
        self.compute = ComputeMeter()
        self.decisions = decisions or DecisionLog()
        self.allocations: dict[str, Allocation] = {}
        self.store: records.AllocationStore = store or records.MemoryStore()
        self.unserved: dict[str, Unserved] = {}
        self._changes = 0  # records appended since the last snapshot
        self._pod_containers: dict[str, set[str]] = {}  # pod UID -> container names seen
        self._creating: set[str] = set()  # waiting for the module
        self._generation = 0  # bumped when synchronize replaces the table
        self.local: dict[str, LocalState] = {}  # container ID -> state, local allocations

    def holds(self, container_id: str) -> bool:
        """Whether the ID holds a share or is being placed."""
        return container_id in self.allocations or container_id in self._creating

    @property
    def registered(self) -> set[str]:
        """Container IDs registered with the kernel module."""
        return self.link.registered

    async def start(self) -> None:
        """Look for the kernel module (declares the GPUs when it is loaded)."""
        await self.link.start()

    # -- container lifecycle -------------------------------------------------------

    async def create_container(
        self,
        c: ContainerInfo,
        *,
        origin: str = "",
        namespace: str = "",
        gpus: tuple[int, ...] | None = None,
    ) -> InjectionPlan | None:
        """The plan for a new container, or None when it asks for no share.

        `origin` and `namespace`: how a container NRI does not see asked (see
        `Allocation.origin`); `gpus`: the GPU indexes it must be placed on
        (the CDI devices it was given), None to let placement choose.
        Raises ShareRefused; a refusal leaves nothing reserved.  Placed and
        refused are logged here (`decisions`), once each.
        """
        try:
            return await self._create(c, origin, namespace, gpus)
        except ShareRefused as e:
            where = f"{origin}:{namespace}" if origin else ""
            self.decisions.refused_container(c, e.reason, str(e), where)
            raise

    async def _create(
        self, c: ContainerInfo, origin: str, namespace: str, gpus: tuple[int, ...] | None
    ) -> InjectionPlan | None:
        who = c.describe()
        if c.id in self._creating:
            raise ShareRefused(f"gpushare: {who} is already being created", "conflict")
        if (held := self.allocations.get(c.id)) is not None:  # asked again: same answer
            if (held.origin, held.namespace) != (origin, namespace):
                if held.namespace == namespace and held.local and origin:
                    why = "give a container gpushare-runc or a gpushare.io/gpu CDI device, not both"
                else:
                    why = "container IDs must be unique across containerd namespaces"
                raise ShareRefused(
                    f"gpushare: cannot create {who}: container ID {quote(c.id)} already holds "
                    f"a share on this node (asked through {held.where}); {why}",
                    "conflict",
                )
            if (state := self.local.get(c.id)) is not None:
                state.since = time.time()  # a new incarnation: the reconciler's grace again
            return self._plan(held, c)
        if not may_ask(c):  # nothing of ours: nothing to parse, log or remember
            return None
        if c.pod_uid:
            self._pod_containers.setdefault(c.pod_uid, set()).add(c.name)
            while len(self._pod_containers) > MAX_PODS_REMEMBERED:  # a stop never came
                del self._pod_containers[next(iter(self._pod_containers))]
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
        if gpus is not None:
            req = _on_given_gpus(req, gpus, who)
        if origin == "cdi" and req.isolation != "none" and self.link.mode == "off":
            raise ShareRefused(_cdi_needs_module(who, "kmod: off"), "kmod")
        shares = self.ledger.place(req, who)  # reserves nothing yet
        interposer = self._interposer_for(req, who)
        alloc = Allocation(
            c.id,
            c.name,
            c.pod,
            shares,
            req.priority,
            req.isolation,
            interposer,
            origin,
            namespace,
            req.kubelet,
        )
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
        if origin == "cdi" and req.isolation != "none" and not registered:
            # The CDI hook cannot hand the container its quota in the environment:
            # only the module can tell the interposer.
            await self._undo(alloc, generation, registered)
            problem = self.link.problem or "did not register it"
            raise ShareRefused(_cdi_needs_module(who, f"the kernel module {problem}"), "kmod")
        if origin:
            self.local[c.id] = LocalState(c.pid, time.time(), c.cgroups_path)
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
        self.decisions.placed(alloc)
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

    async def release(self, container_id: str, why: str = "released") -> bool:
        """Unregister and free the container's shares (Stop and Remove); idempotent.

        True when this call freed an allocation (and logged it, saying `why`).
        """
        alloc = self.allocations.pop(container_id, None)
        self.unserved.pop(container_id, None)
        self.local.pop(container_id, None)
        if alloc is not None:
            self.ledger.remove(alloc)
            self.decisions.released(alloc, why)
            self._or_log(lambda: self._record(records.removed(container_id)))
        await self.link.release(container_id)
        await self.limits.clear(container_id)
        return alloc is not None

    def pod_stopped(self, uid: str, pod: str, annotations: Mapping[str, str]) -> None:
        """Pod `pod` ("namespace/name") stopped: warn about its per-container
        keys that named no container of it."""
        seen = self._pod_containers.pop(uid, set())
        prefix = KEY_PREFIX + "container."
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
        # Shares asked for outside NRI are not in `live`: they are kept as they are.
        kept = {cid: a for cid, a in self.allocations.items() if a.local}
        self._generation += 1
        self.ledger = Ledger(self.gpus, self.policy)
        self.allocations = {}
        self.link.forget()
        self.limits.forget()
        self._pod_containers = {}
        for cid, held in kept.items():
            self.ledger.add(held)
            self.allocations[cid] = held
        for c in live:
            if c.id in kept:
                log.warning(
                    "%s: its ID is held by a container asked for through %s; not recovered",
                    c.describe(),
                    kept[c.id].where,
                )
                continue
            if c.pod_uid and may_ask(c):  # only a pod of ours is warned about at its stop
                self._pod_containers.setdefault(c.pod_uid, set()).add(c.name)
            try:
                alloc = records.recover(c, saved.get(c.id), (module or {}).get(c.id), self.gpus)
                if alloc is None:
                    continue
                if not alloc.kubelet and kubelet_allowed(c, self.policy.sources_for(c)):
                    # The module keeps no device IDs: the container still carries them.
                    alloc = dataclasses.replace(alloc, kubelet=recorded_ids(c))
                for note in self.ledger.add(alloc):
                    log.warning("%s: recovered share: %s", c.describe(), note)
            except Exception:
                log.exception("%s: cannot recover its share; treated as having none", c.describe())
                continue
            self.allocations[c.id] = alloc
        if forgotten := sorted(set(saved) - set(self.allocations)):
            log.info("records of %d container(s) that are gone dropped", len(forgotten))
            for cid in forgotten:
                self.decisions.released(saved[cid], "gone: no live container at synchronize")
        self._or_log(self._snapshot)
        self._find_unserved(live)
        recovered = dict(self.allocations)
        running = {c.id: c for c in live} | self._local_containers()
        await self.link.resync(
            module, recovered, {cid: c.cgroups_path for cid, c in running.items()}
        )
        dropped = {cid: saved[cid] for cid in forgotten if not saved[cid].local}
        await self.limits.resync(recovered, running, dropped)

    # -- containers asked for outside NRI (the local API) ---------------------------------

    def _local_containers(self) -> dict[str, ContainerInfo]:
        """The local allocations as containers (for the module's and limits' resync)."""
        out = {}
        for cid, state in self.local.items():
            alloc = self.allocations.get(cid)
            if alloc is not None:
                out[cid] = ContainerInfo(
                    id=cid, name=alloc.name, cgroups_path=state.cgroups_path, pid=state.pid
                )
        return out

    def _local_alloc(self, namespace: str, container_id: str) -> Allocation | None:
        alloc = self.allocations.get(container_id)
        if alloc is None or not alloc.local or alloc.namespace != namespace:
            return None
        return alloc

    async def start_local(self, namespace: str, container_id: str, pid: int) -> bool:
        """The local container's first process `pid` exists: bind its
        registration to its cgroup and set the driver's limits.  False when no
        local share of that namespace and ID is held."""
        alloc = self._local_alloc(namespace, container_id)
        state = self.local.get(container_id)
        if alloc is None or state is None:
            return False
        if not state.cgroups_path:
            # Recovered after a restart that fell between its create and this
            # start: its cgroup was not recorded, so nothing can be bound now;
            # the pid stays unknown and the containerd reconciler adopts it.
            log.info(
                "container %s/%s: started (pid %d); its cgroup comes from containerd's task",
                namespace,
                container_id,
                pid,
            )
            return True
        state.pid = pid
        c = ContainerInfo(
            id=container_id, name=alloc.name, cgroups_path=state.cgroups_path, pid=pid
        )
        await self.start_container(c)
        return True

    async def adopt_local(
        self, namespace: str, container_id: str, pid: int, cgroups_path: str
    ) -> bool:
        """A local share whose start the daemon never heard (recovered after a
        restart that fell between the container's create and its start):
        containerd runs its first process `pid` in `cgroups_path`.  Bind and
        limit it as start_local would.  False when no such share waits for
        its process (unknown, or its pid is known already)."""
        alloc = self._local_alloc(namespace, container_id)
        state = self.local.get(container_id)
        if alloc is None or state is None or state.pid:
            return False
        state.pid = pid
        state.cgroups_path = cgroups_path
        log.info(
            "container %s/%s: adopted its running task (pid %d, cgroup %s)",
            namespace,
            container_id,
            pid,
            quote(cgroups_path),
        )
        c = ContainerInfo(id=container_id, name=alloc.name, cgroups_path=cgroups_path, pid=pid)
        try:
            await self.start_container(c)
        except BaseException:
            if self.local.get(container_id) is state:  # not bound: the next pass tries again
                state.pid, state.cgroups_path = 0, ""
            raise
        return True

    async def release_local(self, namespace: str, container_id: str, why: str) -> bool:
        """Release a share asked for outside NRI (never an NRI one); True when
        one was freed."""
        if self._local_alloc(namespace, container_id) is None:
            return False
        return await self.release(container_id, why)

    def local_allocations(self) -> list[LocalRef]:
        """The local allocations, for the containerd reconciler."""
        return [
            LocalRef(a.namespace, cid, state.pid, state.since)
            for cid, a in self.allocations.items()
            if a.local and (state := self.local.get(cid)) is not None
        ]

    async def recover_local(self) -> None:
        """After a daemon restart: take back the shares asked for outside NRI
        from the daemon's records, checked against the module's registry (its
        registration wins; a share it lost is registered again).  Whether each
        container still exists is for the containerd reconciler to say.
        Never raises for what it reads."""
        text = self.store.load()
        saved = records.decode(text, self.gpus) if text is not None else {}
        wanted = {cid: a for cid, a in saved.items() if a.local and cid not in self.allocations}
        if not wanted:
            return
        module = await self.link.registrations()
        for cid, alloc in wanted.items():
            c = ContainerInfo(id=cid, name=alloc.name)
            by_module = records.module_wins(c, alloc, (module or {}).get(cid), self.gpus)
            if by_module is not alloc:  # what the module does not keep stays the record's
                alloc = dataclasses.replace(
                    by_module,
                    isolation=alloc.isolation,
                    interposer=alloc.interposer,
                    origin=alloc.origin,
                    namespace=alloc.namespace,
                )
            try:
                for note in self.ledger.add(alloc):
                    log.warning("container %s: recovered share: %s", cid, note)
            except Exception:
                log.exception("container %s: cannot recover its share", cid)
                continue
            self.allocations[cid] = alloc
            self.local[cid] = LocalState()
            log.info(
                "container %s/%s: recovered %s (asked through %s)",
                alloc.namespace,
                cid,
                alloc.describe_shares(),
                alloc.origin,
            )
        recovered = {cid: self.allocations[cid] for cid in wanted if cid in self.allocations}
        if module is not None:
            for cid, alloc in recovered.items():
                registration = module.get(cid)
                if alloc.isolation == "none":
                    continue
                if registration is not None and registered_as(alloc, registration):
                    self.link.registered.add(cid)
                else:
                    await self.link.register(alloc, f"container {cid}")

    def _find_unserved(self, live: Sequence[ContainerInfo]) -> None:
        """Live containers that ask for a share and hold none (fail-open); the
        ones already known keep what was done about them."""
        before, self.unserved = self.unserved, {}
        for c in live:
            if not c.running or c.id in self.allocations:
                continue
            if c.id in before:
                if self._asked(c) is not None:
                    kept = before[c.id]
                    kept.container = c  # its pid may be known by now
                    self.unserved[c.id] = kept
                continue
            self.started_unserved(c)

    def started_unserved(self, c: ContainerInfo) -> Unserved | None:
        """`c` starts (or runs) holding no share: when it asks for one, it was
        created while the plugin was not serving (containerd failed open: the
        plugin was away, registering after Synchronize's snapshot, or answered
        too late), so it is unserved; None when it asks for nothing."""
        if c.id in self.allocations:
            return None
        if (known := self.unserved.get(c.id)) is not None:
            return known
        asked = self._asked(c)
        if asked is None:
            return None
        entry = self.unserved[c.id] = Unserved(c, asked)
        log.warning(
            "%s asked for %s but runs without a share: it was created while the plugin "
            "was not serving (containerd failed open); unserved policy: %s",
            c.describe(),
            asked,
            self.policy.unserved,
        )
        return entry

    def _asked(self, c: ContainerInfo) -> str | None:
        """What `c` asks for (or why it would be refused); None: nothing."""
        try:
            req = parse_request(c, self.gpus, self.policy)
            if req is None:
                return None
            return req.describe()
        except ShareRefused as e:
            return f"a share it would be refused: {e}"
        except Exception as e:  # never let one container stop the rest
            return f"a share that cannot be read ({type(e).__name__})"

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


def _on_given_gpus(req: ShareRequest, gpus: tuple[int, ...], who: str) -> ShareRequest:
    """`req` placed on exactly `gpus` (the CDI devices the container was given)."""
    named = ", ".join(str(i) for i in gpus)
    if req.devices is not None and sorted(req.devices) != sorted(gpus):
        raise ShareRefused(
            f"gpushare: cannot create {who}: its CDI devices give it GPU(s) {named}, but "
            f"{req.keys.get('devices', 'gpu-devices')} asks for GPU(s) "
            f"{', '.join(str(i) for i in req.devices)}; ask for the same GPUs in both",
            "conflict",
            req.keys.get("devices"),
        )
    if req.count != len(gpus):
        raise ShareRefused(
            f"gpushare: cannot create {who}: its CDI devices give it {len(gpus)} GPU(s) "
            f"({named}) but it asks for a share of {req.count}; ask for "
            f"gpushare.io/gpu-count={len(gpus)} or request {req.count} device(s) "
            f"(one CDI device: a GPU's index or UUID, or all)",
            "conflict",
            req.keys.get("count"),
        )
    return dataclasses.replace(req, devices=gpus)


def _cdi_needs_module(who: str, problem: str) -> str:
    return (
        f"gpushare: cannot create {who}: a share with isolation full|memory through a CDI "
        f"device is enforced by the gpushare kernel module (the CDI hook cannot put the "
        f"quota in the container's environment), and {problem}; load gpushare.ko, or "
        f"start the container with the gpushare-runc runtime, or ask for "
        f"gpushare.io/isolation=none"
    )
