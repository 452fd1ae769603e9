"""The plugin service without a socket: request bytes in, reply bytes out.

Covers the event table, Configure (timeouts, the plugin's own mask), the
v0.10 events (UpdatePodSandbox, PostUpdatePodSandbox,
ValidateContainerAdjustment), CreateContainer with container updates, and the
request-timeout warnings.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.api.lite import Adjustment
from nri_gpushare.nri.stub import Event, Plugin, PluginError, PluginService
from nri_gpushare.nri.stub.events import (
    ALL_MASK,
    BY_RPC,
    EVENTS,
    LEGACY_MASK,
    Delivery,
    describe_mask,
)
from nri_gpushare.nri.stub.plugin import implemented_events
from nri_gpushare.nri.wire import Code, TtrpcError

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
PROTO = (Path(__file__).parents[2] / "nri_gpushare" / "nri" / "api" / "nri.proto").read_text()
POD = nri.PodSandbox(id="pod1", name="p", namespace="default")
CTR = nri.Container(id="c1", name="c", pod_sandbox_id="pod1")
MODERN = nri.ConfigureRequest(runtime_name="containerd", runtime_version="v2.2.0")
LEGACY = nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24")


async def handle(service: PluginService, method: str, message: Any) -> bytes:
    return await service.handle(PLUGIN, method, bytes(message))


class Everything(Plugin):
    """Handles every event and records what it was given."""

    def __init__(self, mask: Any = None) -> None:
        self.mask = mask
        self.calls: list[tuple[Any, ...]] = []

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> Any:
        return self.mask


def _recorder(name: str) -> Any:
    async def record(self: Everything, *args: Any) -> None:
        self.calls.append((name, *args))

    return record


for _spec in EVENTS:
    setattr(Everything, _spec.handler, _recorder(_spec.handler))


# -- the event table ----------------------------------------------------------


def test_table_matches_the_schema_and_the_plugin_class() -> None:
    assert [int(spec.event) for spec in EVENTS] == list(range(1, 15))
    for spec in EVENTS:
        assert callable(getattr(Plugin, spec.handler))
        assert re.search(rf"\brpc {spec.rpc}\(", PROTO), spec.rpc
        assert hasattr(nri.PluginBase, spec.handler)  # the generated service names it too
    assert LEGACY_MASK == 0x7FF and ALL_MASK == 0x3FFF
    assert describe_mask(0x9) == "RUN_POD_SANDBOX|CREATE_CONTAINER"
    assert describe_mask(1 << 20) == "0x100000"


def test_every_rpc_of_the_table_is_served() -> None:
    from nri_gpushare.nri.stub.service import _METHODS

    assert set(BY_RPC) <= set(_METHODS)
    assert set(_METHODS) - set(BY_RPC) == {"Configure", "Synchronize", "Shutdown", "StateChange"}


def test_new_handlers_are_subscribed_only_when_overridden() -> None:
    class Validator(Plugin):
        async def validate_container_adjustment(self, pod, container, request):  # type: ignore[no-untyped-def]
            return None

    assert implemented_events(Plugin()) == set()
    assert implemented_events(Validator()) == {Event.VALIDATE_CONTAINER_ADJUSTMENT}
    assert implemented_events(Everything()) == {spec.event for spec in EVENTS}


# -- Configure -----------------------------------------------------------------


async def test_configure_records_the_runtime_timeouts() -> None:
    service = PluginService(Everything())
    assert (service.request_timeout, service.registration_timeout) == (2.0, 5.0)
    seen: list[lite.ConfigureRequestView] = []
    service.on_configure = seen.append
    request = nri.ConfigureRequest(
        runtime_name="containerd",
        runtime_version="1.7.24",
        registration_timeout=1500,
        request_timeout=250,
    )
    reply = await handle(service, "Configure", request)
    assert reply == b"\x10\xff\x0f"  # events (2) = 0x7FF: the legacy runtime's every event
    assert (service.request_timeout, service.registration_timeout) == (0.25, 1.5)
    assert [v.request_timeout for v in seen] == [250]
    # A runtime that sends no timeouts (NRI before v0.8) leaves them as they are.
    await handle(service, "Configure", LEGACY)
    assert (service.request_timeout, service.registration_timeout) == (0.25, 1.5)


async def test_a_new_connection_starts_from_the_default_timeouts() -> None:
    # The timeouts are the runtime's on this connection: after a reconnect, a
    # runtime that sends none (an older containerd) gets NRI's defaults, not
    # whatever the previous runtime said (1 ms would flood the log with warnings).
    service = PluginService(Everything())
    request = nri.ConfigureRequest(
        runtime_name="containerd", registration_timeout=1, request_timeout=1
    )
    await handle(service, "Configure", request)
    assert (service.request_timeout, service.registration_timeout) == (0.001, 0.001)
    service.begin()  # a new connection
    await handle(service, "Configure", LEGACY)
    assert (service.request_timeout, service.registration_timeout) == (2.0, 5.0)


@pytest.mark.parametrize(
    ("returned", "configure", "wire"),
    [
        (None, LEGACY, b"\x10\xff\x0f"),
        (None, MODERN, b"\x10\xff\x7f"),
        (1 << 3, LEGACY, b"\x10\x08"),
        ([Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER], LEGACY, b"\x10\x88\x08"),
        ({Event.VALIDATE_CONTAINER_ADJUSTMENT}, MODERN, b"\x10\x80\x40"),
    ],
)
async def test_configure_returns_the_plugins_mask(
    returned: Any, configure: Any, wire: bytes
) -> None:
    service = PluginService(Everything(returned))
    assert await handle(service, "Configure", configure) == wire
    assert service.events == nri.ConfigureResponse().parse(wire).events


@pytest.mark.parametrize(
    ("plugin", "configure", "message"),
    [
        (Everything(0), LEGACY, "subscribed to no event"),
        (Everything([Event.UPDATE_POD_SANDBOX]), LEGACY, "does not offer: UPDATE_POD_SANDBOX"),
        (Everything(1 << 20), MODERN, "without a handler: 0x100000"),
        (Plugin(), LEGACY, "handles no event"),
    ],
)
async def test_configure_refuses_a_mask_the_runtime_or_plugin_cannot_honour(
    plugin: Plugin, configure: Any, message: str
) -> None:
    with pytest.raises(TtrpcError) as info:
        await handle(PluginService(plugin), "Configure", configure)
    assert info.value.code == Code.UNKNOWN and message in info.value.message


async def test_configure_mask_may_not_name_unhandled_events() -> None:
    class Creator(Plugin):
        async def configure(self, config, runtime_name, runtime_version):  # type: ignore[no-untyped-def]
            return [Event.CREATE_CONTAINER, Event.START_CONTAINER]

        async def create_container(self, pod, container):  # type: ignore[no-untyped-def]
            return None

    with pytest.raises(TtrpcError, match="without a handler: START_CONTAINER"):
        await handle(PluginService(Creator()), "Configure", LEGACY)


# -- v0.10 events ----------------------------------------------------------------


async def test_update_pod_sandbox_gets_pod_and_resources() -> None:
    plugin = Everything()
    resources = nri.LinuxResources(cpu=nri.LinuxCpu(shares=nri.OptionalUInt64(value=512)))
    request = nri.UpdatePodSandboxRequest(pod=POD, linux_resources=resources)
    assert await handle(PluginService(plugin), "UpdatePodSandbox", request) == b""
    [(name, pod, overhead, got)] = plugin.calls
    assert (name, pod.id, overhead, got) == ("update_pod_sandbox", "pod1", None, resources)


async def test_update_pod_sandbox_without_handler_is_answered_empty() -> None:
    request = nri.UpdatePodSandboxRequest(pod=POD, linux_resources=nri.LinuxResources())
    assert await handle(PluginService(Plugin()), "UpdatePodSandbox", request) == b""


async def test_post_update_pod_sandbox_by_rpc_and_by_state_change() -> None:
    plugin = Everything()
    service = PluginService(plugin)
    assert (
        await handle(service, "PostUpdatePodSandbox", nri.PostUpdatePodSandboxRequest(pod=POD))
        == b""
    )
    event = nri.StateChangeEvent(event=Event.POST_UPDATE_POD_SANDBOX, pod=POD)
    assert await handle(service, "StateChange", event) == b""
    assert [(name, pod.id) for name, pod in plugin.calls] == [
        ("post_update_pod_sandbox", "pod1")
    ] * 2
    # Without a handler the per-event RPC is Unimplemented (the runtime falls back).
    with pytest.raises(TtrpcError) as info:
        await handle(
            PluginService(Plugin()),
            "PostUpdatePodSandbox",
            nri.PostUpdatePodSandboxRequest(pod=POD),
        )
    assert info.value.code == Code.UNIMPLEMENTED


def validation_request() -> nri.ValidateContainerAdjustmentRequest:
    return nri.ValidateContainerAdjustmentRequest(
        pod=POD,
        container=CTR,
        adjust=nri.ContainerAdjustment(env=[nri.KeyValue(key="A", value="1")]),
        plugins=[nri.PluginInstance(name="gpushare", index="10")],
    )


async def test_validate_container_adjustment_accepts_or_rejects() -> None:
    seen: list[tuple[str, str, list[str]]] = []

    class Validator(Plugin):
        async def validate_container_adjustment(self, pod, container, request):  # type: ignore[no-untyped-def]
            env = [kv.key for kv in request.message().adjust.env]
            seen.append((pod.id, container.id, env))
            if container.name == "bad":
                raise PluginError("no")

    service = PluginService(Validator())
    assert await handle(service, "ValidateContainerAdjustment", validation_request()) == b""
    bad = validation_request()
    bad.container = nri.Container(id="c2", name="bad")
    reply = await handle(service, "ValidateContainerAdjustment", bad)
    assert reply == b"\x08\x01\x12\x02no"  # reject (1) = true, reason (2) = "no"
    assert reply == bytes(nri.ValidateContainerAdjustmentResponse(reject=True, reason="no"))
    assert seen == [("pod1", "c1", ["A"]), ("pod1", "c2", ["A"])]


async def test_validation_errors_other_than_plugin_error_are_internal() -> None:
    class Broken(Plugin):
        async def validate_container_adjustment(self, pod, container, request):  # type: ignore[no-untyped-def]
            raise RuntimeError("kaboom")

    with pytest.raises(TtrpcError) as info:
        await handle(PluginService(Broken()), "ValidateContainerAdjustment", validation_request())
    assert info.value.code == Code.INTERNAL


async def test_unsubscribed_validation_accepts() -> None:
    reply = await handle(
        PluginService(Plugin()), "ValidateContainerAdjustment", validation_request()
    )
    assert reply == b""


# -- CreateContainer with updates ----------------------------------------------------

UPDATE = nri.ContainerUpdate(
    container_id="other",
    linux=nri.LinuxContainerUpdate(
        resources=nri.LinuxResources(memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30)))
    ),
)
CREATE = nri.CreateContainerRequest(pod=POD, container=CTR)


def creator(result: Any) -> Plugin:
    class Creator(Plugin):
        async def create_container(self, pod, container):  # type: ignore[no-untyped-def]
            return result

    return Creator()


@pytest.mark.parametrize(
    ("result", "want"),
    [
        (
            (Adjustment(env=[("A", "1")]), [UPDATE]),
            nri.CreateContainerResponse(
                adjust=nri.ContainerAdjustment(env=[nri.KeyValue(key="A", value="1")]),
                update=[UPDATE],
            ),
        ),
        (
            (nri.ContainerAdjustment(annotations={"k": "v"}), [UPDATE, UPDATE]),
            nri.CreateContainerResponse(
                adjust=nri.ContainerAdjustment(annotations={"k": "v"}), update=[UPDATE, UPDATE]
            ),
        ),
        ((None, [UPDATE]), nri.CreateContainerResponse(update=[UPDATE])),
        (None, nri.CreateContainerResponse()),
    ],
)
async def test_create_container_may_return_updates(result: Any, want: Any) -> None:
    reply = await handle(PluginService(creator(result)), "CreateContainer", CREATE)
    assert reply == bytes(want)


def _set_but_empty() -> nri.ContainerAdjustment:
    adjust = nri.ContainerAdjustment()
    adjust.linux = nri.LinuxContainerAdjustment()  # set, serializes to nothing
    return adjust


@pytest.mark.parametrize(
    "adjust",
    [
        nri.ContainerAdjustment(),
        _set_but_empty(),
        nri.ContainerAdjustment(
            env=[nri.KeyValue(key="A", value="1")],
            rlimits=[nri.PosixRlimit(type="RLIMIT_NOFILE", hard=2, soft=1)],
            cdi_devices=[nri.CdiDevice(name="vendor.com/gpu=0")],
        ),
    ],
)
async def test_a_betterproto_adjustment_is_sent_as_betterproto_sends_it(adjust: Any) -> None:
    reply = await handle(PluginService(creator((adjust, [UPDATE]))), "CreateContainer", CREATE)
    assert reply == bytes(nri.CreateContainerResponse(adjust=adjust, update=[UPDATE]))


async def test_an_empty_adjustment_is_sent_present() -> None:
    reply = await handle(PluginService(creator(Adjustment())), "CreateContainer", CREATE)
    assert reply == b"\x0a\x00"  # adjust (1), empty


async def test_create_container_update_bytes() -> None:
    reply = await handle(PluginService(creator((None, [UPDATE]))), "CreateContainer", CREATE)
    update = bytes(UPDATE)
    assert reply == b"\x12" + bytes([len(update)]) + update  # update (2), no adjust (1)


# -- request timeout ---------------------------------------------------------------------


async def test_handlers_past_the_request_timeout_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Slow(Plugin):
        async def start_container(self, pod, container):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.15)

    service = PluginService(Slow())
    request = nri.ConfigureRequest(runtime_name="containerd", request_timeout=50)
    await handle(service, "Configure", request)
    caplog.set_level(logging.WARNING, "nri_gpushare.nri.stub.service")
    start = nri.StartContainerRequest(pod=POD, container=CTR)
    await handle(service, "StartContainer", start)
    messages = [r.getMessage() for r in caplog.records]
    assert any("StartContainer is still running after 0.050 s" in m for m in messages), messages
    assert any(
        re.match(r"StartContainer answered after 0\.1\d+ s, past .* 0\.050 s", m) for m in messages
    )


async def test_handlers_within_the_request_timeout_are_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "nri_gpushare.nri.stub.service")
    await handle(
        PluginService(Everything()),
        "StartContainer",
        nri.StartContainerRequest(pod=POD, container=CTR),
    )
    assert not caplog.records


def test_notify_events_have_no_reply_data() -> None:
    for spec in EVENTS:
        empty_reply = f"message {spec.rpc}Response {{}}" in PROTO
        assert empty_reply or spec.delivery is Delivery.RPC, spec.rpc


# -- a connection that can no longer work ----------------------------------------------


class Failing(Everything):
    """Fails configure() or synchronize() with what it is given, or stalls them."""

    def __init__(self, configure: Any = None, synchronize: Any = None, stall: float = 0) -> None:
        super().__init__()
        self.failures = {"configure": configure, "synchronize": synchronize}
        self.stall = stall

    async def _maybe(self, what: str) -> None:
        if self.stall:
            await asyncio.sleep(self.stall)
        if self.failures[what] is not None:
            raise self.failures[what]

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> Any:
        await self._maybe("configure")

    async def synchronize(self, pods: Any, containers: Any) -> Any:
        await self._maybe("synchronize")
        return []


@pytest.mark.parametrize("method", ["Configure", "Synchronize"])
@pytest.mark.parametrize(
    "failure",
    [RuntimeError("crashed"), PluginError("refused"), RecursionError(), MemoryError()],
    ids=lambda exc: type(exc).__name__,
)
async def test_a_failed_configure_or_synchronize_breaks_the_connection(
    method: str, failure: BaseException
) -> None:
    service = PluginService(Failing(**{method.lower(): failure}))
    request = LEGACY if method == "Configure" else nri.SynchronizeRequest()
    with pytest.raises(TtrpcError) as info:
        await handle(service, method, request)
    assert service.broken.is_set() and not service.synchronized.is_set()
    assert service.failure == f"{method} failed: {info.value}"
    assert service.sessions == 0
    service.begin()  # the next connection starts whole
    assert not service.broken.is_set() and service.failure == ""


async def test_a_malformed_synchronize_chunk_breaks_the_connection() -> None:
    service = PluginService(Everything())
    with pytest.raises(TtrpcError) as info:
        await service.handle(PLUGIN, "Synchronize", b"\x12\x09garbage")
    assert info.value.code == Code.INVALID_ARGUMENT
    assert service.broken.is_set() and "malformed" in service.failure


async def test_updates_that_do_not_encode_leave_synchronize_unfinished() -> None:
    class BadUpdates(Everything):
        async def synchronize(self, pods: Any, containers: Any) -> Any:
            return ["not a message"]

    service = PluginService(BadUpdates())
    with pytest.raises(TtrpcError):
        await handle(service, "Synchronize", nri.SynchronizeRequest())
    assert service.broken.is_set()
    assert not service.synchronized.is_set() and service.sessions == 0


async def test_a_failed_event_leaves_the_connection_whole() -> None:
    class Refusing(Everything):
        async def create_container(self, pod: Any, container: Any) -> Any:
            raise RuntimeError("crashed")

    service = PluginService(Refusing())
    with pytest.raises(TtrpcError):
        await handle(service, "CreateContainer", nri.CreateContainerRequest(pod=POD, container=CTR))
    assert not service.broken.is_set()


async def test_a_synchronize_past_the_request_timeout_breaks_the_connection() -> None:
    service = PluginService(Failing(stall=0.15))
    service.request_timeout = 0.05
    task = asyncio.create_task(handle(service, "Synchronize", nri.SynchronizeRequest()))
    await asyncio.wait_for(service.broken.wait(), 5)  # while the handler still runs
    assert not task.done()
    assert service.failure == (
        "Synchronize is still running after 0.050 s, the runtime's request timeout:"
        " the runtime has given up waiting for it"
    )
    await task  # answered late: the failure stays the first one, and it does not count
    assert service.failure.startswith("Synchronize is still running")
    assert not service.synchronized.is_set() and service.sessions == 0


async def test_a_synchronize_answered_late_breaks_the_connection() -> None:
    class Blocking(Everything):
        async def synchronize(self, pods: Any, containers: Any) -> Any:
            time.sleep(0.1)  # blocks the loop: the watchdog cannot fire first
            return []

    service = PluginService(Blocking())
    service.request_timeout = 0.05
    await handle(service, "Synchronize", nri.SynchronizeRequest())
    assert service.broken.is_set() and not service.synchronized.is_set()
    assert re.match(r"Synchronize answered after 0\.1\d* s, past .* 0\.050 s", service.failure)


async def test_a_malformed_field_read_by_the_handler_answers_invalid_argument() -> None:
    # The views decode lazily: the request splits fine, and the handler's read
    # of a damaged field raises DecodeError, which the stub answers cleanly.
    read: list[str] = []

    class ReadsLabels(Plugin):
        async def create_container(self, pod: Any, container: Any) -> Any:
            read.append(container.id)
            return container.labels  # a label key that is not UTF-8

    service = PluginService(ReadsLabels())
    damaged = b"\x0a\x01c" + b"\x2a\x05\x0a\x01\xff\x12\x00"
    payload = b"\x0a\x00" + bytes((0x12, len(damaged))) + damaged
    with pytest.raises(TtrpcError) as info:
        await service.handle(PLUGIN, "CreateContainer", payload)
    assert info.value.code == Code.INVALID_ARGUMENT and read == ["c"]
    assert "CreateContainer: malformed request: malformed Container.labels" in info.value.message
    assert not service.broken.is_set()


@pytest.mark.parametrize("keeps", [False, True])
async def test_a_split_synchronize_goes_to_synchronize_part_then_synchronize(keeps: bool) -> None:
    seen: list[tuple[str, list[str], list[str]]] = []

    class Split(Plugin):
        async def stop_container(self, pod: Any, container: Any) -> Any:
            return []

        def synchronize_part(self, pods: Any, containers: Any) -> bool:
            seen.append(("part", [p.id for p in pods], [c.id for c in containers]))
            return keeps

        async def synchronize(self, pods: Any, containers: Any) -> Any:
            seen.append(("all", [p.id for p in pods], [c.id for c in containers]))
            return []

    service = PluginService(Split())
    await handle(service, "Configure", LEGACY)
    first = nri.SynchronizeRequest(pods=[POD], containers=[CTR], more=True)
    last = nri.SynchronizeRequest(containers=[nri.Container(id="c2")])
    assert await handle(service, "Synchronize", first) == lite.encode_synchronize_response(
        more=True
    )
    assert await handle(service, "Synchronize", last) == lite.encode_synchronize_response()
    assert seen == [
        ("part", ["pod1"], ["c1"]),
        ("all", [] if keeps else ["pod1"], ["c2"] if keeps else ["c1", "c2"]),
    ]
    assert service.synchronized.is_set()
