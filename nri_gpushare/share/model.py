"""Plain values of the share domain: GPUs, node policy, containers, plans, refusals.

Nothing here knows NRI, protobuf or YAML; the daemon builds these from its
messages and config and turns an `InjectionPlan` into a ContainerAdjustment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from nri_gpushare.units import format_bytes, quote

Placement = Literal["binpack", "spread"]
Priority = Literal["normal", "high"]
Isolation = Literal["full", "memory", "none"]
Origin = Literal["", "cdi", "runc"]
"""How a share was asked for: "" NRI, "cdi" the CDI hook, "runc" gpushare-runc."""
KmodMode = Literal["required", "optional", "off"]
UnservedAction = Literal["warn", "deny"]
PreloadMode = Literal["ld.so.preload", "env"]
LibraryMissingAction = Literal["refuse", "warn"]

PLACEMENTS: tuple[Placement, ...] = get_args(Placement)
PRIORITIES: tuple[Priority, ...] = get_args(Priority)
ISOLATIONS: tuple[Isolation, ...] = get_args(Isolation)
ORIGINS: tuple[Origin, ...] = get_args(Origin)
KMOD_MODES: tuple[KmodMode, ...] = get_args(KmodMode)
UNSERVED_ACTIONS: tuple[UnservedAction, ...] = get_args(UnservedAction)
PRELOAD_MODES: tuple[PreloadMode, ...] = get_args(PreloadMode)
LIBRARY_MISSING_ACTIONS: tuple[LibraryMissingAction, ...] = get_args(LibraryMissingAction)
DEFAULT_LIBRARY = "/usr/lib/nri-gpushare/libgpushare.so"
DEFAULT_CONTAINER_LIBRARY = "/usr/lib/gpushare/libgpushare.so"
ETC_LD_SO_PRELOAD = "/etc/ld.so.preload"


@dataclass(frozen=True)
class Gpu:
    """One physical GPU of the node."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    minor: int


@dataclass(frozen=True)
class DeviceNode:
    """A character device to create in the container (same path as on the host)."""

    path: str
    type: str
    major: int
    minor: int
    mode: int = 0o666


@dataclass(frozen=True)
class Mount:
    source: str
    destination: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind", "ro")


@dataclass(frozen=True)
class InterposerPolicy:
    """How the CUDA interposer (libgpushare.so) reaches containers with
    isolation full or memory (see `nri_gpushare.share.interposer`).

    library: the node's copy (host path), bind-mounted read-only at
    container_path.
    preload: ld.so.preload (a one-line file, `preload_file` on the host,
        bind-mounted read-only over the container's /etc/ld.so.preload) or env
        (LD_PRELOAD only).
    missing: what a share with isolation full|memory gets when the library is
        not on the node: refuse (the container is refused) or warn (created
        without the interposer, with a warning).
    allow_managed: GPUSHARE_ALLOW_MANAGED=1 for the interposer (managed memory
        is not held to the quota by the driver).
    preload_file: the host file holding one line, container_path; the daemon
        writes it in its state directory and fills this in.
    """

    library: str = DEFAULT_LIBRARY
    container_path: str = DEFAULT_CONTAINER_LIBRARY
    preload: PreloadMode = "ld.so.preload"
    missing: LibraryMissingAction = "refuse"
    allow_managed: bool = False
    preload_file: str = ""

    def __post_init__(self) -> None:
        if self.preload not in PRELOAD_MODES:
            raise ValueError(
                f"interposer preload must be one of {', '.join(PRELOAD_MODES)}, "
                f"got {self.preload!r}"
            )
        if self.missing not in LIBRARY_MISSING_ACTIONS:
            raise ValueError(
                f"interposer missing must be one of {', '.join(LIBRARY_MISSING_ACTIONS)}, "
                f"got {self.missing!r}"
            )


