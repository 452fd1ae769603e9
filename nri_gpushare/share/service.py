"""The share service: the one object the daemon drives.

create_container validates (nothing reserved), places (all-or-nothing),
registers with the kernel module (a refused registration leaves nothing
reserved) and answers with an injection plan.  release undoes it and is
idempotent.  synchronize rebuilds the table after a plugin restart from the
live containers' ``gpushare.io/assigned`` annotations and the module's
registry.  Synchronous and fast: the daemon calls it from its event loop.

Kernel-module modes (NodePolicy.kmod_mode):

- required: a share is refused unless the module is loaded and registers it.
- optional: the module is used when loaded; without it shares are placed and
  injected and a warning says that isolation is not enforced.  A module that is
  loaded and refuses a registration refuses the share.
- off: the module is never used.

Isolation ``none`` shares are accounted and injected but never registered;
``memory`` shares are registered without a compute limit.

Injected environment: NVIDIA_VISIBLE_DEVICES and GPUSHARE_GPU_UUIDS (UUIDs in
the container's GPU order), GPUSHARE_MEMORY_LIMIT (bytes per GPU),
GPUSHARE_CORE_LIMIT (percent per GPU, 0 for a GPU without a limit; absent when
no GPU has one or isolation is memory), GPUSHARE_PRIORITY (normal|high),
GPUSHARE_ISOLATION (full|memory|none).  The quota variables are also given with
isolation none, for applications that isolate themselves.

``gpushare.io/assigned`` (compact JSON, keys sorted)::

    {"gpus": [{"core": 30, "index": 0, "memory": 2147483648, "uuid": "GPU-..."}],
     "isolation": "full", "priority": "normal", "version": 1}
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..kmod.client import (
    AlreadyRegistered,
    GpuDeclaration,
    GpuQuota,
    KernelModuleClient,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
    Registration,
)
from .devices import DeviceLookup
from .model import (
    ASSIGNED,
    ISOLATIONS,
    PRIORITIES,
    Allocation,
    ContainerInfo,
    GiB,
    Gpu,
    GpuShare,
    InjectionPlan,
    NodePolicy,
    ShareRefused,
    format_bytes,
)
from .placement import Ledger
from .request import ShareRequest, parse_request

log = logging.getLogger(__name__)

ASSIGNED_VERSION = 1


class ShareService:
    def __init__(
        self,
        gpus: Sequence[Gpu],
        policy: NodePolicy,
        kmod: KernelModuleClient | None,
        devices: DeviceLookup,
    ) -> None:
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_index = {g.index: g for g in self.gpus}
        self.by_uuid = {g.uuid: g for g in self.gpus}
        self.policy = policy
        self.kmod = kmod if policy.kmod_mode != "off" else None
        self.devices = devices
        self.ledger = Ledger(self.gpus, policy)
        self.allocations: dict[str, Allocation] = {}
        self.registered: set[str] = set()  # container IDs this service registered
        self._unregister_later: set[str] = set()  # unregistrations that failed
        self._loaded = False
        self._declared = False
        #: Why the module cannot be used, for messages ("is not loaded", ...).
        self.kmod_problem = "is not loaded"
        if policy.kmod_mode == "off":
            log.warning("kmod: off: GPU shares are placed and injected, isolation is not enforced")
        elif self._kmod_ready():
            log.info("gpushare kernel module loaded: isolation is enforced")
        elif policy.kmod_mode == "optional":
            log.warning(
                "gpushare kernel module %s (kmod: optional): GPU shares are placed "
                "and injected, isolation is not enforced",
                self.kmod_problem,
            )
        else:
            log.error(
                "gpushare kernel module %s (kmod: required): shares will be refused",
                self.kmod_problem,
            )

    # -- container lifecycle -------------------------------------------------------

    def create_container(self, c: ContainerInfo) -> InjectionPlan | None:
        """The plan for a new container, or None when it asks for no share.

        Raises ShareRefused; a refusal leaves nothing reserved.
        """
        if c.id in self.allocations:  # asked again: same answer
            return self._plan(self.allocations[c.id])
        req = parse_request(c, self.gpus, self.policy)
        if req is None:
            return None
        shares = self.ledger.place(req, c.describe())
        pod = f"{c.pod_namespace}/{c.pod_name}" if c.pod_name else ""
        alloc = Allocation(c.id, c.name, pod, shares, req.priority, req.isolation)
        registered = self._register(alloc, c.describe())
        self.ledger.add(alloc)
        self.allocations[c.id] = alloc
        if registered:
            self.registered.add(c.id)
        self._check_memory_dev(req, alloc, c)
        log.info("%s: placed %s", c.describe(), _describe_shares(alloc))
        return self._plan(alloc)

    def start_container(self, c: ContainerInfo) -> None:
        """Bind the registration to the container's cgroup, which now exists.

        A failure is logged; with kmod: required it raises ShareRefused.
        """
        if c.id not in self.registered or not c.cgroups_path or self.kmod is None:
            return
        try:
            self.kmod.bind_cgroup(c.id, c.cgroups_path)
        except KmodError as e:
            message = (
                f"gpushare: {c.describe()}: the kernel module could not bind cgroup "
                f"{c.cgroups_path}: {e}"
            )
            if self.policy.kmod_mode == "required":
                raise ShareRefused(message, "kmod") from None
            log.warning("%s; compute isolation may not apply", message)

    def release(self, container_id: str) -> bool:
        """Unregister and free the container's shares (Stop and Remove); idempotent.

        True when this call freed an allocation.
        """
        alloc = self.allocations.pop(container_id, None)
        if alloc is not None:
            self.ledger.remove(alloc)
            log.info("container %s: released %s", container_id, _describe_shares(alloc))
        if container_id in self.registered or container_id in self._unregister_later:
            self.registered.discard(container_id)
            self._unregister(container_id)
        return alloc is not None

    def synchronize(self, live: Sequence[ContainerInfo]) -> None:
        """Rebuild everything from the live containers and the module's registry.

        Allocations come from each container's gpushare.io/assigned annotation,
        else from the module's registration of it.  Registrations without a live
        container are removed; live shares the module lost are registered again.
        Live shares are recorded even when they no longer fit (a smaller reserve
        or inventory): they exist, so nothing new is placed on top of them.
        """
        self.ledger = Ledger(self.gpus, self.policy)
        self.allocations = {}
        self.registered = set()
        module: dict[str, Registration] = {}
        ready = self._kmod_ready()
        if ready:
            assert self.kmod is not None
            try:
                module = {r.container_id: r for r in self.kmod.registrations()}
            except KmodError as e:
                log.error("cannot read the kernel module's registrations: %s", e)
                ready = False
        for c in live:
            alloc = self._recover(c, module.get(c.id))
            if alloc is None:
                continue
            for note in self.ledger.add(alloc):
                log.warning("%s: recovered share: %s", c.describe(), note)
            self.allocations[c.id] = alloc
        self._unregister_later = set()
        if not ready:
            return
        cgroups = {c.id: c.cgroups_path for c in live}
        for cid, reg in module.items():
            alloc = self.allocations.get(cid)
            if alloc is None or alloc.isolation == "none":
                log.info("container %s: gone; removing its kernel-module registration", cid)
                self._unregister(cid)
            elif _sorted(reg.quotas) != _sorted(_quotas(alloc)):
                log.warning("container %s: module registration differs; registering again", cid)
                self._unregister(cid)
            else:
                self.registered.add(cid)
        for cid, alloc in self.allocations.items():
            if alloc.isolation != "none" and cid not in self.registered:
                self._reregister(alloc, cgroups.get(cid, ""))

    def status(self) -> dict[str, Any]:
        """A JSON-able picture of GPUs, allocations and the module."""
        gpus = []
        for g in self.gpus:
            u = self.ledger.usage[g.index]
            gpus.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "minor": g.minor,
                    "memory_total": g.memory_bytes,
                    "memory_reserved": self.policy.memory_reserve_bytes,
                    "memory_allocated": u.memory_bytes,
                    "memory_free": self.ledger.free_memory(g.index),
                    "core_allocated": u.core_percent,
                    "core_free": max(0, 100 - u.core_percent),
                    "containers": sorted(u.containers),
                    "high_priority": sorted(u.high_priority),
                }
            )
        allocations = [
            {
                "container_id": a.container_id,
                "name": a.name,
                "pod": a.pod,
                "priority": a.priority,
                "isolation": a.isolation,
                "registered": a.container_id in self.registered,
                "gpus": [_share_json(s) for s in a.shares],
            }
            for a in sorted(self.allocations.values(), key=lambda a: a.container_id)
        ]
        return {
            "kmod": {
                "mode": self.policy.kmod_mode,
                "loaded": self._loaded,
                "problem": "" if self._loaded else self.kmod_problem,
            },
            "policy": {
                "memory_reserve_bytes": self.policy.memory_reserve_bytes,
                "max_inst": self.policy.max_inst,
                "default_placement": self.policy.default_placement,
                "max_high_priority_per_gpu": self.policy.max_high_priority_per_gpu,
            },
            "gpus": gpus,
            "allocations": allocations,
        }

    # -- kernel module ---------------------------------------------------------------

    def _kmod_ready(self) -> bool:
        """Whether the module can be used now; declares the GPUs when it (re)appears."""
        if self.kmod is None:
            return False
        try:
            loaded = self.kmod.loaded()
        except KmodError:
            loaded = False
        if not loaded:
            if self._loaded:
                log.warning("gpushare kernel module no longer loaded")
            self._loaded = self._declared = False
            self.kmod_problem = "is not loaded"
            return False
        if not self._declared:
            try:
                self.kmod.declare_gpus([GpuDeclaration(g.index, g.memory_bytes) for g in self.gpus])
            except KmodError as e:
                self.kmod_problem = f"is loaded but refused this node's GPU list: {e}"
                log.error("gpushare kernel module %s", self.kmod_problem)
                return False
            self._declared = True
        self._loaded = True
        self.kmod_problem = ""
        return True

    def _register(self, alloc: Allocation, who: str) -> bool:
        """Register a new share; False when it goes unenforced.  Raises ShareRefused."""
        if alloc.isolation == "none" or self.policy.kmod_mode == "off":
            return False
        required = self.policy.kmod_mode == "required"
        if not self._kmod_ready():
            if required:
                raise ShareRefused(
                    f"gpushare: cannot create {who}: the gpushare kernel module "
                    f"{self.kmod_problem} and this node requires it (kmod: required); "
                    f"load gpushare.ko or set kmod: optional in the node config",
                    "kmod",
                )
            log.warning(
                "%s: kernel module %s (kmod: optional): isolation is not enforced",
                who,
                self.kmod_problem,
            )
            return False
        assert self.kmod is not None
        registration = Registration(alloc.container_id, _quotas(alloc))
        try:
            self._register_in_module(registration, who)
        except ModuleNotLoaded:
            self._loaded = self._declared = False
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
            self._unregister(alloc.container_id)
            raise ShareRefused(
                f"gpushare: cannot create {who}: the gpushare kernel module refused "
                f"{_describe_shares(alloc)}: {e} (errno {e.errno}); compare "
                f"'nri-gpushare status' with the module's registrations",
                "kmod",
            ) from None
        return True

    def _register_in_module(self, registration: Registration, who: str) -> None:
        assert self.kmod is not None
        try:
            self.kmod.register(registration)
        except AlreadyRegistered:
            # A stale registration of an ID this service does not hold: replace it.
            log.warning("%s: replacing a stale kernel-module registration", who)
            self._unregister(registration.container_id)
            self.kmod.register(registration)
        except KmodError as e:
            if e.errno != errno.ENXIO:
                raise
            # The module was reloaded since we declared the GPUs: declare them again.
            self._declared = False
            if not self._kmod_ready():
                raise
            self.kmod.register(registration)

    def _reregister(self, alloc: Allocation, cgroups_path: str) -> None:
        assert self.kmod is not None
        cid = alloc.container_id
        try:
            self.kmod.register(Registration(cid, _quotas(alloc)))
        except KmodError as e:
            log.error("container %s: cannot register its live share again: %s", cid, e)
            return
        self.registered.add(cid)
        log.info("container %s: registered its live share again", cid)
        if cgroups_path:
            try:
                self.kmod.bind_cgroup(cid, cgroups_path)
            except KmodError as e:
                log.warning("container %s: cannot bind cgroup %s: %s", cid, cgroups_path, e)

    def _unregister(self, cid: str) -> None:
        if self.kmod is None:
            return
        try:
            self.kmod.unregister(cid)
        except (NotRegistered, ModuleNotLoaded):
            pass
        except KmodError as e:
            log.error("container %s: kernel module unregistration failed: %s", cid, e)
            self._unregister_later.add(cid)
            return
        self._unregister_later.discard(cid)

    # -- plans and recovery ------------------------------------------------------------

    def _plan(self, alloc: Allocation) -> InjectionPlan:
        devices = list(self.devices.common())
        devices += [self.devices.gpu(self.by_index[s.index].minor) for s in alloc.shares]
        if alloc.container_id in self.registered and (ctl := self.devices.control()):
            devices.append(ctl)
        uuids = ",".join(s.uuid for s in alloc.shares)
        env = {
            "NVIDIA_VISIBLE_DEVICES": uuids,
            "GPUSHARE_GPU_UUIDS": uuids,
            "GPUSHARE_MEMORY_LIMIT": ",".join(str(s.memory_bytes) for s in alloc.shares),
            "GPUSHARE_PRIORITY": alloc.priority,
            "GPUSHARE_ISOLATION": alloc.isolation,
        }
        if alloc.isolation != "memory" and any(s.core_percent for s in alloc.shares):
            env["GPUSHARE_CORE_LIMIT"] = ",".join(str(s.core_percent) for s in alloc.shares)
        return InjectionPlan(tuple(devices), env, {ASSIGNED: assigned_annotation(alloc)})

    def _recover(self, c: ContainerInfo, reg: Registration | None) -> Allocation | None:
        pod = f"{c.pod_namespace}/{c.pod_name}" if c.pod_name else ""
        text = c.annotations.get(ASSIGNED)
        if text is not None:
            try:
                return self._from_annotation(c, pod, text)
            except (ValueError, KeyError, TypeError) as e:
                log.warning("%s: unusable %s annotation (%s): %s", c.describe(), ASSIGNED, e, text)
        if reg is not None:
            if unknown := [q.gpu_index for q in reg.quotas if q.gpu_index not in self.by_index]:
                log.warning("%s: registered on unknown GPUs %s; ignored", c.describe(), unknown)
                return None
            shares = tuple(
                GpuShare(
                    q.gpu_index, self.by_index[q.gpu_index].uuid, q.memory_bytes, q.core_percent
                )
                for q in reg.quotas
            )
            high = any(q.high_priority for q in reg.quotas)
            return Allocation(c.id, c.name, pod, shares, "high" if high else "normal", "full")
        return None

    def _from_annotation(self, c: ContainerInfo, pod: str, text: str) -> Allocation:
        data = json.loads(text)
        shares = []
        for entry in data["gpus"]:
            gpu = self.by_uuid.get(entry["uuid"])
            if gpu is None:
                raise ValueError(f"GPU {entry['uuid']} is not on this node")
            memory, core = int(entry["memory"]), int(entry.get("core", 0))
            if memory <= 0 or not 0 <= core <= 100:
                raise ValueError("quota out of range")
            shares.append(GpuShare(gpu.index, gpu.uuid, memory, core))
        priority, isolation = data.get("priority", "normal"), data.get("isolation", "full")
        if priority not in PRIORITIES or isolation not in ISOLATIONS or not shares:
            raise ValueError("bad priority, isolation or GPU list")
        return Allocation(c.id, c.name, pod, tuple(shares), priority, isolation)

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


def assigned_annotation(alloc: Allocation) -> str:
    """The gpushare.io/assigned value for an allocation."""
    data: Mapping[str, Any] = {
        "version": ASSIGNED_VERSION,
        "gpus": [_share_json(s) for s in alloc.shares],
        "priority": alloc.priority,
        "isolation": alloc.isolation,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _share_json(s: GpuShare) -> dict[str, Any]:
    return {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}


def _quotas(alloc: Allocation) -> tuple[GpuQuota, ...]:
    full = alloc.isolation == "full"
    return tuple(
        GpuQuota(s.index, s.memory_bytes, s.core_percent if full else 0, alloc.high_priority)
        for s in alloc.shares
    )


def _sorted(quotas: Sequence[GpuQuota]) -> list[GpuQuota]:
    return sorted(quotas, key=lambda q: q.gpu_index)


def _describe_shares(alloc: Allocation) -> str:
    parts = []
    for s in alloc.shares:
        core = f" {s.core_percent}%" if s.core_percent else ""
        parts.append(f"GPU {s.index} {format_bytes(s.memory_bytes)}{core}")
    return ", ".join(parts) + (" (high priority)" if alloc.high_priority else "")
