"""Synchronize's gathering: the pods and containers of every request of one
Synchronize, reduced as each request arrives to what the share domain needs
(`ContainerInfo`), so that no view (and no request buffer) outlives its
request.

Most containers are read by the native scanner (`api.sync_scan`: one call
per request); one it leaves (None), or all of them when it is not there, is
read through its view as before, which stays the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from nri_gpushare.daemon.nri_views import PodFields, container_info, may_ask
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import ContainerView, PodSandboxView
from nri_gpushare.nri.api.sync_scan import ContainerHead, scan_containers, scan_pods
from nri_gpushare.share.model import ContainerInfo
from nri_gpushare.share.request import COARSE_MARKERS, RAW_MARKERS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodHead:
    """A pod as Synchronize keeps it between requests: no view, so no request
    buffer, stays referenced; annotations only for a pod that may ask."""

    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str]
    asking: bool


def bare_info(pod: PodFields | None, container: ContainerView) -> ContainerInfo:
    """`container_info` for a container that cannot ask for a share (`may_ask_raw`
    said no): its labels, annotations and environment are neither read nor
    kept, since nothing in the domain reads them for such a container."""
    return ContainerInfo(
        id=container.id,
        name=container.name,
        pod_name=pod.name if pod else "",
        pod_namespace=pod.namespace if pod else "",
        pod_uid=pod.uid if pod else "",
        cgroups_path=container.cgroups_path,
        pid=container.pid,
        running=container.state != nri.ContainerState.CONTAINER_STOPPED,
    )


def head_info(pod: PodFields | None, head: ContainerHead) -> ContainerInfo:
    """`bare_info` from the native scanner's head of the container."""
    return ContainerInfo(
        id=head.id,
        name=head.name,
        pod_name=pod.name if pod else "",
        pod_namespace=pod.namespace if pod else "",
        pod_uid=pod.uid if pod else "",
        cgroups_path=head.cgroups_path,
        pid=head.pid,
        running=head.running,
    )


@dataclass
class SyncState:
    """One Synchronize's pods and containers, gathered request by request."""

    pods: dict[str, PodHead] = field(default_factory=dict)
    live: list[ContainerInfo] = field(default_factory=list)
    #: containers whose pod was not sent yet, as views (a scanned one over its
    #: own bytes: no request buffer kept), and their heads (None: not scanned)
    waiting: list[ContainerView] = field(default_factory=list)
    waiting_heads: list[ContainerHead | None] = field(default_factory=list)
    pods_seen: int = 0
    containers_seen: int = 0

    def gather(self, pods: list[PodSandboxView], containers: list[ContainerView]) -> None:
        self.pods_seen += len(pods)
        self.containers_seen += len(containers)
        pod_heads = scan_pods(pods, COARSE_MARKERS, RAW_MARKERS) or [None] * len(pods)
        for p, ph in zip(pods, pod_heads, strict=True):
            if ph is not None and not ph.asks:  # the usual pod, scanned
                self.pods[ph.id] = PodHead(ph.name, ph.namespace, ph.uid, {}, False)
                continue
            try:
                asking = may_ask(p)  # its containers are read in full
                self.pods[p.id] = PodHead(
                    p.name, p.namespace, p.uid, dict(p.annotations) if asking else {}, asking
                )
            except Exception:  # one odd pod must not stop the rest
                log.exception("a pod unreadable in Synchronize; its containers have no pod")
        heads = scan_containers(containers, COARSE_MARKERS, RAW_MARKERS) or [None] * len(containers)
        for c, head in zip(containers, heads, strict=True):
            self._container(c, head, last=False)

    def finish(self) -> list[ContainerInfo]:
        """The live containers, every request gathered."""
        for c, head in zip(self.waiting, self.waiting_heads, strict=True):
            self._container(c, head, last=True)
        self.waiting, self.waiting_heads = [], []
        return self.live

    def _container(self, c: ContainerView, head: ContainerHead | None, last: bool) -> None:
        try:
            pod = self.pods.get(c.pod_sandbox_id if head is None else head.pod_sandbox_id)
            if pod is None and not last:
                # A scanned container keeps its own bytes, not its request's.
                self.waiting.append(c if head is None else ContainerView(c.raw))
                self.waiting_heads.append(head)
            elif (pod is not None and pod.asking) or (may_ask(c) if head is None else head.asks):
                self.live.append(container_info(pod, c))
            elif head is not None:  # the usual container, scanned
                self.live.append(head_info(pod, head))
            else:  # the usual container: nothing of ours in it nor in its pod
                self.live.append(bare_info(pod, c))
        except Exception:  # one odd container must not stop the rest
            log.exception("a container unreadable in Synchronize; ignored")
