"""Turn a container's annotations, labels and environment into one share request.

Which sources may ask at all is the node's choice per path (`sources`: for
Kubernetes pods by default only annotations; image labels and environment are
opt-in); what a source may not say is not seen here.  A pod annotation
``gpu-memory: 0`` (pod-wide or for the container) opts out whatever the
image's labels or environment say.

Sources, highest first (precedence is per attribute):

0. the pod's ``resources.limits`` ``gpushare.io/gpu-memory|gpu-core|gpu-count``,
   as the device plugin's Allocate hands them over: container annotations
   ``gpushare.io/kubelet.<resource>`` holding the device IDs the kubelet
   picked; the number of IDs is the amount (`kubelet`).  Pods only
   (``sources.pods.kubelet``).
1. per-container pod annotation  ``gpushare.io/container.<name>.<key>``
2. pod-wide pod annotation       ``gpushare.io/<key>``
3. container annotation or label ``gpushare.io/<key>`` (ctr/nerdctl); these two
   are one level: if both are set and disagree, that is an error.
4. environment: cGPU variables and eGPU's ``EGPU=``; if both are set and
   disagree on an attribute, that is an error.

Levels 1-3 resolve by precedence.  Level 0 is what the scheduler counted, so
nothing overrides it: a level 1-3 value that differs from it is a conflict
(naming both), one that agrees is fine, and priority, placement, isolation
and gpu-devices still come from levels 1-3.  Nor does anything add to it:
limits without gpu-core mean no compute limit, and a gpu-core from any other
source (which would reserve compute the scheduler never counted) is a
conflict.  ``resources.limits`` are totals
over the container's GPUs: gpu-memory N GiB and gpu-core C with gpu-count k
(default 1) is N/k GiB and C/k percent on each of k GPUs; N and C must divide
by k, C/k follows gpu-core's rule below, and gpu-core or gpu-count without
gpu-memory is an error.  The environment is not overridden silently either:
when levels 0-3 and the environment both set an attribute and the values
differ, the request is refused with a message naming both.  Values that agree
are fine (``gpu-memory: 3Gi`` and ``ALIYUN_COM_GPU_MEM_CONTAINER=3``); the
higher source then supplies its defaults (e.g. the GPU count).

Only the device plugin writes ``gpushare.io/kubelet.*`` (through the kubelet):
a pod annotation of that prefix, or one on a container outside Kubernetes
(annotation or label), is refused as a forgery (reason "forbidden").

Every value is untrusted: whole numbers have at most 18 digits and sizes at
most 64 characters (checked before any conversion), and a refusal quotes at
most a value's first 64 characters (`units.quote`).

Keys (values are trimmed; enumerations are case-insensitive):

- ``gpu-memory``: per GPU.  ``Ki Mi Gi Ti`` are binary, ``K M G T`` decimal
  (a trailing ``B`` is accepted), a bare number is GiB; fractions are allowed
  when they give whole bytes.  A comma list is one value per GPU in order; a
  short list repeats its last value.  ``0`` opts the container out.
- ``gpu-core``: percent of each GPU, a multiple of 5 in 5..100; a list as above.
  Absent: no compute limit.
- ``gpu-count``: number of GPUs.  Default: the length of ``gpu-devices``, else
  of the longest list.
- ``gpu-devices``: GPU indexes or UUIDs, in the container's GPU order.
- ``priority``: normal | high.  ``placement``: binpack | spread (default from
  the node).  ``isolation``: full | memory (memory only; ``gpu-core`` is then an
  error) | none (placed and accounted, environment injected, not registered
  with the kernel module).

A container is managed when its resolved ``gpu-memory`` is non-zero.  Without
``gpu-memory``, ``gpu-core``/``gpu-count``/``gpu-devices`` set on the container
itself (per-container annotation, container annotation or label) are an error;
pod-wide ones simply do not apply to it, so a pod can share GPUs with some of
its containers only.

The sources live in their own modules: ``kubelet`` (resources.limits),
``keys`` (gpushare.io keys), ``cgpu`` and ``egpu`` (the environment),
``values`` (value parsing); ``settings`` combines them.

cGPU environment (considered only when ``ALIYUN_COM_GPU_MEM_CONTAINER`` is set
or ``CGPU_DISABLE`` is true, as cGPU does):

- ``CGPU_DISABLE=true``: not managed (an opt-out: gpu-memory 0).
- ``ALIYUN_COM_GPU_MEM_CONTAINER``: whole GiB, list as above; ``0``: not
  managed.  Without a device list it covers every GPU of the node (``3,1`` on
  4 GPUs is 3,1,1,1 GiB).
- ``ALIYUN_COM_GPU_VISIBLE_DEVICES`` (else an explicit ``NVIDIA_VISIBLE_DEVICES``
  list): the GPUs, by index or UUID.
- ``ALIYUN_COM_GPU_SCHD_WEIGHT=w``, 1..max_inst: 1 is cGPU's default (no
  weighting), so no compute limit; w > 1 gives a compute limit of
  ``floor(20 * w / max_inst) * 5`` percent (w/max_inst of the GPU, rounded down
  to a multiple of 5), so weights within cGPU's sum rule stay within 100%.
- ``ALIYUN_COM_GPU_HIGH_PRIO``: 1/true = high, 0/false = normal.
- ``ALIYUN_COM_GPU_MEM_DEV``: the GPU size in whole GiB, informative only: it
  must be a positive integer; a mismatch with the placed GPU is only logged.

eGPU: ``EGPU="POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=0,MEM=3276,WEIGHT=10:..."``: an
optional header of node settings (ignored), then one block per GPU: ``PGPU``
the GPU index, ``MEM`` MiB, ``WEIGHT`` compute percent 1..100 (absent: no
limit on that GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nri_gpushare.names import CORE, DRA_CLAIM_ENV, KEY_PREFIX, KUBELET_PREFIX, RESOURCES
from nri_gpushare.share.model import (
    ContainerInfo,
    Gpu,
    Isolation,
    NodePolicy,
    Placement,
    Priority,
)
from nri_gpushare.share.request.cgpu import from_cgpu, memory_dev
from nri_gpushare.share.request.egpu import from_egpu
from nri_gpushare.share.request.keys import KEYS, from_keys
from nri_gpushare.share.request.kubelet import (
    LIMITS,
    canonical,
    check_forged,
    kubelet_ids,
    settings_for,
)
from nri_gpushare.share.request.settings import NOTHING, Context, Settings, merge
from nri_gpushare.share.request.sources import (
    REQUEST_ENV,
    ignored,
    kubelet_allowed,
    namespace_allowed,
    visible,
)
from nri_gpushare.share.request.values import expand
from nri_gpushare.units import format_bytes

log = logging.getLogger(__name__)

__all__ = [
    "KEYS",
    "MARKERS",
    "COARSE_MARKERS",
    "RAW_MARKERS",
    "ShareRequest",
    "ignored",
    "may_ask",
    "may_ask_raw",
    "parse_request",
]

_DEMAND = {"core": "gpu-core", "count": "gpu-count", "devices": "gpu-devices"}


@dataclass(frozen=True)
class ShareRequest:
    """A validated request: one entry per GPU slot, in the container's GPU order."""

    memory_bytes: tuple[int, ...]
    core_percent: tuple[int, ...]  # 0 = no compute limit on that GPU
    devices: tuple[int, ...] | None  # GPU indexes; None: placement chooses
    priority: Priority
    placement: Placement
    isolation: Isolation
    keys: Mapping[str, str]  # attribute -> the key a person changes
    memory_dev_bytes: int | None = None  # ALIYUN_COM_GPU_MEM_DEV, informative
    #: resources.limits: resource short name -> the kubelet's device IDs (ranges)
    kubelet: Mapping[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.memory_bytes)

    def describe(self) -> str:
        text = f"gpu-memory {','.join(format_bytes(m) for m in self.memory_bytes)}"
        if any(self.core_percent):
            text += f", gpu-core {','.join(str(c) for c in self.core_percent)}"
        if self.priority == "high":
            text += ", priority high"
        return text


