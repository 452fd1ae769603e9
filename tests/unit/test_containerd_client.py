"""nri_gpushare.host.containerd.client without containerd: event decoding from
payload bytes built with the bindings, the namespace header, Tasks.List and
Events.Subscribe against local gRPC servers, and the errors for a missing
socket and for a peer that is not containerd."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import betterproto.lib.google.protobuf as pb
import grpclib.events
import pytest
import pytest_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    NAMESPACE_HEADER,
    TASK_DELETE,
    TASK_EXIT,
    ContainerdClient,
    ContainerdError,
    ContainerdUnavailable,
    ContainerNotFound,
    Event,
    NotContainerd,
    TaskInfo,
    decode_envelope,
)
from nri_gpushare.host.containerd.generated.containerd import events as ev
from nri_gpushare.host.containerd.generated.containerd.services.containers import v1 as containers
from nri_gpushare.host.containerd.generated.containerd.services.events import v1 as events
from nri_gpushare.host.containerd.generated.containerd.services.tasks import v1 as tasks
from nri_gpushare.host.containerd.generated.containerd.v1 import types as task_types

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
# Bounds a wait that normally ends at once; nothing is asserted about time.
STUCK = 30.0


def _wire(namespace: str, topic: str, type_url: str, payload: bytes) -> bytes:
    """An Envelope as containerd sends it, built with the bindings."""
    envelope = events.Envelope(
        timestamp=WHEN,
        namespace=namespace,
        topic=topic,
        event=pb.Any(type_url=type_url, value=payload),
    )
    return bytes(envelope)


def _decode(data: bytes) -> Event:
    return decode_envelope(events.Envelope().parse(data))


def test_task_exit() -> None:
    payload = bytes(ev.TaskExit(container_id="c1", id="c1", pid=4242, exit_status=137))
    got = _decode(_wire("ns1", TASK_EXIT, "containerd.events.TaskExit", payload))
    assert got == Event("ns1", TASK_EXIT, "c1", pid=4242, exit_status=137, process_id="c1")
    assert got.timestamp == WHEN


def test_task_exit_of_an_exec() -> None:
    payload = bytes(ev.TaskExit(container_id="c1", id="exec7", pid=9, exit_status=0))
    got = _decode(_wire("ns1", TASK_EXIT, "containerd.events.TaskExit", payload))
    assert (got.container_id, got.process_id, got.pid, got.exit_status) == ("c1", "exec7", 9, 0)


def test_task_delete_init_process() -> None:
    # TaskDelete leaves id empty for the init process.
    payload = bytes(ev.TaskDelete(container_id="c2", pid=77, exit_status=1, exited_at=WHEN))
    got = _decode(_wire("k8s.io", TASK_DELETE, "containerd.events.TaskDelete", payload))
    assert got == Event("k8s.io", TASK_DELETE, "c2", pid=77, exit_status=1, process_id="c2")
    assert (got.namespace, got.timestamp) == ("k8s.io", WHEN)  # the envelope's, not exited_at


def test_envelope_without_a_timestamp_dates_from_the_epoch() -> None:
    payload = bytes(ev.ContainerDelete(id="c"))
    data = bytes(
        events.Envelope(
            namespace="n",
            topic=CONTAINER_DELETE,
            event=pb.Any(type_url="containerd.events.ContainerDelete", value=payload),
        )
    )
    assert _decode(data).timestamp == datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\x02\xff\xfe",  # container_id that is not UTF-8
        b"\x0a\x01a\x18\xff",  # ends inside pid's varint
        b"\x0d\x00",  # a fixed32 where a string is
        b"\x18" + b"\xff" * 11,  # a varint too long
        b"\x2a\x0a\x08" + b"\x80" * 8 + b"\x40",  # exited_at: 2**62 s, past any datetime
    ],
)
def test_payload_that_does_not_parse_gives_the_topic_only(payload: bytes) -> None:
    # Anyone who can reach the socket can Publish an event with any bytes.
    got = _decode(_wire("n", TASK_EXIT, "containerd.events.TaskExit", payload))
    assert got == Event("n", TASK_EXIT) and got.timestamp == WHEN


def test_container_delete() -> None:
    payload = bytes(ev.ContainerDelete(id="c3"))
    got = _decode(_wire("default", CONTAINER_DELETE, "containerd.events.ContainerDelete", payload))
    assert got == Event("default", CONTAINER_DELETE, "c3")
    assert got.pid is None and got.exit_status is None and got.process_id is None


def test_type_url_with_a_prefix() -> None:
    payload = bytes(ev.ContainerDelete(id="c4"))
    url = "type.googleapis.com/containerd.events.ContainerDelete"
    assert _decode(_wire("n", CONTAINER_DELETE, url, payload)).container_id == "c4"


def test_other_topics_give_the_topic_only() -> None:
    payload = bytes(ev.TaskStart(container_id="c5", pid=3))
    got = _decode(_wire("n", "/tasks/start", "containerd.events.TaskStart", payload))
    assert got == Event("n", "/tasks/start")


def test_unexpected_payload_type_gives_the_topic_only() -> None:
    payload = bytes(ev.TaskStart(container_id="c6", pid=3))
    got = _decode(_wire("n", TASK_EXIT, "containerd.events.TaskStart", payload))
    assert got == Event("n", TASK_EXIT)


def test_topic_filters() -> None:
    assert ContainerdClient.topic_filters([TASK_EXIT, CONTAINER_DELETE]) == [
        'topic=="/tasks/exit"',
        'topic=="/containers/delete"',
    ]


# --- errors, and the namespace header, against local servers ---


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-cd-") as d:  # short: unix socket paths
        yield Path(d)


async def test_missing_socket(sock_dir: Path) -> None:
    path = sock_dir / "containerd.sock"
    with pytest.raises(ContainerdUnavailable, match="does not exist"):
        async with ContainerdClient(path):
            pass


async def test_not_a_socket(sock_dir: Path) -> None:
    path = sock_dir / "file"
    path.write_text("")
    with pytest.raises(ContainerdUnavailable, match="not a unix socket"):
        async with ContainerdClient(path):
            pass


async def test_socket_nobody_listens_on(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens
    async with ContainerdClient(path) as cd:
        with pytest.raises(ContainerdUnavailable, match="is containerd running"):
            await cd.namespaces()


async def test_peer_that_is_not_grpc(sock_dir: Path) -> None:
    path = sock_dir / "http.sock"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, path=str(path))
    try:
        async with ContainerdClient(path, timeout=30) as cd:
            with pytest.raises(NotContainerd, match="containerd's gRPC socket"):
                await cd.labels("default", "c")
    finally:
        server.close()
        await server.wait_closed()


async def test_silent_peer(sock_dir: Path) -> None:
    path = sock_dir / "silent.sock"
    conns: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_unix_server(swallow, path=str(path))
    try:
        async with ContainerdClient(path, timeout=0.5) as cd:
            with pytest.raises(NotContainerd, match="does not answer HTTP/2"):
                await cd.containers("default")
    finally:
        for w in conns:
            w.close()
        server.close()
        await server.wait_closed()


class _Containers(containers.ContainersBase):
    async def get(self, get_container_request: containers.GetContainerRequest) -> Any:
        if get_container_request.id != "c1":
            raise GRPCError(Status.NOT_FOUND, f"container {get_container_request.id}: not found")
        return containers.GetContainerResponse(
            container=containers.Container(
                id="c1", labels={"gpushare.io/gpu-memory": "2Gi"}, created_at=WHEN
            )
        )

    async def list(self, list_containers_request: containers.ListContainersRequest) -> Any:
        if list_containers_request.filters == ["hang"]:
            await asyncio.Event().wait()
        return containers.ListContainersResponse(
            containers=[
                containers.Container(
                    id="c1",
                    labels={"a": "b"},
                    runtime=containers.ContainerRuntime(name="io.containerd.runc.v2"),
                    created_at=WHEN,
                )
            ]
        )


@pytest_asyncio.fixture
async def fake(sock_dir: Path) -> AsyncIterator[tuple[Path, list[dict[str, str]]]]:
    """A gRPC server with only a Containers service; records request metadata."""
    path = sock_dir / "fake.sock"
    server = Server([_Containers()])
    seen: list[dict[str, str]] = []

    async def on_request(event: grpclib.events.RecvRequest) -> None:
        seen.append({str(k): str(v) for k, v in event.metadata.items()})

    grpclib.events.listen(server, grpclib.events.RecvRequest, on_request)
    await server.start(path=str(path))
    try:
        yield path, seen
    finally:
        server.close()
        await server.wait_closed()


async def test_labels_send_the_namespace_header(fake: tuple[Path, list[dict[str, str]]]) -> None:
    path, seen = fake
    async with ContainerdClient(path) as cd:
        assert await cd.labels("my-ns", "c1") == {"gpushare.io/gpu-memory": "2Gi"}
    assert seen[-1][NAMESPACE_HEADER] == "my-ns"


async def test_not_found(fake: tuple[Path, list[dict[str, str]]]) -> None:
    path, _ = fake
    async with ContainerdClient(path) as cd:
        with pytest.raises(ContainerNotFound, match="'nope' in namespace 'ns'") as info:
            await cd.labels("ns", "nope")
    assert (info.value.namespace, info.value.container_id) == ("ns", "nope")
    assert isinstance(info.value, LookupError) and isinstance(info.value, ContainerdError)


async def test_list(fake: tuple[Path, list[dict[str, str]]]) -> None:
    path, seen = fake
    async with ContainerdClient(path) as cd:
        (info,) = await cd.containers("ns2", ['labels."a"'])
    assert (info.id, info.labels, info.runtime, info.created) == (
        "c1",
        {"a": "b"},
        "io.containerd.runc.v2",
        WHEN,
    )
    assert seen[-1][NAMESPACE_HEADER] == "ns2"


async def test_grpc_peer_that_does_not_answer_in_time(
    fake: tuple[Path, list[dict[str, str]]],
) -> None:
    path, _ = fake
    async with ContainerdClient(path, timeout=0.2) as cd:
        with pytest.raises(ContainerdUnavailable, match="did not answer Containers.List"):
            await cd.containers("ns", ["hang"])


async def test_grpc_peer_without_containerd_services(
    fake: tuple[Path, list[dict[str, str]]],
) -> None:
    path, _ = fake
    async with ContainerdClient(path) as cd:
        with pytest.raises(NotContainerd, match="Namespaces.List"):
            await cd.namespaces()


async def test_empty_namespace_is_refused(fake: tuple[Path, list[dict[str, str]]]) -> None:
    path, _ = fake
    async with ContainerdClient(path) as cd:
        with pytest.raises(ValueError, match="namespace"):
            await cd.labels("", "c1")


class _Tasks(tasks.TasksBase):
    async def list(self, list_tasks_request: tasks.ListTasksRequest) -> Any:
        S = task_types.Status
        return tasks.ListTasksResponse(
            tasks=[
                # containerd fills in id, not container_id.
                task_types.Process(id="run", pid=100, status=S.RUNNING),
                task_types.Process(id="gone", pid=101, status=S.STOPPED, exit_status=137),
                task_types.Process(id="new", status=S.CREATED, pid=102),
                task_types.Process(id="p", status=S.PAUSED, pid=103),
                task_types.Process(id="pp", status=S.PAUSING, pid=104),
                task_types.Process(id="u", status=S.UNKNOWN),
                task_types.Process(container_id="old-style", pid=105, status=S.RUNNING),
            ]
        )


async def test_tasks(sock_dir: Path) -> None:
    path = sock_dir / "tasks.sock"
    server = Server([_Tasks()])
    seen: list[dict[str, str]] = []

    async def on_request(event: grpclib.events.RecvRequest) -> None:
        seen.append({str(k): str(v) for k, v in event.metadata.items()})

    grpclib.events.listen(server, grpclib.events.RecvRequest, on_request)
    await server.start(path=str(path))
    try:
        async with ContainerdClient(path) as cd:
            got = await cd.tasks("ns3")
    finally:
        server.close()
        await server.wait_closed()
    assert got == [
        TaskInfo("run", 100, "running"),
        TaskInfo("gone", 101, "stopped"),
        TaskInfo("new", 102, "created"),
        TaskInfo("p", 103, "paused"),
        TaskInfo("pp", 104, "pausing"),
        TaskInfo("u", 0, "unknown"),
        TaskInfo("old-style", 105, "running"),
    ]
    assert seen[-1][NAMESPACE_HEADER] == "ns3"


def test_task_status_out_of_range_is_unknown() -> None:
    reply = tasks.ListTasksResponse().parse(b"\x0a\x05\x12\x01c\x20\x63")  # status 99
    assert int(reply.tasks[0].status) == 99


class _Events(events.EventsBase):
    """Records each Subscribe as it arrives; sends what is put in `out`
    (an Envelope, None to end the stream, or a GRPCError to fail it)."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[events.SubscribeRequest] = asyncio.Queue()
        self.out: asyncio.Queue[events.Envelope | GRPCError | None] = asyncio.Queue()

    async def subscribe(self, subscribe_request: events.SubscribeRequest) -> AsyncIterator[Any]:
        self.requests.put_nowait(subscribe_request)
        while True:
            item = await self.out.get()
            if item is None:
                return
            if isinstance(item, GRPCError):
                raise item
            yield item


