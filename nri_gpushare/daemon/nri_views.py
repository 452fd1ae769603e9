"""NRI views to the share domain's values: a container (with its pod) as a
`ContainerInfo`, and the raw-bytes test of whether it may ask for a share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import ContainerView, PodSandboxView
from nri_gpushare.share.model import ContainerInfo
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS


class PodFields(Protocol):
    """What the domain reads of a pod: a `PodSandboxView` or a `PodHead`."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...


def container_info(pod: PodFields | None, container: ContainerView) -> ContainerInfo:
    """The domain's view of an NRI container (labels, annotations, env, cgroup)."""
    env: dict[str, str] = {}
    for entry in container.env:
        key, _, value = entry.partition("=")
        env[key] = value
    return ContainerInfo(
        id=container.id,
        name=container.name,
        pod_name=pod.name if pod else "",
        pod_namespace=pod.namespace if pod else "",
        pod_uid=pod.uid if pod else "",
        pod_annotations=pod.annotations if pod else {},
        annotations=container.annotations,
        labels=container.labels,
        env=env,
        cgroups_path=container.cgroups_path,
        pid=container.pid,
        running=container.state != nri.ContainerState.CONTAINER_STOPPED,
    )


def may_ask(*views: PodSandboxView | ContainerView) -> bool:
    """`may_ask_raw` on the views' serialized bytes, searched in place (no
    copy, nothing decoded)."""
    for view in views:
        if view.contains_any(COARSE_MARKERS) and view.contains_any(RAW_MARKERS):
            return True
    return False