MARKERS = (KEY_PREFIX, "ALIYUN_COM_GPU_", "CGPU_DISABLE", "EGPU", DRA_CLAIM_ENV)
"""Text found in every source that can ask for a share or be refused: a
``gpushare.io/`` key (requests, ``kubelet.*``, ``assigned``), the name of a
request variable (`REQUEST_ENV`) or a prepared DRA claim's variable.  A
container and pod holding none of them ask for nothing: `parse_request`
returns None without raising."""
RAW_MARKERS = tuple(m.encode() for m in MARKERS)
assert all(name.startswith(MARKERS) for name in REQUEST_ENV)
COARSE_MARKERS = (KEY_PREFIX.encode(), b"GPU")
"""Two texts one of which every `MARKERS` text holds: two searches rule out
the usual container, the precise ones run only where one is found."""
assert all(COARSE_MARKERS[0] in m or COARSE_MARKERS[1] in m for m in RAW_MARKERS)


def may_ask_raw(*raw: bytes) -> bool:
    """Whether a container may ask for a share, from the serialized NRI
    messages it comes with (its own and its pod's): False only when none of
    them holds a `MARKERS` text, so nothing needs decoding.  Protobuf keeps
    strings as their UTF-8 bytes, in which an ASCII text appears as itself."""
    for data in raw:
        if COARSE_MARKERS[0] in data or COARSE_MARKERS[1] in data:
            for marker in RAW_MARKERS:
                if marker in data:
                    return True
    return False


