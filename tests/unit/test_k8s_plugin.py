"""The device plugin's service and state with a fake daemon status and a fake
clock, and its registration in-process against the test kubelet: Allocate's
answer, refusals, preferred allocation, grants held until the daemon shows
them or they expire, health, ListAndWatch updates, re-registration."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nri_gpushare.cli.main import main
from nri_gpushare.k8s import HEALTHY, UNHEALTHY, endpoint
from nri_gpushare.k8s.capacity import Device, Grant
from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.health import GpuHealth
from nri_gpushare.k8s.registration import DevicePlugin
from nri_gpushare.k8s.service import DevicePluginService
from nri_gpushare.k8s.state import PENDING_TTL, PluginState
from nri_gpushare.names import CORE, COUNT, KUBELET_ANNOTATIONS, MEMORY, RESOURCES
from nri_gpushare.share.model import Gpu
from tests.k8s.kubelet import TestKubelet, healthy

GiB = 1 << 30
MiB = 1 << 20
RESERVE = 512 * MiB
GPUS = [Gpu(i, f"GPU-{i}", "Sim", 16 * GiB, i) for i in range(2)]


def status_doc(
    allocations: tuple[dict[str, Any], ...] = (), used_gib: tuple[int, ...] = (0, 0)
) -> dict[str, Any]:
    """The parts of the daemon's status document the plugin reads."""
    return {
        "policy": {"max_inst": 16, "memory_reserve_bytes": RESERVE},
        "gpus": [
            {
                "index": g.index,
                "memory_total": g.memory_bytes,
                "memory_reserved": RESERVE,
                "memory_free": g.memory_bytes - RESERVE - used * GiB,
                "core_allocated": 0,
                "containers": ["c"] * bool(used),
            }
            for g, used in zip(GPUS, used_gib, strict=True)
        ],
        "allocations": list(allocations),
    }


class Daemon:
    """A fake status source: the document, or an error when `down`."""

    def __init__(self) -> None:
        self.doc = status_doc()
        self.down = False

    def __call__(self) -> dict[str, Any]:
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        return self.doc


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def daemon() -> Daemon:
    return Daemon()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def state(daemon: Daemon, clock: Clock) -> PluginState:
    s = PluginState(GPUS, RESERVE, 16, status=daemon, clock=clock)
    await s.refresh()
    return s


def ids(devices: tuple[Device, ...], health: str = HEALTHY) -> list[str]:
    """The IDs listed with `health`."""
    return [d.id for d in devices if (HEALTHY if d.healthy else UNHEALTHY) == health]


