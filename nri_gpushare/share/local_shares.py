"""Shares of containers NRI never sees (ctr, nerdctl, docker), asked for
through the local API by the CDI hook or gpushare-runc: their start, their
release, and the containerd reconciler's view of them.  They are created by
`Lifecycle.create_container` (with an origin) like every other share, and
held in the same table; what NRI does not tell about them (their process,
their cgroup) is kept in `table.local`."""

from __future__ import annotations

import logging

from nri_gpushare.share.lifecycle import Lifecycle
from nri_gpushare.share.model import Allocation, ContainerInfo, LocalRef
from nri_gpushare.share.table import ShareTable
from nri_gpushare.units import quote

log = logging.getLogger(__name__)


class LocalShares:
    def __init__(self, table: ShareTable, lifecycle: Lifecycle) -> None:
        self.table = table
        self.lifecycle = lifecycle

    def _alloc(self, namespace: str, container_id: str) -> Allocation | None:
        alloc = self.table.allocations.get(container_id)
        if alloc is None or not alloc.local or alloc.namespace != namespace:
            return None
        return alloc

    async def start_local(self, namespace: str, container_id: str, pid: int) -> bool:
        """The local container's first process `pid` exists: bind its
        registration to its cgroup and set the driver's limits.  False when no
        local share of that namespace and ID is held."""
        alloc = self._alloc(namespace, container_id)
        state = self.table.local.get(container_id)
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
        await self.lifecycle.start_container(c)
        return True

    async def adopt_local(
        self, namespace: str, container_id: str, pid: int, cgroups_path: str
    ) -> bool:
        """A local share whose start the daemon never heard (recovered after a
        restart that fell between the container's create and its start):
        containerd runs its first process `pid` in `cgroups_path`.  Bind and
        limit it as start_local would.  False when no such share waits for
        its process (unknown, or its pid is known already)."""
        alloc = self._alloc(namespace, container_id)
        state = self.table.local.get(container_id)
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
            await self.lifecycle.start_container(c)
        except BaseException:
            if self.table.local.get(container_id) is state:  # not bound: the next pass tries again
                state.pid, state.cgroups_path = 0, ""
            raise
        return True

    async def release_local(self, namespace: str, container_id: str, why: str) -> bool:
        """Release a share asked for outside NRI (never an NRI one); True when
        one was freed."""
        if self._alloc(namespace, container_id) is None:
            return False
        return await self.lifecycle.release(container_id, why)

    def local_allocations(self) -> list[LocalRef]:
        """The local allocations, for the containerd reconciler."""
        table = self.table
        return [
            LocalRef(a.namespace, cid, state.pid, state.since)
            for cid, a in table.allocations.items()
            if a.local and (state := table.local.get(cid)) is not None
        ]

    def containers(self) -> dict[str, ContainerInfo]:
        """The local allocations as containers (for the module's and limits' resync)."""
        out = {}
        for cid, state in self.table.local.items():
            alloc = self.table.allocations.get(cid)
            if alloc is not None:
                out[cid] = ContainerInfo(
                    id=cid, name=alloc.name, cgroups_path=state.cgroups_path, pid=state.pid
                )
        return out