_REQUEST_ENV = frozenset(REQUEST_ENV)
_CGPU_MEMORY = "ALIYUN_COM_GPU_MEM_CONTAINER"
_CGPU_MEMORY_DEV = "ALIYUN_COM_GPU_MEM_DEV"


def _kubelet_keys(c: ContainerInfo) -> bool:
    """Whether `c` carries a ``gpushare.io/kubelet.`` key where the device
    plugin's are read (a pod's container annotations) or refused as forged
    (its pod's annotations; a container outside a pod: its labels too)."""
    mappings = (c.pod_annotations, c.annotations) + (() if c.pod_name else (c.labels,))
    for mapping in mappings:
        for key in mapping:
            if key.startswith(KUBELET_PREFIX):
                return True
    return False


def may_ask(c: ContainerInfo) -> bool:
    """`may_ask_raw` on a container already decoded: False only when no key
    of its pod's annotations, its annotations or labels starts with
    ``gpushare.io/`` and no request variable is in its environment."""
    if not (c.pod_annotations or c.annotations or c.labels or c.env):
        return False  # the usual Synchronize entry (`bare_info`): nothing kept
    for mapping in (c.pod_annotations, c.annotations, c.labels):
        for key in mapping:
            if key.startswith(KEY_PREFIX):
                return True
    env = c.env
    return bool(env) and (not _REQUEST_ENV.isdisjoint(env) or DRA_CLAIM_ENV in env)


def parse_request(c: ContainerInfo, gpus: Sequence[Gpu], policy: NodePolicy) -> ShareRequest | None:
    """The container's validated request, or None when it is not managed.

    Raises ShareRefused (reason "invalid", "conflict" or "forbidden") naming
    the key, the value and what is allowed.  Nothing is reserved here.
    """
    if not may_ask(c):  # the usual container: nothing of ours
        return None
    return _parse(c, gpus, policy)


def _parse(c: ContainerInfo, gpus: Sequence[Gpu], policy: NodePolicy) -> ShareRequest | None:
    """`parse_request` without the `may_ask` shortcut."""
    # Each syntax's parser runs only where its keys or variables are present
    # (without them it says nothing): most containers use one syntax.
    kubelet = _kubelet_keys(c)
    if kubelet:
        check_forged(c)
    sources = policy.sources_for(c)
    ctx = Context(visible(c, sources), gpus, policy)
    ids = kubelet_ids(ctx) if kubelet and kubelet_allowed(c, sources) else {}
    upper = merge(ctx, settings_for(ctx, ids) if ids else NOTHING, from_keys(ctx))
    if _opted_out(ctx, upper):
        return None
    env = ctx.c.env
    cgpu = from_cgpu(ctx) if "CGPU_DISABLE" in env or _CGPU_MEMORY in env else NOTHING
    merged = merge(ctx, upper, merge(ctx, cgpu, from_egpu(ctx) if "EGPU" in env else NOTHING))
    if merged.memory is None:
        _demand_without_memory(ctx, merged)
        return None
    if merged.memory.value == (0,):
        return None
    if ids and CORE not in ids:
        _no_uncounted_core(ctx, merged)
    if not namespace_allowed(c, sources):
        raise ctx.fail(
            f"namespace '{c.pod_namespace}' may not ask for GPU shares on this node "
            f"(allowed: {', '.join(sources.namespaces)}; node config sources.pods.namespaces)",
            merged.memory.key,
            "forbidden",
        )
    return _resolve(ctx, merged, canonical(ids) if ids else {})