def allocate_request(*containers: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


async def test_lists_what_the_daemon_can_place(state: PluginState) -> None:
    # 16 GiB less 512 MiB reserve: 15 whole GiB per GPU.
    assert [len(ids(state.devices[s])) for s in (MEMORY, CORE, COUNT)] == [30, 200, 2]
    assert ids(state.devices[MEMORY]) == [str(n) for n in range(30)]
    assert not ids(state.devices[MEMORY], UNHEALTHY)


async def test_daemon_down_lists_every_device_unhealthy(state: PluginState, daemon: Daemon) -> None:
    daemon.down = True
    await state.refresh()
    for short, count in ((MEMORY, 30), (CORE, 200), (COUNT, 2)):
        assert len(state.devices[short]) == count
        assert not ids(state.devices[short])
    daemon.down = False
    await state.refresh()
    assert len(ids(state.devices[MEMORY])) == 30


@pytest.mark.parametrize(
    "doc",
    [
        {"gpus": [{"index": 0}]},  # no memory_total
        {"gpus": [{"index": "x", "memory_total": 1, "memory_free": 1}]},
        {"gpus": 3},
        {"gpus": [], "allocations": 7},
        {"gpus": [], "policy": []},
    ],
)
async def test_a_document_not_understood_is_the_daemon_down(
    state: PluginState, daemon: Daemon, doc: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    daemon.doc = doc
    await state.refresh()
    assert len(state.devices[MEMORY]) == 30 and not ids(state.devices[MEMORY])
    assert "the document is not understood" in caplog.text
    daemon.doc = status_doc()
    await state.refresh()
    assert len(ids(state.devices[MEMORY])) == 30


async def test_allocate_answers_the_annotation(state: PluginState) -> None:
    service = DevicePluginService(MEMORY, state)
    reply = await service.allocate(allocate_request(["7", "0", "1", "2"], ["9"]))
    first, second = reply.container_responses
    assert first.annotations == {"gpushare.io/kubelet.gpu-memory": "0-2,7"}
    assert second.annotations == {KUBELET_ANNOTATIONS[MEMORY]: "9"}
    assert not first.envs and not first.mounts and not first.devices
    assert state.pending == (Grant(MEMORY, frozenset({0, 1, 2, 7})), Grant(MEMORY, frozenset({9})))
    # The granted IDs stay healthy (the kubelet counts them as in use) and
    # five fewer others are: the allocatable for new containers is 25.
    assert len(ids(state.devices[MEMORY])) == 30


async def test_allocate_core_and_count(state: PluginState) -> None:
    core = await DevicePluginService(CORE, state).allocate(allocate_request(["150", "151"]))
    assert core.container_responses[0].annotations == {KUBELET_ANNOTATIONS[CORE]: "150-151"}
    count = await DevicePluginService(COUNT, state).allocate(allocate_request(["1"]))
    assert count.container_responses[0].annotations == {"gpushare.io/kubelet.gpu-count": "1"}


@pytest.mark.parametrize(
    "devices, words",
    [
        (["30"], "are not advertised"),  # memory lists 0..29
        (["99999"], "are not advertised"),
        (["100000"], "is not a device ID"),
        (["-1"], "is not a device ID"),
        (["0x1"], "is not a device ID"),
        (["１"], "is not a device ID"),  # a fullwidth digit
        (["1 "], "is not a device ID"),
        ([""], "is not a device ID"),
        (["9" * 5000], "is not a device ID"),
        ([], "without device IDs"),
        (["3", "3"], "repeats device IDs"),
    ],
)
async def test_allocate_refuses(state: PluginState, devices: list[str], words: str) -> None:
    service = DevicePluginService(MEMORY, state)
    with pytest.raises(GRPCError) as err:
        # A good container first: nothing of the call may count as handed out.
        await service.allocate(allocate_request(["0"], devices))
    assert err.value.status == Status.INVALID_ARGUMENT
    assert words in str(err.value.message)
    assert "gpushare.io/gpu-memory" in str(err.value.message)
    assert len(str(err.value.message)) < 300
    assert state.pending == ()


async def test_preferred_allocation(state: PluginState) -> None:
    service = DevicePluginService(MEMORY, state)
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(["12", "3", "10", "2", "25"], ["25"], 3),
            pb.ContainerPreferredAllocationRequest(["4", "5"], [], 0),
            pb.ContainerPreferredAllocationRequest(["4", "5"], ["5"], 1),
        ]
    )
    reply = await service.get_preferred_allocation(request)
    # Numeric order, not text order ("10" < "2" as text).
    assert [list(r.device_i_ds) for r in reply.container_responses] == [
        ["25", "2", "3"],
        [],
        ["5"],
    ]
    for bad in (
        pb.ContainerPreferredAllocationRequest(["1"], [], 2),
        pb.ContainerPreferredAllocationRequest(["x"], [], 1),
    ):
        with pytest.raises(GRPCError) as err:
            await service.get_preferred_allocation(
                pb.PreferredAllocationRequest(container_requests=[bad])
            )
        assert err.value.status == Status.INVALID_ARGUMENT


async def test_options_offer_preferred_allocation(state: PluginState) -> None:
    options = await DevicePluginService(CORE, state).get_device_plugin_options(pb.Empty())
    assert options.get_preferred_allocation_available and not options.pre_start_required


async def test_grant_is_held_until_the_daemon_shows_it(state: PluginState, daemon: Daemon) -> None:
    service = DevicePluginService(MEMORY, state)
    await service.allocate(allocate_request(["0", "1", "2", "3"]))
    await state.refresh()
    assert state.pending == (Grant(MEMORY, frozenset({0, 1, 2, 3})),)
    # The daemon placed the container: its IDs are live, the grant is done.
    daemon.doc = status_doc(({"kubelet": {MEMORY: "0-3"}},), used_gib=(4, 0))
    await state.refresh()
    assert not state.pending
    devices = state.devices[MEMORY]
    assert ids(devices)[:4] == ["0", "1", "2", "3"]  # held by the live container
    assert len(ids(devices)) == 30  # 4 live + 11 + 15 free


async def test_grant_expires(state: PluginState, clock: Clock) -> None:
    await DevicePluginService(COUNT, state).allocate(allocate_request(["0"]))
    clock.now += PENDING_TTL - 1
    await state.refresh()
    assert state.pending == (Grant(COUNT, frozenset({0})),)
    clock.now += 1
    await state.refresh()
    assert not state.pending


