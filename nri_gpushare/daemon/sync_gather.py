"""Synchronize's gathering: the pods and containers of every request of one
Synchronize, reduced as each request arrives to what the share domain needs
(`ContainerInfo`), so that no view (and no request buffer) outlives its
request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from nri_gpushare.daemon.nri_views import PodFields, container_info, may_ask
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.api.lite import ContainerView, PodSandboxView
from nri_gpushare.share.model import ContainerInfo

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


@dataclass
class SyncState:
    """One Synchronize's pods and containers, gathered request by request."""

    pods: dict[str, PodHead] = field(default_factory=dict)
    live: list[ContainerInfo] = field(default_factory=list)
    #: containers whose pod was not sent yet (kept as views: rare)
    waiting: list[ContainerView] = field(default_factory=list)
    pods_seen: int = 0
    containers_seen: int = 0

    def gather(self, pods: list[PodSandboxView], containers: list[ContainerView]) -> None:
        self.pods_seen += len(pods)
        self.containers_seen += len(containers)
        for p in pods:
            try:
                asking = may_ask(p)  # its containers are read in full
                self.pods[p.id] = PodHead(
                    p.name, p.namespace, p.uid, dict(p.annotations) if asking else {}, asking
                )
            except Exception:  # one odd pod must not stop the rest
                log.exception("a pod unreadable in Synchronize; its containers have no pod")
        for c in containers:
            self._container(c, last=False)

    def finish(self) -> list[ContainerInfo]:
        """The live containers, every request gathered."""
        for c in self.waiting:
            self._container(c, last=True)
        self.waiting = []
        return self.live

    def _container(self, c: ContainerView, last: bool) -> None:
        try:
            pod = self.pods.get(c.pod_sandbox_id)
            if pod is None and not last:
                self.waiting.append(c)
            elif (pod is not None and pod.asking) or may_ask(c):
                self.live.append(container_info(pod, c))
            else:  # the usual container: nothing of ours in it nor in its pod
                self.live.append(bare_info(pod, c))
        except Exception:  # one odd container must not stop the rest
            log.exception("a container unreadable in Synchronize; ignored")
