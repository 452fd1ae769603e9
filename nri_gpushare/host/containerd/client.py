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
does.  Errors are ContainerdError subclasses: the socket is missing or
refuses, or containerd went away or did not answer in time
(ContainerdUnavailable); the peer does not speak containerd's API
(NotContainerd); no such container (ContainerNotFound).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import h2.exceptions
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from nri_gpushare.host.containerd.generated.containerd import events as _ev
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
    "ContainerInfo",
    "ContainerNotFound",
    "ContainerdClient",
    "ContainerdError",
    "ContainerdUnavailable",
    "Event",
    "NotContainerd",
    "Subscription",
    "TaskInfo",
    "decode_envelope",
]

DEFAULT_SOCKET = "/run/containerd/containerd.sock"
NAMESPACE_HEADER = "containerd-namespace"
TASK_EXIT = "/tasks/exit"
TASK_DELETE = "/tasks/delete"
CONTAINER_DELETE = "/containers/delete"
_SUBSCRIBE = "/containerd.services.events.v1.Events/Subscribe"

# The payload message of each decoded topic, by its protobuf full name (the
# Any's type_url, with or without a "type.googleapis.com/"-style prefix).
_PAYLOADS: dict[str, tuple[str, type[Any]]] = {
    TASK_EXIT: ("containerd.events.TaskExit", _ev.TaskExit),
    TASK_DELETE: ("containerd.events.TaskDelete", _ev.TaskDelete),
    CONTAINER_DELETE: ("containerd.events.ContainerDelete", _ev.ContainerDelete),
}


class ContainerdError(RuntimeError):
    """containerd could not answer a request."""


class ContainerdUnavailable(ContainerdError):
    """The socket is missing, not a socket, or refuses connections."""


class NotContainerd(ContainerdError):
    """Something answers on the socket, but not containerd's gRPC API."""


class ContainerNotFound(ContainerdError, LookupError):
    """No container with that ID in that namespace."""

    def __init__(self, namespace: str, container_id: str) -> None:
        super().__init__(f"containerd has no container {container_id!r} in namespace {namespace!r}")
        self.namespace = namespace
        self.container_id = container_id


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    labels: dict[str, str]
    runtime: str
    created: datetime


@dataclass(frozen=True)
class TaskInfo:
    """One task (a container's init process) as Tasks.List reports it.  status
    is "created", "running", "stopped", "paused", "pausing" or "unknown"; pid
    is 0 where containerd could not ask the shim (status "unknown" then)."""

    id: str
    pid: int
    status: str


# containerd.v1.types.Status (api/types/task/task.proto) by number.
_TASK_STATUS = {1: "created", 2: "running", 3: "stopped", 4: "paused", 5: "pausing"}


@dataclass(frozen=True)
class Event:
    """One containerd event.  container_id, pid, exit_status and process_id
    (the exec ID; containerd gives the init process the container's ID) are
    set where the topic's payload has them, else None.  timestamp is when
    containerd published it (the envelope's; the Unix epoch if it had none)."""

    namespace: str
    topic: str
    container_id: str | None = None
    pid: int | None = None
    exit_status: int | None = None
    process_id: str | None = None
    timestamp: datetime | None = field(default=None, compare=False)


def _type_name(type_url: str) -> str:
    return type_url.rsplit("/", 1)[-1]


def decode_envelope(envelope: Any) -> Event:
    """An Event from an events.v1 Envelope: the payloads of /tasks/exit,
    /tasks/delete and /containers/delete are decoded, other topics (or a
    payload of an unexpected type, or one that does not parse: anyone with the
    socket can Publish) give the topic only."""
    namespace, topic = str(envelope.namespace), str(envelope.topic)
    timestamp: datetime | None = envelope.timestamp
    expected = _PAYLOADS.get(topic)
    if expected is None or _type_name(str(envelope.event.type_url)) != expected[0]:
        return Event(namespace, topic, timestamp=timestamp)
    try:
        payload = expected[1]().parse(bytes(envelope.event.value))
        if topic == CONTAINER_DELETE:
            return Event(namespace, topic, container_id=str(payload.id), timestamp=timestamp)
        return Event(
            namespace,
            topic,
            container_id=str(payload.container_id),
            pid=int(payload.pid),
            exit_status=int(payload.exit_status),
            # TaskDelete leaves id empty for the init process.
            process_id=str(payload.id) or str(payload.container_id),
            timestamp=timestamp,
        )
    except Exception:  # betterproto raises anything from EOFError to KeyError on bad bytes,
        # and may leave a field None (a group wire type): the topic only, as for any bad payload
        return Event(namespace, topic, timestamp=timestamp)


# grpclib's own errors for a response that is not a well-formed gRPC one (an
# HTTP/2 server that is not gRPC, or a gRPC server without the method).
_PROTOCOL_ERRORS = (
    "Received :status",
    "Missing content-type",
    "Invalid content-type",
    "Missing grpc-status",
    "Invalid grpc-status",
)


def _protocol_level(exc: GRPCError) -> bool:
    return (exc.message or "").startswith(_PROTOCOL_ERRORS)


# An HTTP/2 client's connection preface and an empty SETTINGS frame: any HTTP/2
# server (containerd's gRPC one included, even when busy) answers with SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04


