"""The share domain's link to the kernel module: modes, GPU declaration,
registration, retries, re-registration after a module reload.

Modes (NodePolicy.kmod_mode):

- required: a share is refused unless the module is loaded and registers it.
- optional: the module is used when loaded; without it shares are placed and
  injected and a warning says that isolation is not enforced.  A module that is
  loaded and refuses a registration refuses the share.
- off: the module is never used.

Isolation ``none`` shares are never registered; ``memory`` shares are
registered without a compute limit.

The module is reached through the awaited `KernelModule` interface; a request
that times out may still reach the module later, so a registration that timed
out is unregistered again (queued behind it), and unregistrations that fail
are retried on the container's next release.

While the module is being upgraded (`nri-gpushare kmod-upgrade`: frozen, then
briefly not loaded) the registry it hands over must stay what the daemon
means: an unregistration or a bind that meets the upgrade is kept and done
once the module answers again (at the next use of the link: `ready()`), never
dropped, so a container released meanwhile is not left registered in the new
version and one started meanwhile gets its binding there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from nri_gpushare.share.kernel import (
    AlreadyRegistered,
    GpuDeclaration,
    GpuQuota,
    GpusNotDeclared,
    KernelModule,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    Registration,
    UpgradeInProgress,
)
from nri_gpushare.share.model import Allocation, ContainerInfo, Gpu, ShareRefused

log = logging.getLogger(__name__)


def quotas(alloc: Allocation) -> tuple[GpuQuota, ...]:
    """What the module is told about an allocation (no compute limit unless full)."""
    full = alloc.isolation == "full"
    return tuple(
        GpuQuota(s.index, s.memory_bytes, s.core_percent if full else 0, alloc.high_priority)
        for s in alloc.shares
    )


def registered_as(alloc: Allocation, registration: Registration) -> bool:
    """Whether the module holds exactly the quotas `alloc` means (in any order)."""

    def by_gpu(qs: Sequence[GpuQuota]) -> list[GpuQuota]:
        return sorted(qs, key=lambda q: q.gpu_index)

    return by_gpu(registration.quotas) == by_gpu(quotas(alloc))


class KernelLink:
    def __init__(self, gpus: Sequence[Gpu], mode: str, kmod: KernelModule | None) -> None:
        self.gpus = list(gpus)
        self.mode = mode
        self.kmod = kmod if mode != "off" else None
        self.registered: set[str] = set()  # container IDs registered by this link
        self._unregister_later: set[str] = set()  # unregistrations that failed
        # What an upgrade (or the module's absence) held up, done in ready():
        self._unregister_pending: set[str] = set()  # unregistrations of released IDs
        self._bind_later: dict[str, str] = {}  # binds: container ID -> cgroups path
        self.loaded = False
        self._declared = False
        #: Why the module cannot be used, for messages ("is not loaded", ...).
        self.problem = "is not loaded"
        self._advice = "load gpushare.ko or set kmod: optional in the node config"

    def state(self) -> dict[str, Any]:
        """The module as the status document shows it."""
        return {
            "mode": self.mode,
            "loaded": self.loaded,
            "problem": "" if self.loaded else self.problem,
        }

    async def start(self) -> None:
        """Look for the module once and say what that means for isolation."""
        if self.mode == "off":
            log.warning("kmod: off: GPU shares are placed and injected, isolation is not enforced")
        elif await self.ready():
            log.info("gpushare kernel module loaded: isolation is enforced")
        elif self.mode == "optional":
            log.warning(
                "gpushare kernel module %s (kmod: optional): GPU shares are placed "
                "and injected, isolation is not enforced",
                self.problem,
            )
        else:
            log.error(
                "gpushare kernel module %s (kmod: required): shares will be refused", self.problem
            )

    async def ready(self) -> bool:
        """Whether the module can be used now; declares the GPUs when it (re)appears."""
        if self.kmod is None:
            return False
        try:
            loaded = await self.kmod.loaded()
        except KmodError as e:
            self.loaded = False
            self.problem = f"is not answering ({e})"
            self._advice = "see dmesg, or set kmod: optional in the node config"
            return False
        self._advice = "load gpushare.ko or set kmod: optional in the node config"
        if not loaded:
            if self.loaded:
                log.warning("gpushare kernel module no longer loaded")
            self.loaded = self._declared = False
            self.problem = "is not loaded"
            return False
        if not self._declared:
            try:
                await self.kmod.declare_gpus(
                    [GpuDeclaration(g.index, g.memory_bytes) for g in self.gpus]
                )
            except UpgradeInProgress:
                self.loaded = False
                self.problem = "is being upgraded (nri-gpushare kmod-upgrade)"
                self._advice = "try again once the upgrade is done"
                return False
            except KmodError as e:
                self.loaded = False
                self.problem = f"is loaded but refused this node's GPU list: {e}"
                log.error("gpushare kernel module %s", self.problem)
                return False
            self._declared = True
        self.loaded = True
        self.problem = ""
        if self._bind_later or self._unregister_pending:
            await self._retry_held_up()
        return True

    async def _retry_held_up(self) -> None:
        """The unregistrations and binds that failed while the module was
        being upgraded or away, once it answers again."""
        assert self.kmod is not None
        for cid in sorted(self._unregister_pending):
            self._unregister_pending.discard(cid)
            await self.unregister(cid)  # pending again if the upgrade is still going on
        for cid, path in sorted(self._bind_later.items()):
            if cid not in self.registered:
                self._bind_later.pop(cid, None)  # another task may be here too
                continue
            try:
                await self.kmod.bind_cgroup(cid, path)
            except (UpgradeInProgress, ModuleNotLoaded):
                return  # still going on: the next call tries again
            except KmodError as e:
                log.warning("container %s: cannot bind cgroup %s: %s", cid, path, e)
            else:
                log.info("container %s: bound to cgroup %s after the module upgrade", cid, path)
            self._bind_later.pop(cid, None)

    async def catch_up(self) -> None:
        """Land what an upgrade held up without waiting for the next container
        event (the daemon calls this every few seconds)."""
        if self.kmod is not None and (self._bind_later or self._unregister_pending):
            await self.ready()

    # -- a container's registration ------------------------------------------------------

    async def register(self, alloc: Allocation, who: str) -> bool:
        """Register a new share; False when it goes unenforced.  Raises ShareRefused."""
        if alloc.isolation == "none" or self.mode == "off":
            return False
        required = self.mode == "required"
        if not await self.ready():
            if required:
                raise ShareRefused(
                    f"gpushare: cannot create {who}: the gpushare kernel module "
                    f"{self.problem} and this node requires it (kmod: required); {self._advice}",
                    "kmod",
                )
            log.warning(
                "%s: kernel module %s (kmod: optional): isolation is not enforced",
                who,
                self.problem,
            )
            return False
        registration = Registration(alloc.container_id, quotas(alloc))
        try:
            await self._register(registration, who)
        except ModuleNotLoaded:
            self.loaded = self._declared = False
            if required:
                raise ShareRefused(
                    f"gpushare: cannot create {who}: the gpushare kernel module went away "
                    f"(kmod: required); load gpushare.ko",
                    "kmod",
                ) from None
            log.warning("%s: kernel module unloaded: isolation is not enforced", who)
            return False
        except KmodError as e:
            # A write that timed out may still land: never leave it behind.
            await self.unregister(alloc.container_id)
            raise ShareRefused(
                f"gpushare: cannot create {who}: the gpushare kernel module refused "
                f"{alloc.describe_shares()}: {e} (errno {e.errno}); compare "
                f"'nri-gpushare status' with the module's registrations",
                "kmod",
            ) from None
        except Exception:
            # Not the module's answer (a client bug): the write may still have landed.
            await self.unregister(alloc.container_id)
            raise
        except BaseException:
            # Cancelled: the request may still reach the module; the next release undoes it.
            self._unregister_later.add(alloc.container_id)
            raise
        self.registered.add(alloc.container_id)
        self._unregister_pending.discard(alloc.container_id)  # registered anew: keep it
        return True

    async def _register(self, registration: Registration, who: str) -> None:
        assert self.kmod is not None
        try:
            await self.kmod.register(registration)
        except AlreadyRegistered:
            # A stale registration of an ID this service does not hold: replace it.
            log.warning("%s: replacing a stale kernel-module registration", who)
            await self.unregister(registration.container_id)
            await self.kmod.register(registration)
        except GpusNotDeclared:
            # The module was reloaded since we declared the GPUs: declare them again.
            self._declared = False
            if not await self.ready():
                raise
            await self.kmod.register(registration)

    async def bind(self, c: ContainerInfo) -> None:
        """Bind the registration to the container's cgroup, which now exists.

        A failure is logged; with kmod: required it raises ShareRefused.
        """
        if c.id not in self.registered or not c.cgroups_path or self.kmod is None:
            return
        try:
            await self.kmod.bind_cgroup(c.id, c.cgroups_path)
        except (UpgradeInProgress, ModuleNotLoaded) as e:
            # The registration moves to the next version; so will its binding.
            self._bind_later[c.id] = c.cgroups_path
            log.warning("%s: binding held up until the module answers again: %s", c.describe(), e)
        except KmodError as e:
            message = (
                f"gpushare: {c.describe()}: the kernel module could not bind cgroup "
                f"{c.cgroups_path}: {e}"
            )
            if self.mode == "required":
                raise ShareRefused(message, "kmod") from None
            log.warning("%s; compute isolation may not apply", message)

    async def release(self, container_id: str) -> None:
        """Unregister the container if this link registered it (idempotent)."""
        self._bind_later.pop(container_id, None)
        if container_id in self.registered or container_id in self._unregister_later:
            self.registered.discard(container_id)
            await self.unregister(container_id)

    async def unregister(self, cid: str) -> None:
        if self.kmod is None:
            return
        try:
            await self.kmod.unregister(cid)
        except NotRegistered:
            pass
        except (UpgradeInProgress, ModuleNotLoaded):
            # Being upgraded (or away): its registry may come back; done then.
            self._unregister_pending.add(cid)
            self._unregister_later.discard(cid)
            return
        except KmodError as e:
            log.error("container %s: kernel module unregistration failed: %s", cid, e)
            self._unregister_later.add(cid)
            return
        self._unregister_later.discard(cid)

    # -- after a restart -------------------------------------------------------------------

    async def registrations(self) -> dict[str, Registration] | None:
        """The module's registry by container ID; None when the module cannot be used."""
        if not await self.ready():
            return None
        assert self.kmod is not None
        try:
            return {r.container_id: r for r in await self.kmod.registrations()}
        except KmodError as e:
            log.error("cannot read the kernel module's registrations: %s", e)
            return None

    def forget(self) -> None:
        """Nothing registered as far as this link knows (a new table follows)."""
        self.registered = set()
        self._unregister_later = set()
        self._unregister_pending = set()
        self._bind_later = {}

    async def resync(
        self,
        module: Mapping[str, Registration] | None,
        allocations: Mapping[str, Allocation],
        cgroups: Mapping[str, str],
    ) -> None:
        """Make the module hold exactly the live `allocations` (after `forget`):
        registrations without a live share are removed, differing ones written
        in place (`keep`), lost ones registered again and bound to `cgroups`
        (container ID -> path)."""
        if module is None:
            # Whether the module holds them is unknown (it did not answer, or is
            # not loaded): each release still unregisters, so none is left behind.
            if self.kmod is not None:
                self._unregister_later.update(
                    cid for cid, alloc in allocations.items() if alloc.isolation != "none"
                )
            return
        for cid, reg in module.items():
            alloc = allocations.get(cid)
            if alloc is None or alloc.isolation == "none":
                log.info("container %s: gone; removing its kernel-module registration", cid)
                await self.unregister(cid)
            else:
                await self.keep(alloc, reg)
        for cid, alloc in allocations.items():
            if alloc.isolation != "none" and cid not in self.registered:
                await self._reregister(alloc, cgroups.get(cid, ""))

    async def keep(self, alloc: Allocation, registration: Registration) -> bool:
        """A live share the module holds as `registration`: True when it stays
        registered, its quotas written in place where they differ (never
        unregistered: its processes' reservations would be orphaned); False
        when the registration names other GPUs, or vanished, and was removed
        (to be registered again)."""
        cid = alloc.container_id
        held = {q.gpu_index: q for q in registration.quotas}
        wanted = quotas(alloc)
        if sorted(held) != sorted(q.gpu_index for q in wanted):
            log.warning("container %s: registered on other GPUs; registering again", cid)
            await self.unregister(cid)
            return False
        assert self.kmod is not None
        for q in wanted:
            if held[q.gpu_index] == q:
                continue
            log.warning("container %s: module quota on GPU %d differs; written", cid, q.gpu_index)
            try:
                await self.kmod.update_quota(cid, q)
            except NotRegistered:
                return False
            except KmodError as e:
                log.error(
                    "container %s: cannot write its quota on GPU %d (%s); the module keeps %s; "
                    "compare 'nri-gpushare status' with /proc/gpushare",
                    cid,
                    q.gpu_index,
                    e,
                    held[q.gpu_index],
                )
        self.registered.add(cid)
        return True

    async def _reregister(self, alloc: Allocation, cgroups_path: str) -> None:
        assert self.kmod is not None
        cid = alloc.container_id
        try:
            await self.kmod.register(Registration(cid, quotas(alloc)))
        except KmodError as e:
            log.error("container %s: cannot register its live share again: %s", cid, e)
            return
        self.registered.add(cid)
        log.info("container %s: registered its live share again", cid)
        if cgroups_path:
            try:
                await self.kmod.bind_cgroup(cid, cgroups_path)
            except KmodError as e:
                log.warning("container %s: cannot bind cgroup %s: %s", cid, cgroups_path, e)
