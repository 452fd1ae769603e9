"""A thin asyncio client of containerd's gRPC API (grpclib + the betterproto
bindings in generated/): a container's labels, the containers, tasks and
namespaces that exist, and the event stream.

    async with ContainerdClient("/run/containerd/containerd.sock") as cd:
        labels = await cd.labels("default", "my-container")
        topics = ContainerdClient.topic_filters([TASK_EXIT, TASK_DELETE, CONTAINER_DELETE])
        async with cd.subscribe(topics) as events:   # the request is sent here
            tasks = await cd.tasks("default")         # ... so nothing after it is missed
            async for event in events:
                ...

Namespaced requests (Containers.Get/List, Tasks.List) carry the
``containerd-namespace`` gRPC metadata header, as containerd's own client
does.  Errors are ContainerdError subclasses (`errors`): the socket is
missing or refuses, or containerd went away or did not answer in time
(ContainerdUnavailable); the peer does not speak containerd's API
(NotContainerd); no such container (ContainerNotFound).  The topics, Event
and Subscription are in `events`; this module exports them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from nri_gpushare.host.containerd.errors import (
    ContainerdError,
    ContainerdUnavailable,
    ContainerNotFound,
    NotContainerd,
    translated,
)
from nri_gpushare.host.containerd.events import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    Event,
    Subscription,
    decode_envelope,
)
from nri_gpushare.host.containerd.generated.containerd.services.containers import v1 as _containers
from nri_gpushare.host.containerd.generated.containerd.services.events import v1 as _events
from nri_gpushare.host.containerd.generated.containerd.services.namespaces import v1 as _namespaces
from nri_gpushare.host.containerd.generated.containerd.services.tasks import v1 as _tasks

__all__ = [
    "CONTAINER_DELETE",
    "DEFAULT_SOCKET",
    "NAMESPACE_HEADER",
    "TASK_DELETE",
    "TASK_EXIT",
    "ContainerNotFound",
    "ContainerRecord",
    "ContainerdClient",
    "ContainerdError",
    "ContainerdUnavailable",
    "Event",
    "NotContainerd",
    "Subscription",
    "TaskInfo",
    "TaskStatus",
    "decode_envelope",
]

DEFAULT_SOCKET = "/run/containerd/containerd.sock"
NAMESPACE_HEADER = "containerd-namespace"
_SUBSCRIBE = "/containerd.services.events.v1.Events/Subscribe"


@dataclass(frozen=True)
class ContainerRecord:
    """One container as Containers.List reports it (not the share domain's
    `ContainerInfo`: what containerd stores, labels and all)."""

    id: str
    labels: dict[str, str]
    runtime: str
    created: datetime


TaskStatus = Literal["created", "running", "stopped", "paused", "pausing", "unknown"]


@dataclass(frozen=True)
class TaskInfo:
    """One task (a container's init process) as Tasks.List reports it.  status
    is "created", "running", "stopped", "paused", "pausing" or "unknown"; pid
    is 0 where containerd could not ask the shim (status "unknown" then)."""

    id: str
    pid: int
    status: TaskStatus


# containerd.v1.types.Status (api/types/task/task.proto) by number.
_TASK_STATUS: dict[int, TaskStatus] = {
    1: "created",
    2: "running",
    3: "stopped",
    4: "paused",
    5: "pausing",
}


class _Abandoned(Exception):
    """Tells grpclib's Stream.__aexit__ that the caller left mid-stream."""


class ContainerdClient:
    """An async context manager holding one HTTP/2 connection to containerd."""

    def __init__(
        self, socket_path: str | os.PathLike[str] = DEFAULT_SOCKET, *, timeout: float = 10.0
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout
        self._channel: Channel | None = None

    async def __aenter__(self) -> ContainerdClient:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise ContainerdUnavailable(
                f"containerd socket {self.socket_path} does not exist; is containerd running?"
            ) from None
        except OSError as exc:
            raise ContainerdUnavailable(f"containerd socket {self.socket_path}: {exc}") from exc
        if not stat.S_ISSOCK(mode):
            raise ContainerdUnavailable(f"{self.socket_path} is not a unix socket")
        self._channel = Channel(path=self.socket_path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _chan(self) -> Channel:
        if self._channel is None:
            raise ContainerdError("ContainerdClient used outside `async with`")
        return self._channel

    @staticmethod
    def _ns(namespace: str) -> dict[str, str]:
        if not namespace:
            raise ValueError("a containerd namespace is required")
        return {NAMESPACE_HEADER: namespace}

    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        """The labels of one container (ContainerNotFound if there is none)."""
        stub = _containers.ContainersStub(self._chan())
        request = _containers.GetContainerRequest(id=container_id)
        try:
            async with translated(self.socket_path, "Containers.Get", self.timeout):
                reply = await stub.get(request, timeout=self.timeout, metadata=self._ns(namespace))
        except ContainerdError as exc:
            cause = exc.__cause__
            if isinstance(cause, GRPCError) and cause.status is Status.NOT_FOUND:
                raise ContainerNotFound(namespace, container_id) from cause
            raise
        return {str(k): str(v) for k, v in reply.container.labels.items()}

    async def containers(
        self, namespace: str, filters: Iterable[str] = ()
    ) -> list[ContainerRecord]:
        """The containers of a namespace, optionally filtered with containerd's
        filter syntax (e.g. ``labels."gpushare.io/gpu-memory"``)."""
        stub = _containers.ContainersStub(self._chan())
        request = _containers.ListContainersRequest(filters=list(filters))
        async with translated(self.socket_path, "Containers.List", self.timeout):
            reply = await stub.list(request, timeout=self.timeout, metadata=self._ns(namespace))
        return [
            ContainerRecord(
                id=str(c.id),
                labels={str(k): str(v) for k, v in c.labels.items()},
                runtime=str(c.runtime.name),
                created=c.created_at,
            )
            for c in reply.containers
        ]

    async def namespaces(self) -> list[str]:
        """The names of all namespaces, sorted."""
        stub = _namespaces.NamespacesStub(self._chan())
        async with translated(self.socket_path, "Namespaces.List", self.timeout):
            reply = await stub.list(_namespaces.ListNamespacesRequest(), timeout=self.timeout)
        return sorted(str(n.name) for n in reply.namespaces)

    async def tasks(self, namespace: str) -> list[TaskInfo]:
        """The tasks of a namespace (one per container that has one), as
        Tasks.List reports them.  containerd leaves out a task whose shim is
        gone or does not answer with NotFound/Unavailable."""
        stub = _tasks.TasksStub(self._chan())
        async with translated(self.socket_path, "Tasks.List", self.timeout):
            reply = await stub.list(
                _tasks.ListTasksRequest(), timeout=self.timeout, metadata=self._ns(namespace)
            )
        return [
            TaskInfo(
                # containerd fills in id (the container's ID), not container_id.
                id=str(p.id) or str(p.container_id),
                pid=int(p.pid),
                status=_TASK_STATUS.get(int(p.status), "unknown"),
            )
            for p in reply.tasks
        ]

    @contextlib.asynccontextmanager
    async def subscribe(self, filters: Iterable[str] = ()) -> AsyncIterator[Subscription]:
        """Subscribe to containerd's events in every namespace (containerd's
        Subscribe ignores the namespace header; filter with ``namespace==NAME``).
        On entry the request has been written to containerd, so what is asked
        after it (a listing to reconcile with) is not older than the stream;
        iterate the Subscription for the events.  Filters use containerd's
        syntax, ORed: ``topic=="/tasks/exit"``, ``namespace==default``.  Leaving
        the block ends the subscription."""
        request = _events.SubscribeRequest(filters=list(filters))
        stream: Stream[_events.SubscribeRequest, _events.Envelope] = self._chan().request(
            _SUBSCRIBE, Cardinality.UNARY_STREAM, _events.SubscribeRequest, _events.Envelope
        )
        await stream.__aenter__()  # no I/O: sets up grpclib's bookkeeping
        try:
            async with translated(self.socket_path, "Events.Subscribe", self.timeout):
                await asyncio.wait_for(stream.send_message(request, end=True), self.timeout)
            yield Subscription(self.socket_path, self.timeout, stream)
        finally:
            # As if abandoned mid-stream: reset the HTTP/2 stream, wait for nothing.
            with contextlib.suppress(Exception):
                await stream.__aexit__(_Abandoned, _Abandoned(), None)

    async def events(self, filters: Iterable[str] = ()) -> AsyncIterator[Event]:
        """subscribe() as one async iterator: containerd's events as they
        happen, until the caller stops iterating or the connection ends
        (ContainerdUnavailable: containerd stopped or restarted; subscribe
        again and reconcile).  Close the iterator (contextlib.aclosing) to end
        the subscription before the client.  The request is sent on the first
        iteration; use subscribe() to know it has been."""
        async with self.subscribe(filters) as subscription:
            async for event in subscription:
                yield event

    @staticmethod
    def topic_filters(topics: Iterable[str]) -> list[str]:
        """Subscribe filters matching exactly these topics."""
        return [f'topic=="{t}"' for t in topics]