async def _probe(socket_path: str, timeout: float) -> str:
    """What answers on the socket now: "http2" (a SETTINGS frame back to a
    preface), "nobody" (cannot connect), or "other" (anything else)."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        return "nobody"
    try:
        writer.write(_H2_PREFACE)
        header = await asyncio.wait_for(reader.readexactly(9), timeout)
        return "http2" if header[3] == _H2_SETTINGS else "other"
    except (OSError, asyncio.IncompleteReadError):
        return "other"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _not_containerd(socket_path: str, what: str, why: str) -> NotContainerd:
    return NotContainerd(
        f"{socket_path}: the peer {why} during {what}; is this containerd's gRPC socket "
        "(not its ttrpc socket)?"
    )


@contextlib.asynccontextmanager
async def _translated(socket_path: str, what: str, timeout: float) -> AsyncIterator[None]:
    """Turn grpclib's and the socket's errors into ContainerdErrors."""
    try:
        yield
    except TimeoutError as exc:
        if await _probe(socket_path, timeout) != "http2":
            raise _not_containerd(socket_path, what, "does not answer HTTP/2") from exc
        raise ContainerdUnavailable(
            f"{socket_path}: containerd did not answer {what} within {timeout:g}s"
        ) from exc
    except GRPCError as exc:
        if exc.status is Status.UNIMPLEMENTED or _protocol_level(exc):
            why = f"does not implement containerd's API ({exc.message or exc.status.name})"
            raise _not_containerd(socket_path, what, why) from exc
        if exc.status is Status.UNAVAILABLE:
            raise ContainerdUnavailable(f"{socket_path}: {what}: {exc.message}") from exc
        raise ContainerdError(
            f"containerd {what} failed: {exc.status.name}: {exc.message}"
        ) from exc
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ContainerdUnavailable(
            f"{socket_path}: cannot connect ({exc.strerror}); is containerd running?"
        ) from exc
    except (ProtocolError, h2.exceptions.ProtocolError) as exc:
        raise _not_containerd(socket_path, what, f"does not speak gRPC ({exc})") from exc
    except (StreamTerminatedError, ConnectionError, EOFError) as exc:
        # Lost: containerd went away (or restarts), or the peer is no HTTP/2 server.
        if await _probe(socket_path, timeout) == "other":
            raise _not_containerd(socket_path, what, f"closed the connection ({exc!r})") from exc
        raise ContainerdUnavailable(
            f"{socket_path}: the connection to containerd was lost during {what} ({exc!r})"
        ) from exc
    except OSError as exc:
        raise ContainerdUnavailable(f"{socket_path}: {what}: {exc}") from exc


class _Abandoned(Exception):
    """Tells grpclib's Stream.__aexit__ that the caller left mid-stream."""


class Subscription:
    """An open Events.Subscribe stream (ContainerdClient.subscribe): an async
    iterator of Events that never ends by itself: when containerd ends the
    stream or the connection, the next step raises ContainerdUnavailable (or
    the ContainerdError of the status containerd ended it with)."""

    def __init__(
        self,
        socket_path: str,
        timeout: float,
        stream: Stream[_events.SubscribeRequest, _events.Envelope],
    ) -> None:
        self._socket_path = socket_path
        self._timeout = timeout
        self._stream = stream

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        async with _translated(self._socket_path, "Events.Subscribe", self._timeout):
            envelope = await self._stream.recv_message()
            if envelope is None:
                await self._stream.recv_trailing_metadata()  # raises for an error status
        if envelope is None:
            raise ContainerdUnavailable(f"{self._socket_path}: containerd ended the event stream")
        return decode_envelope(envelope)


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
            async with _translated(self.socket_path, "Containers.Get", self.timeout):
                reply = await stub.get(request, timeout=self.timeout, metadata=self._ns(namespace))
        except ContainerdError as exc:
            cause = exc.__cause__
            if isinstance(cause, GRPCError) and cause.status is Status.NOT_FOUND:
                raise ContainerNotFound(namespace, container_id) from cause
            raise
        return {str(k): str(v) for k, v in reply.container.labels.items()}

    async def containers(self, namespace: str, filters: Iterable[str] = ()) -> list[ContainerInfo]:
        """The containers of a namespace, optionally filtered with containerd's
        filter syntax (e.g. ``labels."gpushare.io/gpu-memory"``)."""
        stub = _containers.ContainersStub(self._chan())
        request = _containers.ListContainersRequest(filters=list(filters))
        async with _translated(self.socket_path, "Containers.List", self.timeout):
            reply = await stub.list(request, timeout=self.timeout, metadata=self._ns(namespace))
        return [
            ContainerInfo(
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
        async with _translated(self.socket_path, "Namespaces.List", self.timeout):
            reply = await stub.list(_namespaces.ListNamespacesRequest(), timeout=self.timeout)
        return sorted(str(n.name) for n in reply.namespaces)

    async def tasks(self, namespace: str) -> list[TaskInfo]:
        """The tasks of a namespace (one per container that has one), as
        Tasks.List reports them.  containerd leaves out a task whose shim is
        gone or does not answer with NotFound/Unavailable."""
        stub = _tasks.TasksStub(self._chan())
        async with _translated(self.socket_path, "Tasks.List", self.timeout):
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
            async with _translated(self.socket_path, "Events.Subscribe", self.timeout):
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
