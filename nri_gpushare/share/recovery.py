"""Rebuilding the table from what the plugin and the kernel module wrote
(`records`), never from anything a container carries: at NRI's Synchronize
(the live containers) and after a daemon restart (the shares asked for
outside NRI, which Synchronize does not list)."""

from __future__ import annotations

import dataclasses
import logging
import time
import types
from collections.abc import Generator, Sequence

from nri_gpushare.share import records
from nri_gpushare.share.kernel import KmodError, Registration
from nri_gpushare.share.local_shares import LocalShares
from nri_gpushare.share.model import Allocation, ContainerInfo
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.request import may_ask
from nri_gpushare.share.request.kubelet import recorded_ids
from nri_gpushare.share.request.sources import kubelet_allowed
from nri_gpushare.share.table import LocalState, ShareTable
from nri_gpushare.share.unserved import UnservedWatch

log = logging.getLogger(__name__)

FORGOTTEN_KEPT = 256
"""Records dropped at a Synchronize kept for `Lifecycle.readopt` (the latest)."""
RESIZE_WAIT = 1.0
"""Seconds a Synchronize waits for the resizes in flight (a resize takes
milliseconds; containerd's Synchronize allows 5 s in all)."""


@types.coroutine
def _next_turn() -> Generator[None, None, None]:
    """One turn of the event loop to the other tasks (a bare yield: what
    asyncio.sleep(0) does, without importing the loop)."""
    yield