def _no_uncounted_core(ctx: Context, merged: Settings) -> None:
    """A request from resources.limits without gpu-core: the scheduler counted
    no compute for it, so no other source may reserve some."""
    core = merged.core
    if core is None or not any(core.value):
        return
    limit = RESOURCES[CORE]
    raise ctx.fail(
        f"{core.cite}: the container asks with {LIMITS} without {limit}, so the scheduler "
        f"counted no compute for it; ask for the compute in {LIMITS} ({limit}, the total "
        f"over the container's GPUs) or remove {core.key}",
        core.key,
        "conflict",
    )


def _opted_out(ctx: Context, upper: Settings) -> bool:
    """A pod annotation gpu-memory 0 (pod-wide or for this container) wins over
    anything the image's labels or environment say."""
    memory = upper.memory
    return memory is not None and memory.value == (0,) and memory.key in ctx.c.pod_annotations


def _demand_without_memory(ctx: Context, merged: Settings) -> None:
    present = merged.present()
    for attr, name in _DEMAND.items():
        v = present.get(attr)
        if v is not None and v.level == "container":
            key = v.key[: -len(name)] + "gpu-memory"
            raise ctx.fail(f"{v.cite} needs a GPU memory request: add {key} (e.g. 2Gi)", key)
    if present:
        log.info("%s: gpushare keys without gpu-memory; not managed", ctx.c.describe())


def _resolve(ctx: Context, m: Settings, kubelet: Mapping[str, str]) -> ShareRequest:
    memory = m.memory
    assert memory is not None
    if not ctx.gpus:
        raise ctx.fail(f"{memory.cite}: this node has no GPUs", memory.key, "capacity")
    core, count, devices = m.core, m.count, m.devices
    lists = [v for v in (memory, core) if v is not None]
    if count is not None and devices is not None and count.value != len(devices.value):
        raise ctx.fail(
            f"{count.cite} does not match {devices.cite} "
            f"({len(devices.value)} GPUs); remove one or make them agree",
            count.key,
        )
    if count is not None:
        n, why, key = count.value, count.cite, count.key
    elif devices is not None:
        n, why, key = len(devices.value), devices.cite, devices.key
    elif memory.default_count is not None:
        n, why, key = memory.default_count, "every GPU of the node", memory.key
    else:
        n = max(len(v.value) for v in lists)
        why, key = memory.cite, memory.key
    for v in lists:
        if len(v.value) > n:
            raise ctx.fail(
                f"{v.cite} gives {len(v.value)} values for {n} GPUs ({why}); give at most {n}",
                v.key,
            )
    if n > len(ctx.gpus):
        raise ctx.fail(
            f"{why} asks for {n} GPUs but this node has {len(ctx.gpus)}", key, "capacity"
        )
    isolation = m.isolation.value if m.isolation else "full"
    if isolation == "memory" and core is not None:
        assert m.isolation is not None
        raise ctx.fail(
            f"{core.cite} cannot be used with {m.isolation.cite} (memory isolation "
            f"only); remove the compute request or use isolation full",
            core.key,
        )
    priority = m.priority.value if m.priority else "normal"
    if priority == "high" and ctx.policy.max_high_priority_per_gpu == 0:
        assert m.priority is not None
        raise ctx.fail(
            f"{m.priority.cite}: this node allows no high-priority containers; use priority normal",
            m.priority.key,
        )
    placement = m.placement.value if m.placement else ctx.policy.default_placement
    keys = {attr: v.key for attr, v in m.present().items()}
    keys.setdefault("count", key)
    keys.setdefault("core", KEY_PREFIX + "gpu-core")
    keys.setdefault("priority", KEY_PREFIX + "priority")
    return ShareRequest(
        memory_bytes=expand(memory.value, n),
        core_percent=expand(core.value, n) if core else (0,) * n,
        devices=devices.value if devices else None,
        priority=priority,
        placement=placement,
        isolation=isolation,
        keys=keys,
        memory_dev_bytes=memory_dev(ctx) if _CGPU_MEMORY_DEV in ctx.c.env else None,
        kubelet=kubelet,
    )
