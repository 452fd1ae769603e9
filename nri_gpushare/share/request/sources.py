"""Which of a container's sources may ask for a share (the node's
`SourcePolicy` for the path it came by), and what is ignored.

A Kubernetes pod's creator writes its annotations; a container's labels in
Kubernetes come only from its image (containerd merges the image's labels in;
the kubelet sets none of ours), and its environment mixes the image's ENV with
the pod spec's env, which NRI cannot tell apart.  So by default a pod asks
through annotations only; image labels and environment are opt-in.  What a
source may not say is hidden from the request parser and reported by
`ignored`, so the container runs as if it had not said it.

The device plugin's ``gpushare.io/kubelet.*`` container annotations (a pod's
``resources.limits``, `kubelet`) are a source of their own (`SourcePolicy.kubelet`),
read for pods only (`kubelet_allowed`): without ``annotations`` they are still
read, and without ``kubelet`` they are not read and are reported like the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from nri_gpushare.names import ASSIGNED, KEY_PREFIX, KUBELET_PREFIX
from nri_gpushare.share.model import ContainerInfo, SourcePolicy
from nri_gpushare.units import quote

REQUEST_ENV = (
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES",
    "ALIYUN_COM_GPU_SCHD_WEIGHT",
    "ALIYUN_COM_GPU_HIGH_PRIO",
    "ALIYUN_COM_GPU_MEM_DEV",
    "CGPU_DISABLE",
    "EGPU",
)
"""The environment variables that ask for (or opt out of) a share."""


def _ours(mapping: Mapping[str, str]) -> list[str]:
    return sorted(
        quote(k)
        for k in mapping
        if k.startswith(KEY_PREFIX) and k != ASSIGNED and not k.startswith(KUBELET_PREFIX)
    )


def _kubelet(mapping: Mapping[str, str]) -> list[str]:
    return sorted(quote(k) for k in mapping if k.startswith(KUBELET_PREFIX))


def kubelet_allowed(c: ContainerInfo, sources: SourcePolicy) -> bool:
    """Whether the device plugin's annotations are read: pods only."""
    return bool(c.pod_name) and sources.kubelet


def visible(c: ContainerInfo, sources: SourcePolicy) -> ContainerInfo:
    """The container as the request parser may see it under `sources` (the
    container itself when a hidden source says nothing about a share: the
    usual case, and the cheap one)."""
    changes: dict[str, object] = {}
    if not sources.annotations and (_ours(c.pod_annotations) or _ours(c.annotations)):
        changes["pod_annotations"] = {}
        # The device plugin's stay: `kubelet_allowed` says whether they are read.
        changes["annotations"] = {
            k: v for k, v in c.annotations.items() if k.startswith(KUBELET_PREFIX)
        }
    if not sources.labels and _has_ours(c.labels):
        changes["labels"] = {}
    if not sources.env and not _REQUEST_NAMES.isdisjoint(c.env):
        changes["env"] = {}
    return replace(c, **changes) if changes else c  # type: ignore[arg-type]


_REQUEST_NAMES = frozenset(REQUEST_ENV)


def _has_ours(mapping: Mapping[str, str]) -> bool:
    return any(k.startswith(KEY_PREFIX) for k in mapping)


def ignored(c: ContainerInfo, sources: SourcePolicy) -> list[str]:
    """What the container says about a share that `sources` does not let it
    say, for a warning ("container label gpushare.io/gpu-memory", ...)."""
    out: list[str] = []
    if not sources.annotations:
        out += [f"pod annotation {k}" for k in _ours(c.pod_annotations)]
        out += [f"container annotation {k}" for k in _ours(c.annotations)]
    if not sources.labels:
        out += [f"container label {k}" for k in _ours(c.labels)]
    if not sources.env and not _REQUEST_NAMES.isdisjoint(c.env):
        out += [f"environment {k}" for k in REQUEST_ENV if k in c.env]
    if c.pod_name and not sources.kubelet:
        out += [f"container annotation {k} (resources.limits)" for k in _kubelet(c.annotations)]
    return out


def namespace_allowed(c: ContainerInfo, sources: SourcePolicy) -> bool:
    """Whether the container's namespace may ask for a share."""
    return not sources.namespaces or c.pod_namespace in sources.namespaces