class Recovery:
    def __init__(self, table: ShareTable, unserved: UnservedWatch, local: LocalShares) -> None:
        self.table = table
        self.unserved = unserved
        self.local = local

    async def synchronize(self, live: Sequence[ContainerInfo]) -> None:
        """Rebuild everything from the live containers, the daemon's records and
        the module's registry, and find the containers that run without the
        share they asked for (`unserved`).

        Registrations without a live container are removed; live shares the
        module lost are registered again.  Live shares are recorded even when
        they no longer fit (a smaller reserve or inventory): they exist, so
        nothing new is placed on top of them.  A bad record or container is
        logged and treated as absent: this never raises for what it reads.
        The registry is read once no resize is being written (`_registrations`)."""
        table = self.table
        live = list({c.id: c for c in live}.values())  # one entry per container
        module = await self._registrations()
        text = table.store.load()
        saved = records.decode(text, table.gpus) if text is not None else {}
        # From here to resync nothing is awaited: the table is replaced at once.
        # Shares asked for outside NRI are not in `live`: they are kept as they are.
        kept = {cid: a for cid, a in table.allocations.items() if a.local}
        table.generation += 1
        table.ledger = Ledger(table.gpus, table.policy)
        table.allocations = {}
        table.link.forget()
        table.limits.forget()
        table.pod_containers = {}
        for cid, held in kept.items():
            table.ledger.add(held)
            table.allocations[cid] = held
        for c in live:
            if c.id in kept:
                log.warning(
                    "%s: its ID is held by a container asked for through %s; not recovered",
                    c.describe(),
                    kept[c.id].where,
                )
                continue
            if c.pod_uid and may_ask(c):  # only a pod of ours is warned about at its stop
                table.pod_containers.setdefault(c.pod_uid, set()).add(c.name)
            if c.id not in saved and (module is None or c.id not in module):
                continue  # nothing recorded for it: `recover` would find nothing
            try:
                alloc = records.recover(c, saved.get(c.id), (module or {}).get(c.id), table.gpus)
                if alloc is None:
                    continue
                if not alloc.claim and (uid := table.claims.claimed_by(c)):
                    alloc = dataclasses.replace(alloc, claim=uid)  # the module keeps no claim
                if not alloc.kubelet and kubelet_allowed(c, table.policy.sources_for(c)):
                    # The module keeps no device IDs: the container still carries them.
                    alloc = dataclasses.replace(alloc, kubelet=recorded_ids(c))
                for note in table.ledger.add(alloc):
                    log.warning("%s: recovered share: %s", c.describe(), note)
            except Exception:
                log.exception("%s: cannot recover its share; treated as having none", c.describe())
                continue
            table.allocations[c.id] = alloc
        table.claims.rebuild()
        if forgotten := sorted(set(saved) - set(table.allocations)):
            log.info("records of %d container(s) that are gone dropped", len(forgotten))
            for cid in forgotten:
                table.decisions.released(saved[cid], "gone: no live container at synchronize")
        keep_latest(
            table.forgotten,
            {cid: saved[cid] for cid in forgotten if not saved[cid].local},
            {c.id for c in live},
        )
        table.journal.or_log(table.journal.rewrite)
        self.unserved.find(live)
        recovered = dict(table.allocations)
        running = {c.id: c for c in live} | self.local.containers()
        await table.link.resync(
            module, recovered, {cid: c.cgroups_path for cid, c in running.items()}
        )
        dropped = {cid: saved[cid] for cid in forgotten if not saved[cid].local}
        await table.limits.resync(recovered, running, dropped)

    async def _registrations(self) -> dict[str, Registration] | None:
        """The module's registry read with no resize in flight: a multi-GPU
        resize writes GPU by GPU, so a registry read between two writes holds
        half of it (and the resize, seeing the table rebuilt, undoes nothing).
        Waits at most `RESIZE_WAIT` seconds, then reads it as it is."""
        table = self.table
        deadline = time.monotonic() + RESIZE_WAIT
        while True:
            if table.resizing and time.monotonic() < deadline:
                await _next_turn()  # the resize goes on
                if table.resizing and table.link.kmod is not None:
                    # The module's requests run in order: this lands after the
                    # resize's write queued before it (a wait, not a spin).
                    try:
                        await table.link.kmod.loaded()
                    except KmodError:
                        deadline = 0.0  # not answering: the resize fails too
                continue
            module = await table.link.registrations()
            if not table.resizing or time.monotonic() >= deadline:
                if table.resizing:
                    log.warning("synchronize: resizes still in flight after %.1f s", RESIZE_WAIT)
                return module

    async def recover_local(self) -> None:
        """After a daemon restart: take back the shares asked for outside NRI
        from the daemon's records, checked against the module's registry (its
        registration wins; a share it lost is registered again).  Whether each
        container still exists is for the containerd reconciler to say.
        Never raises for what it reads."""
        table = self.table
        text = table.store.load()
        saved = records.decode(text, table.gpus) if text is not None else {}
        wanted = {cid: a for cid, a in saved.items() if a.local and cid not in table.allocations}
        if not wanted:
            return
        module = await table.link.registrations()
        for cid, alloc in wanted.items():
            c = ContainerInfo(id=cid, name=alloc.name)
            alloc = records.module_wins(c, alloc, (module or {}).get(cid), table.gpus)
            try:
                for note in table.ledger.add(alloc):
                    log.warning("container %s: recovered share: %s", cid, note)
            except Exception:
                log.exception("container %s: cannot recover its share", cid)
                continue
            table.allocations[cid] = alloc
            table.local[cid] = LocalState()
            log.info(
                "container %s/%s: recovered %s (asked through %s)",
                alloc.namespace,
                cid,
                alloc.describe_shares(),
                alloc.origin,
            )
        recovered = {cid: table.allocations[cid] for cid in wanted if cid in table.allocations}
        if module is not None:
            for cid, alloc in recovered.items():
                if alloc.isolation == "none":
                    continue
                registration = module.get(cid)
                if registration is None or not await table.link.keep(alloc, registration):
                    await table.link.register(alloc, f"container {cid}")


def keep_latest(
    kept: dict[str, Allocation], dropped: dict[str, Allocation], live: set[str]
) -> None:
    """Add `dropped` to `kept`, forget the IDs now `live` (a Synchronize
    listed them: it decided), and keep the latest `FORGOTTEN_KEPT`."""
    for cid in live & kept.keys():
        del kept[cid]
    for cid, record in dropped.items():
        kept.pop(cid, None)
        kept[cid] = record  # the latest last
    while len(kept) > FORGOTTEN_KEPT:
        del kept[next(iter(kept))]
