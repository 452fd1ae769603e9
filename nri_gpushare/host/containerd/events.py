"""containerd's events: the topics the plugin follows, an Event from an
events.v1 Envelope (`decode_envelope`), and an open Events.Subscribe stream
(`Subscription`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from grpclib.client import Stream

from nri_gpushare.host.containerd.errors import ContainerdUnavailable, translated
from nri_gpushare.host.containerd.generated.containerd import events as _ev
from nri_gpushare.host.containerd.generated.containerd.services.events import v1 as _events

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
        async with translated(self._socket_path, "Events.Subscribe", self._timeout):
            envelope = await self._stream.recv_message()
            if envelope is None:
                await self._stream.recv_trailing_metadata()  # raises for an error status
        if envelope is None:
            raise ContainerdUnavailable(f"{self._socket_path}: containerd ended the event stream")
        return decode_envelope(envelope)