@dataclass(frozen=True)
class SourcePolicy:
    """Which parts of a container may ask for a share, for one path.

    annotations: pod annotations (pod-wide and per container) and the
        container's own annotations.
    labels: the container's labels (containerd merges the image's labels in).
    env: cGPU and eGPU variables (the image's ENV and the spec's env: NRI
        cannot tell them apart).
    namespaces: Kubernetes namespaces that may ask; empty: every namespace.
    kubelet: the ``gpushare.io/kubelet.*`` annotations the device plugin's
        Allocate put on the container (a pod's ``resources.limits``, see
        `nri_gpushare.k8s`); only ever for Kubernetes pods.
    """

    annotations: bool = True
    labels: bool = False
    env: bool = False
    namespaces: tuple[str, ...] = ()
    kubelet: bool = True


POD_SOURCES = SourcePolicy()
"""Kubernetes pods: only what the pod spec carries (its annotations)."""
STANDALONE_SOURCES = SourcePolicy(annotations=True, labels=True, env=True, kubelet=False)
"""Containers started by hand: labels and env as the operator passed them."""


@dataclass(frozen=True)
class NodePolicy:
    """The node's sharing rules (from the daemon's config).

    memory_reserve_bytes: kept free on every GPU (driver, other users).
    max_inst: most containers on one GPU, 1..25.
    default_placement: binpack | spread, for requests that name none.
    max_high_priority_per_gpu: most high-priority containers on one GPU
        (0 forbids high priority).
    kmod_mode: required | optional | off.
    pod_sources / standalone_sources: who may ask for a share, per path.
    unserved: what to do with a CRI container found running without the
        share it asked for (created while the plugin was not serving): deny
        (kill it: its kubelet starts it again through the plugin) | warn.
    interposer: how libgpushare.so is given to shares with isolation full or
        memory; None: no interposer on this node (nothing is injected).
    """

    memory_reserve_bytes: int = 0
    max_inst: int = 16
    default_placement: Placement = "binpack"
    max_high_priority_per_gpu: int = 1
    kmod_mode: KmodMode = "optional"
    pod_sources: SourcePolicy = POD_SOURCES
    standalone_sources: SourcePolicy = STANDALONE_SOURCES
    unserved: UnservedAction = "deny"
    interposer: InterposerPolicy | None = None

    def sources_for(self, c: ContainerInfo) -> SourcePolicy:
        """The source policy of the path the container came by."""
        return self.pod_sources if c.pod_name else self.standalone_sources

    def __post_init__(self) -> None:
        if self.memory_reserve_bytes < 0:
            raise ValueError(f"memory reserve must be >= 0, got {self.memory_reserve_bytes}")
        if not 1 <= self.max_inst <= 25:
            raise ValueError(f"max_inst must be between 1 and 25, got {self.max_inst}")
        if self.default_placement not in PLACEMENTS:
            raise ValueError(
                f"default placement must be one of {', '.join(PLACEMENTS)}, "
                f"got {self.default_placement!r}"
            )
        if self.max_high_priority_per_gpu < 0:
            raise ValueError(
                f"max high-priority containers per GPU must be >= 0, "
                f"got {self.max_high_priority_per_gpu}"
            )
        if self.kmod_mode not in KMOD_MODES:
            raise ValueError(f"kmod must be one of {', '.join(KMOD_MODES)}, got {self.kmod_mode!r}")
        if self.unserved not in UNSERVED_ACTIONS:
            raise ValueError(
                f"unserved must be one of {', '.join(UNSERVED_ACTIONS)}, got {self.unserved!r}"
            )


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """What the domain needs to know about a container (pod fields empty outside
    Kubernetes)."""

    id: str
    name: str
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    cgroups_path: str = ""
    pid: int = 0  # the container's first process on the host; 0: none (yet)
    running: bool = True  # created, running or paused (not stopped)

    @property
    def pod(self) -> str:
        """ "namespace/name", "" outside Kubernetes."""
        return f"{self.pod_namespace}/{self.pod_name}" if self.pod_name else ""

    def describe(self) -> str:
        """The container for messages, its names quoted short (a runtime may pass anything)."""
        pod = f" (pod {quote(self.pod)})" if self.pod_name else ""
        return f"container '{quote(self.name or self.id)}'{pod}"