async def test_grant_survives_the_daemon_being_down(
    state: PluginState, daemon: Daemon, clock: Clock
) -> None:
    await DevicePluginService(MEMORY, state).allocate(allocate_request(["5"]))
    daemon.down = True
    clock.now += 10
    await state.refresh()
    assert state.pending == (Grant(MEMORY, frozenset({5})),)


async def test_unhealthy_gpu(daemon: Daemon, clock: Clock) -> None:
    sick: set[int] = set()
    state = PluginState(GPUS, RESERVE, 16, status=daemon, health=lambda: set(sick), clock=clock)
    await state.refresh()
    assert len(ids(state.devices[COUNT])) == 2
    sick.add(1)
    await state.refresh()
    assert len(ids(state.devices[COUNT])) == 1
    assert len(ids(state.devices[MEMORY])) == 15
    assert len(ids(state.devices[CORE])) == 100


class FakeNvml:
    def __init__(self, broken: set[int], init_fails: bool = False, count: int = 4) -> None:
        self.broken = broken
        self.init_fails = init_fails
        self.count = count
        self.shutdown = False

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.broken and index % 2:
            raise RuntimeError("GPU is lost")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:
        if handle in self.broken:
            raise RuntimeError("Unknown Error")
        return object()

    def nvmlShutdown(self) -> None:
        self.shutdown = True


def test_health_from_nvml() -> None:
    nvml = FakeNvml({1, 2})
    health = GpuHealth(True, nvml)
    assert health.active
    assert health.unhealthy([0, 1, 2, 3]) == {1, 2}  # handle and memory-info failures
    health.close()
    assert nvml.shutdown and health.unhealthy([0, 1]) == frozenset()


def test_health_without_nvml() -> None:
    assert GpuHealth(True, FakeNvml({0}, init_fails=True)).unhealthy([0]) == frozenset()
    assert GpuHealth(False, FakeNvml({0})).unhealthy([0]) == frozenset()
    # NVML without GPUs: the static inventory is in use, NVML cannot judge it.
    none = FakeNvml({0}, count=0)
    health = GpuHealth(True, none)
    assert not health.active and health.unhealthy([0]) == frozenset()
    assert none.shutdown


async def _next(stream: AsyncIterator[pb.ListAndWatchResponse]) -> pb.ListAndWatchResponse:
    return await asyncio.wait_for(anext(stream), 5)


async def test_list_and_watch_sends_changes_and_ends_on_stop(
    state: PluginState, daemon: Daemon
) -> None:
    service = DevicePluginService(COUNT, state)
    stream = service.list_and_watch(pb.Empty())
    first = await _next(stream)
    assert [(d.id, d.health) for d in first.devices] == [("0", HEALTHY), ("1", HEALTHY)]
    waiting = asyncio.ensure_future(_next(stream))
    await state.refresh()  # nothing changed: nothing sent
    await asyncio.sleep(0)
    assert not waiting.done()
    daemon.down = True
    await state.refresh()
    second = await waiting
    assert [d.health for d in second.devices] == [UNHEALTHY, UNHEALTHY]
    service.stop()
    with pytest.raises(StopAsyncIteration):
        await _next(stream)


# -- registration, in-process against the test kubelet ------------------------------


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-dp-") as d:  # short: socket paths
        yield Path(d)


