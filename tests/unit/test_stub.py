"""The plugin stub against a scripted fake runtime over a real unix socket.

The fake runtime uses the same wire layer in the other roles: it serves the
runtime service on conn 2 and calls the plugin on conn 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.stub import Event, Plugin, PluginError, Stub
from nri_gpushare.nri.stub.plugin import implemented_events, subscription_mask, valid_event_mask
from nri_gpushare.nri.wire import PLUGIN_CONN, RUNTIME_CONN, Code, MuxConnection, TtrpcError

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
ALL_LEGACY = (1 << 11) - 1
POD = nri.PodSandbox(id="pod1", name="p", namespace="default")


class FakeRuntime:
    """Accepts plugin connections and records their registrations."""

    def __init__(self) -> None:
        self.registered: asyncio.Queue[tuple[MuxConnection, nri.RegisterPluginRequest]] = (
            asyncio.Queue()
        )
        self.connections: list[MuxConnection] = []
        """Every connection, kept referenced: asyncio streams hold their reader weakly."""

    async def serve(self, path: str) -> asyncio.AbstractServer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = MuxConnection(reader, writer)
            self.connections.append(conn)

            async def runtime_service(service: str, method: str, payload: bytes) -> bytes:
                assert service == RUNTIME
                if method == "RegisterPlugin":
                    await self.registered.put((conn, nri.RegisterPluginRequest().parse(payload)))
                    return b""
                raise TtrpcError(Code.UNIMPLEMENTED, method)

            conn.serve(RUNTIME_CONN, runtime_service)

        return await asyncio.start_unix_server(accept, path=path)

    async def next_plugin(self) -> tuple[MuxConnection, nri.RegisterPluginRequest]:
        return await asyncio.wait_for(self.registered.get(), 5)


async def call(conn: MuxConnection, method: str, message: object) -> bytes:
    return await conn.client(PLUGIN_CONN).call(PLUGIN, method, bytes(message), timeout=5)


class Recorder(Plugin):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.synced: list[list[str]] = []

    async def configure(self, config, runtime_name, runtime_version):
        self.calls.append(("configure", runtime_version))

    async def synchronize(self, pods, containers):
        self.synced.append([c.id for c in containers])
        return []

    async def create_container(self, pod, container):
        self.calls.append(("create", container.id))
        if container.name == "bad":
            raise PluginError("gpushare.io/gpu-memory=lots: not a size")
        if container.name == "boom":
            raise RuntimeError("kaboom")
        return nri.ContainerAdjustment(env=[nri.KeyValue(key="INJECTED", value="1")])

    async def stop_container(self, pod, container):
        self.calls.append(("stop", container.id))
        return []

    async def remove_container(self, pod, container):
        self.calls.append(("remove", container.id))


@contextlib.asynccontextmanager
async def connected(
    tmp_path, plugin: Plugin
) -> AsyncIterator[tuple[FakeRuntime, MuxConnection, Stub]]:
    runtime = FakeRuntime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(plugin, name="test", index="42", socket_path=path, reconnect_delays=(0.01,))
    task = asyncio.create_task(stub.run())
    try:
        conn, _ = await runtime.next_plugin()
        yield runtime, conn, stub
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 5)
        server.close()


def container(cid: str, name: str = "c") -> nri.Container:
    return nri.Container(id=cid, name=name, pod_sandbox_id="pod1")


# -- masks ---------------------------------------------------------------------


def test_mask_follows_implemented_handlers():
    assert implemented_events(Recorder()) == {
        Event.CREATE_CONTAINER,
        Event.STOP_CONTAINER,
        Event.REMOVE_CONTAINER,
    }
    mask = subscription_mask(Recorder(), ALL_LEGACY)
    assert mask == (1 << 3) | (1 << 9) | (1 << 10)


def test_mask_is_never_zero():
    with pytest.raises(PluginError):
        subscription_mask(Plugin(), ALL_LEGACY)


@pytest.mark.parametrize(
    ("name", "version", "nri_version", "expected"),
    [
        ("containerd", "1.7.24~ds1", "", ALL_LEGACY),
        ("containerd", "v2.0.0", "", ALL_LEGACY),
        ("containerd", "v2.1.3", "", ALL_LEGACY),
        ("containerd", "v2.2.0", "", (1 << 14) - 1),
        ("containerd", "2.3.0", "", (1 << 14) - 1),
        ("cri-o", "1.31.0", "", ALL_LEGACY),
        ("cri-o", "1.35.0", "v0.12.0", (1 << 14) - 1),
        ("containerd", "garbage", "", ALL_LEGACY),
    ],
)
def test_valid_mask_by_runtime(name, version, nri_version, expected):
    assert valid_event_mask(name, version, nri_version) == expected


def test_index_must_be_two_digits():
    with pytest.raises(ValueError, match="two digits"):
        Stub(Recorder(), index="7")


# -- protocol --------------------------------------------------------------------


async def test_register_configure_synchronize_and_events(tmp_path):
    plugin = Recorder()
    async with connected(tmp_path, plugin) as (_, conn, stub):
        reply = nri.ConfigureResponse().parse(
            await call(
                conn,
                "Configure",
                nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"),
            )
        )
        assert reply.events == (1 << 3) | (1 << 9) | (1 << 10)
        await call(conn, "Synchronize", nri.SynchronizeRequest(containers=[container("a")]))
        assert stub.synchronized.is_set() and plugin.synced == [["a"]]

        reply = nri.CreateContainerResponse().parse(
            await call(
                conn,
                "CreateContainer",
                nri.CreateContainerRequest(pod=POD, container=container("b")),
            )
        )
        assert [(kv.key, kv.value) for kv in reply.adjust.env] == [("INJECTED", "1")]
        await call(
            conn, "StopContainer", nri.StopContainerRequest(pod=POD, container=container("b"))
        )
        await call(
            conn,
            "StateChange",
            nri.StateChangeEvent(
                event=nri.Event.REMOVE_CONTAINER, pod=POD, container=container("b")
            ),
        )
        # Events the plugin does not handle are accepted and ignored.
        await call(
            conn,
            "StateChange",
            nri.StateChangeEvent(
                event=nri.Event.START_CONTAINER, pod=POD, container=container("b")
            ),
        )
        assert plugin.calls == [
            ("configure", "1.7.24"),
            ("create", "b"),
            ("stop", "b"),
            ("remove", "b"),
        ]
        assert len(stub.handler_seconds["CreateContainer"]) == 1


async def test_registration_carries_name_and_index(tmp_path):
    runtime = FakeRuntime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(Recorder(), name="gpushare", index="07", socket_path=path)
    task = asyncio.create_task(stub.run())
    _, request = await runtime.next_plugin()
    assert (request.plugin_name, request.plugin_idx) == ("gpushare", "07")
    await stub.stop()
    await task
    server.close()


async def test_chunked_synchronize_delivers_everything_once(tmp_path):
    plugin = Recorder()
    async with connected(tmp_path, plugin) as (_, conn, _stub):
        await call(
            conn,
            "Configure",
            nri.ConfigureRequest(runtime_name="containerd", runtime_version="2.1.0"),
        )
        for chunk in (["a", "b"], ["c"]):
            reply = nri.SynchronizeResponse().parse(
                await call(
                    conn,
                    "Synchronize",
                    nri.SynchronizeRequest(containers=[container(i) for i in chunk], more=True),
                )
            )
            assert reply.more and not reply.update
        reply = nri.SynchronizeResponse().parse(
            await call(conn, "Synchronize", nri.SynchronizeRequest(containers=[container("d")]))
        )
        assert not reply.more
        assert plugin.synced == [["a", "b", "c", "d"]]


async def test_handler_errors_become_statuses(tmp_path):
    async with connected(tmp_path, Recorder()) as (_, conn, _stub):
        with pytest.raises(TtrpcError) as refused:
            await call(
                conn,
                "CreateContainer",
                nri.CreateContainerRequest(pod=POD, container=container("x", "bad")),
            )
        assert refused.value.code == Code.UNKNOWN
        assert refused.value.message == "gpushare.io/gpu-memory=lots: not a size"
        with pytest.raises(TtrpcError) as crashed:
            await call(
                conn,
                "CreateContainer",
                nri.CreateContainerRequest(pod=POD, container=container("y", "boom")),
            )
        assert crashed.value.code == Code.INTERNAL and "kaboom" in crashed.value.message
        # The connection survives both.
        await call(
            conn, "CreateContainer", nri.CreateContainerRequest(pod=POD, container=container("z"))
        )


async def test_unknown_and_unhandled_methods_are_unimplemented(tmp_path):
    async with connected(tmp_path, Recorder()) as (_, conn, _stub):
        for method, message in (
            ("NoSuchMethod", nri.Empty()),
            ("StartContainer", nri.StartContainerRequest(pod=POD, container=container("a"))),
        ):
            with pytest.raises(TtrpcError) as info:
                await call(conn, method, message)
            assert info.value.code == Code.UNIMPLEMENTED


async def test_v012_per_event_rpc_reaches_the_handler(tmp_path):
    plugin = Recorder()
    async with connected(tmp_path, plugin) as (_, conn, _stub):
        await call(
            conn,
            "RemoveContainer",
            nri.RemoveContainerRequest(pod=nri.PodSandbox(id="pod1"), container=container("v12")),
        )
        assert ("remove", "v12") in plugin.calls


async def test_reconnects_after_the_runtime_drops_it(tmp_path):
    plugin = Recorder()
    async with connected(tmp_path, plugin) as (runtime, conn, stub):
        await call(
            conn,
            "Configure",
            nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"),
        )
        await call(conn, "Synchronize", nri.SynchronizeRequest())
        await conn.close()
        conn2, _ = await runtime.next_plugin()
        await call(
            conn2,
            "Configure",
            nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"),
        )
        await call(conn2, "Synchronize", nri.SynchronizeRequest(containers=[container("a")]))
        assert stub.sessions == 2 and plugin.synced == [[], ["a"]]


async def test_keeps_trying_while_the_runtime_is_away(tmp_path):
    path = str(tmp_path / "nri.sock")
    stub = Stub(Recorder(), socket_path=path, reconnect_delays=(0.01,))
    task = asyncio.create_task(stub.run())
    await asyncio.sleep(0.1)  # no socket yet: connection refused, retried
    runtime = FakeRuntime()
    server = await runtime.serve(path)
    await runtime.next_plugin()
    await stub.stop()
    await asyncio.wait_for(task, 5)
    server.close()


async def test_malformed_request_is_invalid_argument(tmp_path):
    async with connected(tmp_path, Recorder()) as (_, conn, _stub):
        with pytest.raises(TtrpcError) as info:
            await conn.client(PLUGIN_CONN).call(PLUGIN, "CreateContainer", b"\x0a\x05ab", timeout=5)
        assert info.value.code == Code.INVALID_ARGUMENT
        assert "malformed" in info.value.message


async def test_full_message_is_available_to_handlers(tmp_path):
    seen = []

    class Deep(Plugin):
        async def create_container(self, pod, container):
            seen.append(container.message().args)
            return None

    async with connected(tmp_path, Deep()) as (_, conn, _stub):
        reply = await call(
            conn,
            "CreateContainer",
            nri.CreateContainerRequest(
                pod=POD, container=nri.Container(id="a", args=["sleep", "1"])
            ),
        )
        assert reply == b""
    assert seen == [["sleep", "1"]]


async def test_unknown_event_numbers_are_ignored(tmp_path):
    plugin = Recorder()
    async with connected(tmp_path, plugin) as (_, conn, _stub):
        for event in (99, 0, nri.Event.CREATE_CONTAINER):  # unknown, none, not a StateChange one
            reply = await call(
                conn,
                "StateChange",
                nri.StateChangeEvent(event=event, pod=POD, container=container("u")),
            )
            assert reply == b""  # an empty Empty: accepted
        # The connection still serves, and none of the above reached a handler.
        await call(
            conn,
            "StateChange",
            nri.StateChangeEvent(
                event=nri.Event.REMOVE_CONTAINER, pod=POD, container=container("k")
            ),
        )
    assert plugin.calls == [("remove", "k")]


async def test_stop_while_connecting_returns(tmp_path):
    runtime = FakeRuntime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(Recorder(), socket_path=path)
    task = asyncio.create_task(stub.run())
    await stub.stop()  # before the connection is up
    await asyncio.wait_for(task, 5)
    server.close()


async def test_backoff_never_exceeds_one_second(tmp_path):
    """containerd expects a plugin back within 2 s of a restart: drive the real
    reconnect loop against a socket that is not there, with a fake pause."""
    stub = Stub(Recorder(), socket_path=str(tmp_path / "absent.sock"))
    delays: list[float] = []

    async def pause(delay: float) -> None:
        delays.append(delay)
        if len(delays) == 12:
            await stub.stop()

    stub._pause = pause  # type: ignore[method-assign]
    await asyncio.wait_for(stub.run(), 5)
    assert len(delays) == 12
    assert all(0 < d <= 1.0 for d in delays), delays
    assert delays == sorted(delays) and delays[0] < delays[-1], delays
    assert delays[-3:] == [1.0] * 3  # it settles at the ceiling


async def _closing_sessions(tmp_path, *, synchronize: bool) -> list[float]:
    """The reconnect delays of a stub whose first three sessions the runtime
    closes, after Configure and Synchronize or right after registration."""
    runtime = FakeRuntime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(Recorder(), socket_path=path)
    delays: list[float] = []

    async def pause(delay: float) -> None:
        delays.append(delay)

    stub._pause = pause  # type: ignore[method-assign]
    task = asyncio.create_task(stub.run())
    for _ in range(3):
        conn, _ = await runtime.next_plugin()
        if synchronize:
            await call(conn, "Configure", nri.ConfigureRequest(runtime_name="containerd"))
            await call(conn, "Synchronize", nri.SynchronizeRequest())
        await conn.close()
    await runtime.next_plugin()
    await stub.stop()
    await asyncio.wait_for(task, 5)
    server.close()
    return delays


async def test_backoff_starts_over_after_a_synchronized_session(tmp_path):
    assert await _closing_sessions(tmp_path, synchronize=True) == [0.05, 0.05, 0.05]


async def test_backoff_goes_on_while_sessions_never_synchronize(tmp_path):
    # A runtime that accepts the registration but never synchronizes us (or a
    # Synchronize that keeps failing) is not retried 20 times a second.
    assert await _closing_sessions(tmp_path, synchronize=False) == [0.05, 0.1, 0.2]


class SilentRuntime(FakeRuntime):
    """Never answers RegisterPlugin; sends Configure as a runtime does."""

    def __init__(self, configure: nri.ConfigureRequest | None) -> None:
        super().__init__()
        self.configure = configure

    async def serve(self, path: str) -> asyncio.AbstractServer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = MuxConnection(reader, writer)
            self.connections.append(conn)

            async def runtime_service(service: str, method: str, payload: bytes) -> bytes:
                await self.registered.put((conn, nri.RegisterPluginRequest().parse(payload)))
                if self.configure is not None:
                    await call(conn, "Configure", self.configure)
                await asyncio.sleep(3600)
                return b""

            conn.serve(RUNTIME_CONN, runtime_service)

        return await asyncio.start_unix_server(accept, path=path)


async def test_registration_waits_the_runtimes_registration_timeout(tmp_path):
    configure = nri.ConfigureRequest(
        runtime_name="containerd", registration_timeout=100, request_timeout=300
    )
    runtime = SilentRuntime(configure)
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    # Assumed 60 s: only Configure's 0.1 s lets the registration give up in time.
    stub = Stub(Recorder(), socket_path=path, reconnect_delays=(0.01,), registration_timeout=60)
    configured = stub.service.on_configure
    assert configured is not None
    seen = []

    def spy(request: lite.ConfigureRequestView) -> None:
        configured(request)
        seen.append((stub.registration_timeout, stub.request_timeout))

    stub.service.on_configure = spy
    task = asyncio.create_task(stub.run())
    await runtime.next_plugin()
    # The first registration gave up after Configure's 0.1 s, not the assumed 60 s
    # (a hang guard, not a timing threshold).
    await asyncio.wait_for(runtime.next_plugin(), 30)
    # What the first connection's Configure said (the reconnect starts from the assumed).
    assert seen[0] == (0.1, 0.3)
    await stub.stop()
    await asyncio.wait_for(task, 5)
    server.close()


async def test_registration_timeout_without_configure(tmp_path):
    """A runtime that never says (containerd 1.7): the configured timeout applies."""
    runtime = SilentRuntime(None)
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(Recorder(), socket_path=path, reconnect_delays=(0.01,), registration_timeout=0.1)
    task = asyncio.create_task(stub.run())
    await runtime.next_plugin()
    await runtime.next_plugin()  # gave up after the configured 0.1 s and reconnected
    await stub.stop()
    await asyncio.wait_for(task, 5)
    server.close()