@pytest_asyncio.fixture
async def events_server(sock_dir: Path) -> AsyncIterator[tuple[Path, _Events]]:
    path = sock_dir / "events.sock"
    service = _Events()
    server = Server([service])
    await server.start(path=str(path))
    try:
        yield path, service
    finally:
        server.close()
        await server.wait_closed()


def _envelope(topic: str, payload: Any, type_url: str) -> events.Envelope:
    return events.Envelope(
        timestamp=WHEN,
        namespace="ns",
        topic=topic,
        event=pb.Any(type_url=type_url, value=bytes(payload)),
    )


async def test_subscribe_has_sent_the_request_on_entry(
    events_server: tuple[Path, _Events],
) -> None:
    path, service = events_server
    filters = ContainerdClient.topic_filters([TASK_EXIT])
    async with ContainerdClient(path) as cd, cd.subscribe(filters) as subscription:
        # Nothing has been read from the subscription, yet containerd has it.
        request = await asyncio.wait_for(service.requests.get(), STUCK)
        assert request.filters == filters
        exit_ = ev.TaskExit(container_id="c", id="c", pid=9, exit_status=1)
        service.out.put_nowait(_envelope(TASK_EXIT, exit_, "containerd.events.TaskExit"))
        got = await asyncio.wait_for(anext(subscription), STUCK)
        assert got == Event("ns", TASK_EXIT, "c", pid=9, exit_status=1, process_id="c")
        service.out.put_nowait(None)
        with pytest.raises(ContainerdUnavailable, match="ended the event stream"):
            await asyncio.wait_for(anext(subscription), STUCK)


