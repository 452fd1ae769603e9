"""nri_gpushare.containerd.client without containerd: event decoding from
payload bytes built with the bindings, the namespace header, and the errors
for a missing socket and for a peer that is not containerd."""

from __future__ import annotations

import asyncio
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

from nri_gpushare.containerd.client import (
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
    decode_envelope,
)
from nri_gpushare.containerd.generated.containerd import events as ev
from nri_gpushare.containerd.generated.containerd.services.containers import v1 as containers
from nri_gpushare.containerd.generated.containerd.services.events import v1 as events

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


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


async def test_outside_async_with() -> None:
    with pytest.raises(ContainerdError, match="async with"):
        await ContainerdClient("/nonexistent").namespaces()
