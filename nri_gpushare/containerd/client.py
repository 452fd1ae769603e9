"""A thin asyncio client of containerd's gRPC API (grpclib + the betterproto
bindings in generated/): a container's labels, the containers and namespaces
that exist, and the event stream.

    async with ContainerdClient("/run/containerd/containerd.sock") as cd:
        labels = await cd.labels("default", "my-container")
        async for event in cd.events(['topic~="^/(tasks/(exit|delete)|containers/delete)$"']):
            ...

Namespaced requests carry the ``containerd-namespace`` gRPC metadata header, as
containerd's own client does.  Errors are ContainerdError subclasses: the
socket is missing or refuses (ContainerdUnavailable), the peer does not speak
containerd's API (NotContainerd), no such container (ContainerNotFound).
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import h2.exceptions
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from .generated.containerd import events as _ev
from .generated.containerd.services.containers import v1 as _containers
from .generated.containerd.services.events import v1 as _events
from .generated.containerd.services.namespaces import v1 as _namespaces

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
    "decode_envelope",
]

DEFAULT_SOCKET = "/run/containerd/containerd.sock"
NAMESPACE_HEADER = "containerd-namespace"
TASK_EXIT = "/tasks/exit"
TASK_DELETE = "/tasks/delete"
CONTAINER_DELETE = "/containers/delete"

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
class Event:
    """One containerd event.  container_id, pid, exit_status and process_id
    (the exec ID; containerd gives the init process the container's ID) are
    set where the topic's payload has them, else None."""

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
    payload of an unexpected type) give the topic only."""
    namespace, topic = str(envelope.namespace), str(envelope.topic)
    timestamp: datetime | None = envelope.timestamp
    expected = _PAYLOADS.get(topic)
    if expected is None or _type_name(str(envelope.event.type_url)) != expected[0]:
        return Event(namespace, topic, timestamp=timestamp)
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


@contextmanager
def _translated(socket_path: str, what: str) -> Iterator[None]:
    """Turn grpclib's and the socket's errors into ContainerdErrors."""
    try:
        yield
    except GRPCError as exc:
        if exc.status is Status.UNIMPLEMENTED or _protocol_level(exc):
            raise NotContainerd(
                f"{socket_path}: the peer does not implement containerd's {what} "
                f"({exc.message or exc.status.name}); is this containerd's gRPC socket?"
            ) from exc
        if exc.status is Status.UNAVAILABLE:
            raise ContainerdUnavailable(f"{socket_path}: {what}: {exc.message}") from exc
        raise ContainerdError(
            f"containerd {what} failed: {exc.status.name}: {exc.message}"
        ) from exc
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ContainerdUnavailable(
            f"{socket_path}: cannot connect ({exc.strerror}); is containerd running?"
        ) from exc
    except (ProtocolError, StreamTerminatedError, h2.exceptions.ProtocolError) as exc:
        raise NotContainerd(
            f"{socket_path}: the peer does not speak gRPC ({exc!r}); "
            "is this containerd's gRPC socket (not its ttrpc socket)?"
        ) from exc
    except (ConnectionError, EOFError) as exc:
        raise NotContainerd(
            f"{socket_path}: the peer closed the connection during {what} ({exc!r}); "
            "is this containerd's gRPC socket?"
        ) from exc
    except OSError as exc:
        raise ContainerdUnavailable(f"{socket_path}: {what}: {exc}") from exc


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
            with _translated(self.socket_path, "Containers.Get"):
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
        with _translated(self.socket_path, "Containers.List"):
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
        with _translated(self.socket_path, "Namespaces.List"):
            reply = await stub.list(_namespaces.ListNamespacesRequest(), timeout=self.timeout)
        return sorted(str(n.name) for n in reply.namespaces)

    async def events(
        self, filters: Iterable[str] = (), namespace: str | None = None
    ) -> AsyncIterator[Event]:
        """containerd's events, in every namespace unless one is given, as they
        happen, until the caller stops iterating or the connection ends (a
        ContainerdError).  Filters use containerd's syntax, ORed:
        ``topic=="/tasks/exit"``, ``namespace==default``.  Close the iterator
        (contextlib.aclosing) to end the subscription before the client."""
        stub = _events.EventsStub(self._chan())
        request = _events.SubscribeRequest(filters=list(filters))
        metadata = self._ns(namespace) if namespace is not None else None
        with _translated(self.socket_path, "Events.Subscribe"):
            async for envelope in stub.subscribe(request, metadata=metadata):
                yield decode_envelope(envelope)
        raise ContainerdError("containerd ended the event stream")

    @staticmethod
    def topic_filters(topics: Iterable[str]) -> list[str]:
        """Subscribe filters matching exactly these topics."""
        return [f'topic=="{t}"' for t in topics]