@dataclass(frozen=True)
class InjectionPlan:
    """What to add to a container: the daemon turns it into a ContainerAdjustment."""

    devices: tuple[DeviceNode, ...]
    env: Mapping[str, str]
    annotations: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()
    remove_annotations: tuple[str, ...] = ()  # annotations to take off the container


@dataclass(frozen=True)
class GpuShare:
    """One container's share of one GPU."""

    index: int
    uuid: str
    memory_bytes: int
    core_percent: int  # 0 = no compute limit


@dataclass(frozen=True)
class Allocation:
    """A managed container and the shares it holds, in the container's GPU order."""

    container_id: str
    name: str
    pod: str  # "namespace/name", "" outside Kubernetes
    shares: tuple[GpuShare, ...]
    priority: Priority = "normal"
    isolation: Isolation = "full"
    interposer: bool = False  # libgpushare.so was injected (recorded; not in the annotation)
    #: How it was asked for: "" through NRI (a Kubernetes pod), "cdi" (the CDI
    #: hook) or "runc" (gpushare-runc) for containers NRI does not see.
    origin: Origin = ""
    namespace: str = ""  # the containerd namespace of a container asked for outside NRI
    #: resources.limits: resource short name ("gpu-memory") -> the device IDs the
    #: kubelet gave the container, as ranges ("0-7"); empty when it asked otherwise.
    #: The device plugin reads them back from status to know which IDs are held.
    kubelet: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: The gpushare.io/assigned annotation the container was created with, once
    #: `nri-gpushare resize` has changed its shares ("": its shares as created).
    assigned: str = ""
    #: The UID of the prepared DRA claim whose share this is ("": none; see
    #: `nri_gpushare.share.claims`).
    claim: str = ""

    @property
    def local(self) -> bool:
        """Asked for through the local API (ctr, nerdctl, docker), not NRI."""
        return bool(self.origin)

    @property
    def where(self) -> str:
        """'nri', or 'runc:<namespace>' / 'cdi:<namespace>' for status."""
        return f"{self.origin}:{self.namespace}" if self.origin else "nri"

    @property
    def high_priority(self) -> bool:
        return self.priority == "high"

    def describe_shares(self) -> str:
        """'GPU 0 2048Mi 30%, GPU 1 1024Mi (high priority)', for messages."""
        parts = []
        for s in self.shares:
            core = f" {s.core_percent}%" if s.core_percent else ""
            parts.append(f"GPU {s.index} {format_bytes(s.memory_bytes)}{core}")
        return ", ".join(parts) + (" (high priority)" if self.high_priority else "")


class ShareRefused(Exception):
    """A request the domain will not serve; str() is a message for a person.

    reason: "invalid" (bad value), "conflict" (sources disagree), "capacity"
    (does not fit), "kmod" (the kernel module refused or is missing),
    "forbidden" (the node does not let this container ask), "state" (the
    allocation could not be recorded), "interposer" (isolation full|memory
    needs libgpushare.so, which the node lacks), "fragmentation" (a request
    the kubelet admitted from ``resources.limits`` that fits the node's free
    total but not its GPUs one by one).
    key: the key or variable to change, when one is to blame.
    """

    def __init__(self, message: str, reason: str = "invalid", key: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.key = key


@dataclass(frozen=True)
class LocalRef:
    """A local allocation (one the local API placed: the wrapper or a CDI
    hook), as its owner and the containerd reconciler know it."""

    namespace: str
    container_id: str
    pid: int  # the container's init pid; 0 = not known yet (or after a daemon restart)
    since: float  # time.time() when it was placed; 0 for one recovered after a restart
