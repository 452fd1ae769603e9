"""A container's share from create to release: the lifecycle NRI drives
(and the local API, for containers NRI never sees).

`create_container` is the one way a share is made: it parses the request
(nothing reserved), places it (all-or-nothing), registers it with the kernel
module (a refused registration leaves nothing reserved), records it (a share
that cannot be recorded is refused) and answers with the injection plan.
`release` undoes it and is idempotent.

The module is reached through the awaited `KernelModule` interface, so other
containers are served while it answers.  A share is reserved in the ledger
before the module is asked, so nothing placed meanwhile can take its room; a
refusal frees it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from nri_gpushare.names import ASSIGNED, DRA_CLAIM_ENV, KEY_PREFIX
from nri_gpushare.share import records
from nri_gpushare.share.claims import claim_request
from nri_gpushare.share.given_gpus import cdi_needs_module as _cdi_needs_module
from nri_gpushare.share.given_gpus import on_given_gpus as _on_given_gpus
from nri_gpushare.share.interposer import LibraryCheck, missing_message, wants_interposer
from nri_gpushare.share.model import Allocation, ContainerInfo, InjectionPlan, Origin, ShareRefused
from nri_gpushare.share.plan import DeviceLookup, injection_plan
from nri_gpushare.share.request import ShareRequest, ignored, may_ask, parse_request
from nri_gpushare.share.table import LocalState, ShareTable
from nri_gpushare.units import GiB, quote

log = logging.getLogger(__name__)

MAX_PODS_REMEMBERED = 4096
"""Pods whose container names are kept for the warning at their stop (a pod
whose StopPodSandbox never came is forgotten oldest first)."""

_STRIP_ASSIGNED = InjectionPlan(devices=(), env={}, annotations={}, remove_annotations=(ASSIGNED,))


class Lifecycle:
    """Create, start and release shares in `table`; `devices`: the host's
    device nodes, for the plan; `library_check`: whether the interposer's
    file is on the node (None: taken as present)."""

    def __init__(
        self, table: ShareTable, devices: DeviceLookup, library_check: LibraryCheck | None
    ) -> None:
        self.table = table
        self.devices = devices
        self.library_check = library_check

    async def create_container(
        self,
        c: ContainerInfo,
        *,
        origin: Origin = "",
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
            self.table.decisions.refused_container(c, e.reason, str(e), where)
            raise

    async def _create(
        self, c: ContainerInfo, origin: Origin, namespace: str, gpus: tuple[int, ...] | None
    ) -> InjectionPlan | None:
        table = self.table
        who = c.describe()
        if c.id in table.creating:
            raise ShareRefused(f"gpushare: {who} is already being created", "conflict")
        if (held := table.allocations.get(c.id)) is not None:  # asked again: same answer
            return self._again(c, held, origin, namespace)
        if not may_ask(c):  # nothing of ours: nothing to parse, log or remember
            return None
        self._seen_in_pod(c)
        if (uid := c.env.get(DRA_CLAIM_ENV)) is not None:
            return await self._create_claimed(c, uid, origin, namespace)
        if not_allowed := ignored(c, table.policy.sources_for(c)):
            log.warning(
                "%s: ignoring %s: this node does not take share requests from there "
                "(node config `sources`)",
                who,
                ", ".join(not_allowed),
            )
        forged = ASSIGNED in c.annotations
        if forged:
            log.warning("%s: ignoring the %s it carries: only the plugin writes it", who, ASSIGNED)
        req = parse_request(c, table.gpus, table.policy)
        if req is None:
            return _STRIP_ASSIGNED if forged else None
        if gpus is not None:
            req = _on_given_gpus(req, gpus, who)
        return await self._place(c, req, origin, namespace)

    async def _create_claimed(
        self, c: ContainerInfo, uid: str, origin: Origin, namespace: str
    ) -> InjectionPlan:
        """`c` carries a prepared DRA claim's variable: it takes the claim's
        booking (`claims.take`) and is given exactly the claim's share."""
        claims = self.table.claims
        claim = claims.take(c, uid, bool(origin))
        try:
            return await self._place(c, claim_request(claim, self.table.policy), "", "", uid)
        except BaseException:
            claims.give_back(uid, c.id)
            raise

    async def _place(
        self, c: ContainerInfo, req: ShareRequest, origin: Origin, namespace: str, claim: str = ""
    ) -> InjectionPlan:
        """Place, register and record `req` for `c`; its plan."""
        table = self.table
        who = c.describe()
        if origin == "cdi" and req.isolation != "none" and table.link.mode == "off":
            raise ShareRefused(_cdi_needs_module(who, "kmod: off"), "kmod")
        shares = table.ledger.place(req, who)  # reserves nothing yet
        alloc = Allocation(
            c.id,
            c.name,
            c.pod,
            shares,
            req.priority,
            req.isolation,
            self._interposer_for(req, who),
            origin,
            namespace,
            req.kubelet,
            claim=claim,
        )
        registered = await self._reserve_and_register(alloc, who)
        if origin == "cdi" and req.isolation != "none" and not registered:
            # The CDI hook cannot hand the container its quota in the environment:
            # only the module can tell the interposer.
            await self._undo(alloc, table.generation, registered)
            problem = table.link.problem or "did not register it"
            raise ShareRefused(_cdi_needs_module(who, f"the kernel module {problem}"), "kmod")
        if origin:
            table.local[c.id] = LocalState(c.pid, time.time(), c.cgroups_path)
        try:
            table.journal.append(records.added(alloc))
        except OSError as e:
            await self._undo(alloc, table.generation, registered)
            raise ShareRefused(
                f"gpushare: cannot create {who}: its allocation cannot be recorded "
                f"({e}); the node's state directory needs attention",
                "state",
            ) from None  # the message carries the OSError's text
        self._check_memory_dev(req, alloc, c)
        table.decisions.placed(alloc)
        return self.plan(alloc, c)

    def _again(
        self, c: ContainerInfo, held: Allocation, origin: Origin, namespace: str
    ) -> InjectionPlan:
        """A container that holds a share asked again: the same answer, or a
        refusal when the ID is another namespace's or another path's."""
        if (held.origin, held.namespace) != (origin, namespace):
            if held.namespace == namespace and held.local and origin:
                why = "give a container gpushare-runc or a gpushare.io/gpu CDI device, not both"
            else:
                why = "container IDs must be unique across containerd namespaces"
            raise ShareRefused(
                f"gpushare: cannot create {c.describe()}: container ID {quote(c.id)} already "
                f"holds a share on this node (asked through {held.where}); {why}",
                "conflict",
            )
        if (state := self.table.local.get(c.id)) is not None:
            state.since = time.time()  # a new incarnation: the reconciler's grace again
        return self.plan(held, c)

    def _seen_in_pod(self, c: ContainerInfo) -> None:
        """Remember the container's name in its pod, for the warning at its stop."""
        if c.pod_uid:
            seen = self.table.pod_containers
            seen.setdefault(c.pod_uid, set()).add(c.name)
            while len(seen) > MAX_PODS_REMEMBERED:  # a stop never came
                del seen[next(iter(seen))]

    async def _reserve_and_register(self, alloc: Allocation, who: str) -> bool:
        """Reserve `alloc` in the ledger and register it with the module;
        whether the module holds it.  Raises (leaving nothing reserved) when
        the module refused or it was released meanwhile."""
        table, cid = self.table, alloc.container_id
        # Reserved before the module is asked: what is placed meanwhile sees it.
        table.ledger.add(alloc)
        table.allocations[cid] = alloc
        generation = table.generation
        table.creating.add(cid)
        try:
            registered = await table.link.register(alloc, who)
        except BaseException:
            # Refused, cancelled (the runtime went away) or a bug: nothing stays reserved.
            self._drop(alloc, generation)
            raise
        finally:
            table.creating.discard(cid)
        if generation != table.generation or table.allocations.get(cid) is not alloc:
            # Released, or the table was rebuilt, while the module answered.
            await self._undo(alloc, generation, registered)
            raise ShareRefused(
                f"gpushare: cannot create {who}: it was released while the kernel module "
                f"registered it",
                "conflict",
            )
        return registered

    def _interposer_for(self, req: ShareRequest, who: str) -> bool:
        """Whether the share gets the interposer; ShareRefused when it needs the
        library, the node lacks it and interposer.missing is refuse."""
        policy = self.table.policy.interposer
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

    async def readopt(self, c: ContainerInfo) -> bool:
        """Give `c` back the share a Synchronize dropped because containerd did
        not list it yet (placed just before the plugin reconnected), when it
        carries exactly what its record says it was given and the room is
        still free; True when it holds it again.  Otherwise it stays unserved."""
        table = self.table
        record = table.forgotten.pop(c.id, None)
        if record is None or table.holds(c.id):
            return False
        alloc = records.recover(c, record, None, table.gpus)
        if alloc is None:
            return False
        who = c.describe()
        if alloc.claim:
            return await self._readopt_claimed(c, alloc, who)
        high = alloc.high_priority
        if taken := [
            str(s.index)
            for s in alloc.shares
            if table.ledger.shortfalls(s.index, s.memory_bytes, s.core_percent, high)
        ]:
            log.warning(
                "%s: placed before the plugin reconnected, not in containerd's list then; "
                "its share on GPU %s was taken meanwhile, so it runs without one",
                who,
                ",".join(taken),
            )
            return False
        try:
            await self._reserve_and_register(alloc, who)
        except ShareRefused as e:
            log.warning("%s: its recorded share cannot be given back: %s", who, e)
            return False
        table.journal.or_log(lambda: table.journal.append(records.added(alloc)))
        log.info(
            "%s: placed before the plugin reconnected, not in containerd's list then: "
            "its recorded share is given back",
            who,
        )
        table.decisions.placed(alloc)
        return True

    async def _readopt_claimed(self, c: ContainerInfo, alloc: Allocation, who: str) -> bool:
        """`readopt` of a claim's share: the claim's booking is handed back to
        the container (`claims.take`), as at its create."""
        claims = self.table.claims
        try:
            claim = claims.take(c, alloc.claim, False)
            if claim.shares != alloc.shares:
                raise ShareRefused(f"{claim.describe()} is prepared with another share", "claim")
            await self._reserve_and_register(alloc, who)
        except ShareRefused as e:
            claims.give_back(alloc.claim, c.id)
            log.warning("%s: its recorded share (DRA claim) cannot be given back: %s", who, e)
            return False
        except BaseException:
            claims.give_back(alloc.claim, c.id)
            raise
        self.table.journal.or_log(lambda: self.table.journal.append(records.added(alloc)))
        log.info("%s: placed before the plugin reconnected: its DRA claim's share is back", who)
        self.table.decisions.placed(alloc)
        return True

    async def start_container(self, c: ContainerInfo) -> None:
        """Bind the registration to the container's cgroup, which now exists,
        and set the driver's memory limits on it.

        A failure is logged; with kmod: required a failed bind raises ShareRefused.
        """
        table = self.table
        await table.link.bind(c)
        alloc = table.allocations.get(c.id)
        while alloc is not None:
            await table.limits.apply(alloc, c.cgroups_path, c.describe())
            now = table.allocations.get(c.id)
            if now is None:  # released meanwhile
                await table.limits.clear(c.id)
            alloc = None if now is alloc else now  # resized meanwhile: its new limits

    async def release(self, container_id: str, why: str = "released") -> bool:
        """Unregister and free the container's shares (Stop and Remove); idempotent.

        True when this call freed an allocation (and logged it, saying `why`).
        """
        table = self.table
        alloc = table.allocations.pop(container_id, None)
        table.unserved.pop(container_id, None)
        table.local.pop(container_id, None)
        table.forgotten.pop(container_id, None)
        if alloc is not None:
            table.unbook(alloc)
            if alloc.claim:
                table.claims.give_back(alloc.claim, container_id)
            table.decisions.released(alloc, why)
            table.journal.or_log(lambda: table.journal.append(records.removed(container_id)))
        await table.link.release(container_id)
        await table.limits.clear(container_id)
        return alloc is not None

    def pod_stopped(self, uid: str, pod: str, annotations: Mapping[str, str]) -> None:
        """Pod `pod` ("namespace/name") stopped: warn about its per-container
        keys that named no container of it."""
        seen = self.table.pod_containers.pop(uid, set())
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

    def plan(self, alloc: Allocation, c: ContainerInfo) -> InjectionPlan:
        """What `alloc`'s container is given (`c`: its environment)."""
        table = self.table
        registered = alloc.container_id in table.link.registered
        return injection_plan(
            alloc, table.by_index, self.devices, registered, table.policy.interposer, c.env
        )

    async def _undo(self, alloc: Allocation, generation: int, registered: bool) -> None:
        """Take back a share that will not be given: reservation and registration."""
        self._drop(alloc, generation)
        if registered:
            await self.table.link.release(alloc.container_id)

    def _drop(self, alloc: Allocation, generation: int) -> None:
        """Free a reservation that did not become an allocation."""
        table = self.table
        if generation == table.generation and table.allocations.get(alloc.container_id) is alloc:
            del table.allocations[alloc.container_id]
            table.ledger.remove(alloc)

    def _check_memory_dev(self, req: ShareRequest, alloc: Allocation, c: ContainerInfo) -> None:
        if req.memory_dev_bytes is None:
            return
        for s in alloc.shares:
            total = self.table.by_index[s.index].memory_bytes
            if abs(total - req.memory_dev_bytes) >= GiB:
                log.warning(
                    "%s: ALIYUN_COM_GPU_MEM_DEV=%d GiB but GPU %d has %.1f GiB (informative only)",
                    c.describe(),
                    req.memory_dev_bytes // GiB,
                    s.index,
                    total / GiB,
                )