async def test_subscription_failed_by_containerd(events_server: tuple[Path, _Events]) -> None:
    path, service = events_server
    async with ContainerdClient(path) as cd, cd.subscribe() as subscription:
        service.out.put_nowait(GRPCError(Status.PERMISSION_DENIED, "no"))
        with pytest.raises(ContainerdError, match="PERMISSION_DENIED"):
            await asyncio.wait_for(anext(subscription), STUCK)


async def test_leaving_subscribe_ends_it_and_the_client_goes_on(
    events_server: tuple[Path, _Events],
) -> None:
    path, service = events_server
    async with ContainerdClient(path) as cd:
        async with cd.subscribe() as _:
            await asyncio.wait_for(service.requests.get(), STUCK)
        # The same connection serves a new subscription (and events() too).
        async with contextlib.aclosing(cd.events()) as stream:
            pending = asyncio.ensure_future(anext(stream))
            await asyncio.wait_for(service.requests.get(), STUCK)
            url = "containerd.events.ContainerDelete"
            service.out.put_nowait(_envelope(CONTAINER_DELETE, ev.ContainerDelete(id="x"), url))
            got = await asyncio.wait_for(pending, STUCK)
    assert (got.topic, got.container_id) == (CONTAINER_DELETE, "x")


async def test_subscribe_to_a_socket_nobody_listens_on(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    async with ContainerdClient(path) as cd:
        with pytest.raises(ContainerdUnavailable, match="is containerd running"):
            async with cd.subscribe():
                raise AssertionError("subscribed to nobody")


async def test_outside_async_with() -> None:
    with pytest.raises(ContainerdError, match="async with"):
        await ContainerdClient("/nonexistent").namespaces()