async def test_registers_serves_and_reregisters(
    state: PluginState, plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plugin = DevicePlugin(str(plugin_dir), state)
    try:
        await plugin.tick()  # no kubelet yet: serves, waits
        assert plugin.registered == frozenset()
        assert "waiting for the kubelet's socket" in caplog.text
        async with TestKubelet(plugin_dir) as kubelet:
            # The kubelet's start removed our sockets, as a real one does.
            await plugin.tick()
            assert plugin.registered == set(RESOURCES)
            await kubelet.wait_registered(3)
            assert {(r.resource_name, r.endpoint, r.version) for r in kubelet.requests} == {
                (RESOURCES[s], endpoint(s), "v1beta1") for s in RESOURCES
            }
            assert all(r.options.get_preferred_allocation_available for r in kubelet.requests)
            devices = await kubelet.wait_for(RESOURCES[MEMORY], lambda d: healthy(d) == 30)
            assert len(devices) == 30
            assert kubelet.sockets() == {"kubelet.sock"} | {endpoint(s) for s in RESOURCES}
            await plugin.tick()  # nothing new: no second registration
            assert len(kubelet.requests) == 3

            await kubelet.restart()
            assert kubelet.sockets() == {"kubelet.sock"}
            await plugin.tick()
            await kubelet.wait_registered(6)
            got = await kubelet.allocate(RESOURCES[CORE], ["0", "1"])
            assert got == {KUBELET_ANNOTATIONS[CORE]: "0-1"}
            await kubelet.wait_for(RESOURCES[COUNT])
            assert kubelet.allocatable(RESOURCES[COUNT]) == 2
    finally:
        await plugin.close()
    assert not any(plugin_dir.iterdir())  # our sockets are gone


async def test_new_kubelet_socket_alone_means_register_again(
    state: PluginState, plugin_dir: Path
) -> None:
    plugin = DevicePlugin(str(plugin_dir), state)
    try:
        async with TestKubelet(plugin_dir) as kubelet:
            await plugin.tick()
            await kubelet.wait_registered(3)
            await kubelet.restart(remove_sockets=False)  # our sockets stay
            await plugin.tick()
            await kubelet.wait_registered(6)
            await kubelet.wait_for(RESOURCES[MEMORY])
    finally:
        await plugin.close()


async def test_our_socket_removed_means_serve_and_register_again(
    state: PluginState, plugin_dir: Path
) -> None:
    plugin = DevicePlugin(str(plugin_dir), state)
    try:
        async with TestKubelet(plugin_dir) as kubelet:
            await plugin.tick()
            await kubelet.wait_registered(3)
            (plugin_dir / endpoint(COUNT)).unlink()
            await plugin.tick()
            await kubelet.wait_registered(4)
            assert kubelet.requests[3].resource_name == RESOURCES[COUNT]
            assert endpoint(COUNT) in kubelet.sockets()
            await kubelet.wait_for(RESOURCES[COUNT], lambda d: healthy(d) == 2)
            await plugin.tick()
            assert len(kubelet.requests) == 4
    finally:
        await plugin.close()


async def test_register_failure_is_retried(state: PluginState, plugin_dir: Path) -> None:
    plugin = DevicePlugin(str(plugin_dir), state, register_timeout=2, register_delays=(0.0,))
    try:
        # Something at kubelet.sock that is not a kubelet: registration fails.
        (plugin_dir / "kubelet.sock").write_text("")
        await plugin.tick()
        assert plugin.registered == frozenset()
        async with TestKubelet(plugin_dir) as kubelet:
            await plugin.tick()
            await kubelet.wait_registered(3)
            assert plugin.registered == set(RESOURCES)
    finally:
        await plugin.close()


async def test_stop_ends_list_and_watch_cleanly(state: PluginState, plugin_dir: Path) -> None:
    plugin = DevicePlugin(str(plugin_dir), state)
    async with TestKubelet(plugin_dir) as kubelet:
        await plugin.tick()
        await kubelet.wait_for(RESOURCES[CORE])
        followed = list(kubelet.plugins.values())
        await plugin.close()
        for p in followed:
            assert p.task is not None
            await asyncio.wait_for(p.task, 5)
            assert p.ended == "ok"
    assert not any(plugin_dir.iterdir())


async def test_allocate_does_not_wait_for_a_slow_daemon(daemon: Daemon, clock: Clock) -> None:
    release = threading.Event()

    def slow() -> dict[str, Any]:
        release.wait(30)
        return daemon()

    state = PluginState(GPUS, RESERVE, 16, status=daemon, clock=clock)
    await state.refresh()
    state._status_source = slow  # the daemon stops answering
    refreshing = asyncio.create_task(state.refresh())
    try:
        await asyncio.sleep(0)
        reply = await asyncio.wait_for(
            DevicePluginService(MEMORY, state).allocate(allocate_request(["1"])), 5
        )
        assert reply.container_responses[0].annotations == {KUBELET_ANNOTATIONS[MEMORY]: "1"}
        assert not refreshing.done()
    finally:
        release.set()
        await refreshing


def test_command_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kubernetes: {device_plugin_dir: relative/dir}\n")
    assert main(["device-plugin", "--config", str(bad)]) == 2
    assert "device_plugin_dir" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("use_nvml: false\n")
    assert main(["device-plugin", "--config", str(empty)]) == 2
    assert "no GPUs" in capsys.readouterr().err
