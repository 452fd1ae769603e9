"""Every way an NRI session can break: the stub drops it and the next one synchronizes.

A scripted fake runtime over a real unix socket (the wire layer in the other
roles) breaks the first session one way or another; each test then checks
that the stub closed it (or saw it closed), says why in `last_error`, and
synchronizes on its next connection.  The ways:

a. Configure fails; b. Synchronize fails; c. no Synchronize comes after
registration; d. no RegisterPlugin reply; e. the runtime closes the connection
or sends garbage; f. a handler runs past the request timeout; g. anything
unexpected inside the session (and a runtime-launched plugin, which cannot
reconnect, makes run() raise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from nri_gpushare.nri.api import nri
from nri_gpushare.nri.stub import Plugin, PluginError, Stub
from nri_gpushare.nri.stub.runtime import RuntimeConnectionLost
from nri_gpushare.nri.wire import PLUGIN_CONN, RUNTIME_CONN, Code, MuxConnection, TtrpcError
from nri_gpushare.nri.wire.mux import encode_frames
from nri_gpushare.nri.wire.ttrpc import encode_message

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
POD = nri.PodSandbox(id="pod1", name="p", namespace="default")
CTR = nri.Container(id="c1", name="c", pod_sandbox_id="pod1")
FAST = nri.ConfigureRequest(
    runtime_name="containerd",
    runtime_version="1.7.24",
    registration_timeout=100,
    request_timeout=100,
)
"""A Configure announcing short timeouts (0.1 s each), for the tests that wait them out."""
DEFAULT = nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24")


class FakeRuntime:
    """Accepts plugin connections; answers RegisterPlugin unless told to stay silent."""

    def __init__(self) -> None:
        self.registered: asyncio.Queue[MuxConnection] = asyncio.Queue()
        self.silent_registrations = 0
        """How many of the next RegisterPlugin calls get no reply."""
        self.connections: list[MuxConnection] = []
        """Every connection, kept referenced: asyncio streams hold their reader weakly."""

    def attach(self, conn: MuxConnection) -> None:
        self.connections.append(conn)

        async def runtime_service(service: str, method: str, payload: bytes) -> bytes:
            assert (service, method) == (RUNTIME, "RegisterPlugin")
            await self.registered.put(conn)
            if self.silent_registrations:
                self.silent_registrations -= 1
                await asyncio.sleep(3600)
            return b""

        conn.serve(RUNTIME_CONN, runtime_service)

    async def serve(self, path: str) -> asyncio.AbstractServer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.attach(MuxConnection(reader, writer))

        return await asyncio.start_unix_server(accept, path=path)

    async def next_plugin(self) -> MuxConnection:
        return await asyncio.wait_for(self.registered.get(), 10)


async def call(conn: MuxConnection, method: str, message: Any, timeout: float = 5) -> bytes:
    return await conn.client(PLUGIN_CONN).call(PLUGIN, method, bytes(message), timeout=timeout)


async def call_raw(conn: MuxConnection, method: str, payload: bytes) -> bytes:
    return await conn.client(PLUGIN_CONN).call(PLUGIN, method, payload, timeout=5)


async def dropped(conn: MuxConnection) -> None:
    """The stub has closed (or seen the end of) this runtime-side connection."""
    await asyncio.wait_for(conn.wait_closed(), 10)


class Recorder(Plugin):
    """Records calls; `fail` makes the next calls of a handler raise what it holds."""

    def __init__(self) -> None:
        self.configured = 0
        self.synced: list[list[str]] = []
        self.created: list[str] = []
        self.cancelled: list[str] = []
        self.fail: dict[str, list[BaseException]] = {}
        self.stall: dict[str, float] = {}

    def _maybe_fail(self, handler: str) -> None:
        pending = self.fail.get(handler)
        if pending:
            raise pending.pop(0)

    async def _maybe_stall(self, handler: str) -> None:
        delay = self.stall.pop(handler, 0.0)
        if delay:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self.cancelled.append(handler)
                raise

    async def configure(self, config, runtime_name, runtime_version):  # type: ignore[no-untyped-def]
        self.configured += 1
        self._maybe_fail("configure")

    async def synchronize(self, pods, containers):  # type: ignore[no-untyped-def]
        self._maybe_fail("synchronize")
        await self._maybe_stall("synchronize")
        self.synced.append([c.id for c in containers])
        return []

    async def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        self.created.append(container.id)
        await self._maybe_stall("create_container")
        return None


@contextlib.asynccontextmanager
async def running(
    tmp_path: Any, plugin: Plugin, **kwargs: Any
) -> AsyncIterator[tuple[FakeRuntime, Stub]]:
    runtime = FakeRuntime()
    path = str(tmp_path / "nri.sock")
    server = await runtime.serve(path)
    stub = Stub(
        plugin, name="test", index="42", socket_path=path, reconnect_delays=(0.01,), **kwargs
    )
    task = asyncio.create_task(stub.run())
    try:
        yield runtime, stub
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)
        server.close()


async def synchronize(conn: MuxConnection, configure: nri.ConfigureRequest = DEFAULT) -> None:
    """Configure and Synchronize as a runtime does after registration."""
    await call(conn, "Configure", configure)
    await call(conn, "Synchronize", nri.SynchronizeRequest(containers=[CTR]))


async def next_session_synchronizes(runtime: FakeRuntime, stub: Stub, sessions: int) -> None:
    conn = await runtime.next_plugin()
    assert not stub.synchronized.is_set()
    await synchronize(conn)
    assert stub.synchronized.is_set() and stub.sessions == sessions
    # ... and then gets events.
    await call(conn, "CreateContainer", nri.CreateContainerRequest(pod=POD, container=CTR))


def lost(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The stub's warnings about dropped sessions."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "nri_gpushare.nri.stub.runtime" and r.levelno >= logging.WARNING
    ]


# -- a. Configure fails -------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message either")


@pytest.mark.parametrize(
    ("failure", "payload", "code"),
    [
        (RuntimeError("configure crashed"), None, Code.INTERNAL),
        (PluginError("bad config"), None, Code.UNKNOWN),
        (Unprintable(), None, Code.INTERNAL),
        (None, b"\x0a\x05ab", Code.INVALID_ARGUMENT),  # config (1) cut short
    ],
)
async def test_a_failed_configure_drops_the_session(
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    failure: BaseException | None,
    payload: bytes | None,
    code: Code,
) -> None:
    caplog.set_level(logging.WARNING)
    plugin = Recorder()
    if failure is not None:
        plugin.fail["configure"] = [failure]
    async with running(tmp_path, plugin) as (runtime, stub):
        conn = await runtime.next_plugin()
        with pytest.raises(TtrpcError) as info:  # answered, not cut off
            await call_raw(conn, "Configure", payload or bytes(DEFAULT))
        assert info.value.code == code
        await dropped(conn)
        await next_session_synchronizes(runtime, stub, sessions=1)
        assert stub.last_error.startswith("Configure failed"), stub.last_error
    assert any("Configure failed" in m and "reconnecting" in m for m in lost(caplog))


async def test_a_configure_the_plugin_cannot_honour_drops_the_session(tmp_path: Any) -> None:
    class Picky(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.masks: list[Any] = [0]  # subscribes to nothing, then to the default

        async def configure(self, config, runtime_name, runtime_version):  # type: ignore[no-untyped-def]
            return self.masks.pop(0) if self.masks else None

    async with running(tmp_path, Picky()) as (runtime, stub):
        conn = await runtime.next_plugin()
        with pytest.raises(TtrpcError, match="subscribed to no event"):
            await call(conn, "Configure", DEFAULT)
        await dropped(conn)
        await next_session_synchronizes(runtime, stub, sessions=1)


# -- b. Synchronize fails -----------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("synchronize crashed"),
        PluginError("cannot read the module"),
        RecursionError("maximum recursion depth exceeded"),
        OverflowError("int too large to convert"),
        MemoryError(),
        Unprintable(),
    ],
    ids=lambda exc: type(exc).__name__,
)
async def test_b_a_failed_synchronize_is_answered_then_dropped(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, failure: BaseException
) -> None:
    caplog.set_level(logging.WARNING)
    plugin = Recorder()
    plugin.fail["synchronize"] = [failure]
    async with running(tmp_path, plugin) as (runtime, stub):
        conn = await runtime.next_plugin()
        await call(conn, "Configure", DEFAULT)
        with pytest.raises(TtrpcError) as info:  # the runtime gets the error first
            await call(conn, "Synchronize", nri.SynchronizeRequest(containers=[CTR]))
        assert info.value.code in (Code.INTERNAL, Code.UNKNOWN)
        await dropped(conn)
        assert not stub.synchronized.is_set() and stub.sessions == 0
        await next_session_synchronizes(runtime, stub, sessions=1)
        assert stub.last_error.startswith("Synchronize failed"), stub.last_error
        assert plugin.synced == [["c1"]]
    assert any("Synchronize failed" in m for m in lost(caplog))


async def test_b_a_synchronize_chunk_that_does_not_decode_drops_the_session(
    tmp_path: Any,
) -> None:
    plugin = Recorder()
    async with running(tmp_path, plugin) as (runtime, stub):
        conn = await runtime.next_plugin()
        await call(conn, "Configure", DEFAULT)
        await call(conn, "Synchronize", nri.SynchronizeRequest(containers=[CTR], more=True))
        with pytest.raises(TtrpcError) as info:
            await call_raw(conn, "Synchronize", b"\x12\x09garbage")  # containers (2) cut short
        assert info.value.code == Code.INVALID_ARGUMENT
        await dropped(conn)
        # The next session starts from nothing: the first chunk is not handed on.
        await next_session_synchronizes(runtime, stub, sessions=1)
        assert plugin.synced == [["c1"]]
        assert "malformed" in stub.last_error


# -- c. no Synchronize after registration -------------------------------------------


async def test_c_no_synchronize_after_registration_drops_the_session(tmp_path: Any) -> None:
    async with running(tmp_path, Recorder()) as (runtime, stub):
        conn = await runtime.next_plugin()
        await call(conn, "Configure", FAST)  # then the runtime stalls
        await dropped(conn)
        assert stub.last_error == "no Synchronize within 0.2 s of registration"
        await next_session_synchronizes(runtime, stub, sessions=1)


async def test_c_without_configure_the_assumed_timeouts_apply(tmp_path: Any) -> None:
    timeouts = {"registration_timeout": 0.05, "request_timeout": 0.05}
    async with running(tmp_path, Recorder(), **timeouts) as (runtime, stub):
        conn = await runtime.next_plugin()  # registered, and nothing more
        await dropped(conn)
        assert stub.last_error == "no Synchronize within 0.1 s of registration"


async def test_c_a_synchronized_session_has_no_deadline(tmp_path: Any) -> None:
    async with running(tmp_path, Recorder()) as (runtime, stub):
        conn = await runtime.next_plugin()
        await synchronize(conn, FAST)
        await asyncio.sleep(0.5)  # well past registration + request timeout
        assert not conn.closed and stub.synchronized.is_set()
        await call(conn, "CreateContainer", nri.CreateContainerRequest(pod=POD, container=CTR))
        assert stub.last_error == ""


# -- d. no RegisterPlugin reply -----------------------------------------------------


async def test_d_no_registration_reply_drops_the_session(tmp_path: Any) -> None:
    async with running(tmp_path, Recorder(), registration_timeout=0.1) as (runtime, stub):
        runtime.silent_registrations = 1
        conn = await runtime.next_plugin()
        await dropped(conn)
        assert "RegisterPlugin: no reply within" in stub.last_error
        await next_session_synchronizes(runtime, stub, sessions=1)


# -- e. the runtime closes the connection or breaks the protocol ---------------------


def _garbage(conn: MuxConnection) -> None:
    conn._writer.write(b"\xff" * 8)  # a mux header declaring a 4 GiB frame


def _bad_ttrpc(conn: MuxConnection) -> None:
    message = encode_message(1, 9, b"")  # no such ttrpc message type
    conn._writer.write(b"".join(encode_frames(PLUGIN_CONN, message)))


@pytest.mark.parametrize(
    ("breaks", "reason"),
    [
        (None, "the runtime closed the connection"),
        (_garbage, "connection failed: mux frame for conn 4294967295 declares"),
        (_bad_ttrpc, "connection failed: conn 1: unknown ttrpc message type 9"),
    ],
    ids=["closed", "garbage", "bad-ttrpc"],
)
async def test_e_a_closed_or_garbled_connection_is_replaced(
    tmp_path: Any, breaks: Callable[[MuxConnection], None] | None, reason: str
) -> None:
    async with running(tmp_path, Recorder()) as (runtime, stub):
        conn = await runtime.next_plugin()
        await synchronize(conn)
        if breaks is None:
            await conn.close()
        else:
            breaks(conn)
            await dropped(conn)
        await next_session_synchronizes(runtime, stub, sessions=2)
        assert stub.last_error.startswith(reason), stub.last_error


# -- f. a handler past the request timeout -------------------------------------------


async def test_f_runtime_closes_a_plugin_whose_event_handler_overran(tmp_path: Any) -> None:
    """containerd gives up on the request and closes the plugin (its isFatalError)."""
    plugin = Recorder()
    plugin.stall["create_container"] = 3600
    async with running(tmp_path, plugin) as (runtime, stub):
        conn = await runtime.next_plugin()
        await synchronize(conn, FAST)
        with pytest.raises(TtrpcError) as info:
            await call(
                conn,
                "CreateContainer",
                nri.CreateContainerRequest(pod=POD, container=CTR),
                timeout=0.1,
            )
        assert info.value.code == Code.DEADLINE_EXCEEDED
        await conn.close()
        await next_session_synchronizes(runtime, stub, sessions=2)
        assert plugin.cancelled == ["create_container"]  # the stalled handler did not linger


async def test_f_a_synchronize_past_the_request_timeout_is_dropped(tmp_path: Any) -> None:
    """NRI 0.6 keeps a plugin whose Synchronize timed out, but never uses it: drop it."""
    plugin = Recorder()
    plugin.stall["synchronize"] = 3600
    async with running(tmp_path, plugin) as (runtime, stub):
        conn = await runtime.next_plugin()
        await call(conn, "Configure", FAST)
        with pytest.raises(TtrpcError) as info:
            await call(conn, "Synchronize", nri.SynchronizeRequest(), timeout=0.1)
        assert info.value.code == Code.DEADLINE_EXCEEDED  # the runtime gave up, kept the link
        await dropped(conn)  # the stub did not
        assert plugin.cancelled == ["synchronize"]
        assert "Synchronize is still running after 0.100 s" in stub.last_error
        await next_session_synchronizes(runtime, stub, sessions=1)


async def test_f_a_synchronize_answered_late_is_dropped(tmp_path: Any) -> None:
    """A handler that blocks the loop answers before the watchdog can fire."""

    class Blocking(Recorder):
        async def synchronize(self, pods, containers):  # type: ignore[no-untyped-def]
            if not self.synced:
                time.sleep(0.15)  # on purpose: the loop cannot run
            return await super().synchronize(pods, containers)

    # A long registration window: only the request timeout (0.1 s) is waited
    # out, so a loaded machine's slow Synchronize cannot hit the session's
    # watchdog (registration + request timeout) first.
    late = nri.ConfigureRequest(
        runtime_name="containerd",
        runtime_version="1.7.24",
        registration_timeout=5000,
        request_timeout=100,
    )
    async with running(tmp_path, Blocking()) as (runtime, stub):
        conn = await runtime.next_plugin()
        await call(conn, "Configure", late)
        await call(conn, "Synchronize", nri.SynchronizeRequest())  # the reply still goes out
        await dropped(conn)
        assert "Synchronize answered after" in stub.last_error
        await next_session_synchronizes(runtime, stub, sessions=2)


# -- g. anything unexpected ----------------------------------------------------------


@pytest.mark.parametrize(
    "failure", [ValueError("a bug in the stub"), Unprintable()], ids=["ValueError", "unprintable"]
)
async def test_g_an_unexpected_error_in_the_session_is_logged_and_survived(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, failure: Exception
) -> None:
    caplog.set_level(logging.WARNING)
    plugin = Recorder()
    path = str(tmp_path / "nri.sock")
    runtime = FakeRuntime()
    server = await runtime.serve(path)
    stub = Stub(plugin, socket_path=path, reconnect_delays=(0.01,))
    register = stub._register
    failures = [failure]

    async def flaky_register(connection: MuxConnection) -> None:
        await register(connection)
        if failures:
            raise failures.pop()

    stub._register = flaky_register  # type: ignore[method-assign]
    task = asyncio.create_task(stub.run())
    try:
        conn = await runtime.next_plugin()
        await dropped(conn)
        await next_session_synchronizes(runtime, stub, sessions=1)
        assert stub.last_error.startswith(f"unexpected {type(failure).__name__}")
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)
        server.close()
    [record] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None


async def _preconnected() -> tuple[FakeRuntime, Stub, asyncio.Task[None], MuxConnection]:
    ours, theirs = socket.socketpair()
    runtime = FakeRuntime()
    runtime.attach(await MuxConnection.from_socket(theirs))
    stub = Stub(Recorder(), preconnected=ours, reconnect_delays=(0.01,))
    task = asyncio.create_task(stub.run())
    conn = await runtime.next_plugin()
    await synchronize(conn)
    return runtime, stub, task, conn


async def test_g_a_runtime_launched_plugin_whose_session_breaks_raises() -> None:
    _, stub, task, conn = await _preconnected()
    await conn.close()
    with pytest.raises(RuntimeConnectionLost, match="the runtime closed the connection"):
        await asyncio.wait_for(task, 10)
    assert stub.last_error == "the runtime closed the connection"


async def test_g_a_runtime_launched_plugin_that_is_stopped_returns() -> None:
    _, stub, task, conn = await _preconnected()
    await stub.stop()
    await asyncio.wait_for(task, 10)  # no exception
    await dropped(conn)
    assert stub.last_error == ""
