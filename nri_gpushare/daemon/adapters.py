"""The daemon's glue to the systems around it: Kubernetes events about pods
(`PodEvents`), containers' labels from containerd (`ContainerdLabels`, for
the local API), the share service as the containerd reconciler's owner of
local allocations (`ReconcileOwner`) and the unserved list as its observer
of CRI's tasks (`UnservedObserver`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    ContainerdClient,
    ContainerdUnavailable,
    Event,
    TaskInfo,
)
from nri_gpushare.host.devices import cgroup_of
from nri_gpushare.k8s.events import PodRef, post_pod_event
from nri_gpushare.share.local_shares import LocalShares
from nri_gpushare.share.model import ContainerInfo, LocalRef
from nri_gpushare.share.unserved import UnservedWatch

log = logging.getLogger(__name__)


PostEvent = Callable[[PodRef, str, str], Awaitable[None]]
"""Posts an event: (pod, reason, message); raises when it was not posted."""

FRAGMENTED = "GPUShareFragmented"
"""The event reason of a pod refused for fragmentation."""


async def post_event(pod: PodRef, reason: str, message: str) -> None:
    """The API server's, through `nri_gpushare.k8s.events`."""
    await post_pod_event(pod, reason, message)


class PodEvents:
    """Kubernetes events about pods (config ``kubernetes.events``), each
    posted by a task of its own, so that the NRI handler that decides never
    waits for the API server; a failure is logged.  At most `MAX_IN_FLIGHT`
    are under way: more are logged and dropped (the kubelet's own "Failed"
    event on the pod carries the same message anyway).

    The kubelet retries a refused container every few seconds for as long as
    the pod exists, and each post is a new Event object in the API server
    (the kubelet's own events are aggregated, ours are not): so one
    container gets at most one event per `REPEAT_AFTER` seconds, whatever
    number of pods are stuck, remembering the last `MAX_REMEMBERED`
    containers."""

    MAX_IN_FLIGHT = 16
    REPEAT_AFTER = 600.0
    MAX_REMEMBERED = 4096

    def __init__(
        self, post: PostEvent = post_event, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.post = post
        self.clock = clock
        self.tasks: set[asyncio.Task[None]] = set()
        #: (namespace, pod, uid, container) -> clock() of its last event, oldest first
        self.posted: dict[tuple[str, str, str, str], float] = {}

    def fragmented(self, c: ContainerInfo, message: str) -> None:
        """Post `FRAGMENTED` on the container's pod (none outside Kubernetes)."""
        if not c.pod_name:
            return
        now = self.clock()
        key = (c.pod_namespace[:256], c.pod_name[:256], c.pod_uid[:256], c.name[:256])
        last = self.posted.get(key)
        if last is not None and now - last < self.REPEAT_AFTER:
            log.debug("%s: the %s event was posted lately; not again", c.describe(), FRAGMENTED)
            return
        if len(self.tasks) >= self.MAX_IN_FLIGHT:
            log.warning(
                "%s: %d Kubernetes events still being posted; the %s event is dropped",
                c.describe(),
                len(self.tasks),
                FRAGMENTED,
            )
            return
        self.posted.pop(key, None)
        self.posted[key] = now
        while len(self.posted) > self.MAX_REMEMBERED:
            del self.posted[next(iter(self.posted))]
        pod = PodRef(c.pod_namespace, c.pod_name, c.pod_uid)
        task = asyncio.get_running_loop().create_task(
            self._send(c, pod, FRAGMENTED, message), name="kubernetes-event"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, c: ContainerInfo, pod: PodRef, reason: str, message: str) -> None:
        try:
            await self.post(pod, reason, message)
        except Exception as e:  # the event is extra: its failure is only logged
            log.warning("%s: the %s event was not posted: %s", c.describe(), reason, e)
        else:
            log.info("%s: posted the %s event", c.describe(), reason)

    async def close(self) -> None:
        """Cancel the events still under way."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ContainerdLabels:
    """Containers' labels from containerd, over one connection opened when
    first needed (containerd may start after the daemon) and reopened after
    it broke."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._client: ContainerdClient | None = None

    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        if self._client is None:
            # Shorter than the hook's and the wrapper's wait for the daemon.
            client = ContainerdClient(self.socket_path, timeout=3.0)
            await client.__aenter__()
            self._client = client
        try:
            return await self._client.labels(namespace, container_id)
        except ContainerdUnavailable:
            self.close()
            raise

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ReconcileOwner:
    """The local shares as the containerd reconciler's owner of local allocations."""

    def __init__(self, shares: LocalShares) -> None:
        self.shares = shares
        self._refused: set[tuple[str, str, int]] = set()  # warned once each

    def local_allocations(self) -> list[LocalRef]:
        return [
            r
            for r in self.shares.local_allocations()
            if r.namespace  # a container containerd does not run cannot be checked there
        ]

    async def release_local(self, namespace: str, container_id: str, why: str) -> None:
        await self.shares.release_local(namespace, container_id, why)

    async def adopt_local(self, namespace: str, container_id: str, pid: int) -> None:
        """Bind a recovered local share to the cgroup of the task containerd runs."""
        try:
            # /proc/PID/cgroup takes the kernel's cgroup lock: off the event loop.
            path = await asyncio.to_thread(cgroup_of, container_id, pid)
        except ValueError as e:
            if (namespace, container_id, pid) not in self._refused:
                if len(self._refused) >= 4096:  # bounded: at worst a warning again
                    self._refused.clear()
                self._refused.add((namespace, container_id, pid))
                log.warning(
                    "container %s/%s: its share cannot be bound to the task containerd runs: %s",
                    namespace,
                    container_id,
                    e,
                )
            return
        await self.shares.adopt_local(namespace, container_id, pid, path)


CRI_NAMESPACE = "k8s.io"
"""containerd's namespace of CRI's pods and containers (fixed in containerd 1.7
and 2.x): the containers NRI tells the plugin of."""


class UnservedObserver:
    """containerd's word on CRI's containers, for the unserved list: a first
    process that exited or was deleted, a task listed as stopped (exited
    before the daemon subscribed), a container removed."""

    namespace = CRI_NAMESPACE

    def __init__(self, watch: UnservedWatch) -> None:
        self.watch = watch

    def listed(self, tasks: list[TaskInfo]) -> None:
        for task in tasks:
            if task.status == "stopped":
                self.watch.end(task.id, "containerd lists its task as stopped")

    def event(self, event: Event) -> None:
        cid = event.container_id
        if event.namespace != CRI_NAMESPACE or not cid:
            return
        if event.topic == CONTAINER_DELETE:
            self.watch.gone(cid)
        elif event.process_id == cid:  # the first process, not one exec'd into it
            self.watch.end(cid, f"containerd: {event.topic}")
