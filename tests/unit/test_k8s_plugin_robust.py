"""The device plugin under attack: a kubelet lifecycle (admission, image
pulls, container restarts with the same IDs, pods deleted before or after
their containers, IDs handed out again) driven against the real allocator and
the plugin's state must never admit what the allocator then refuses on a
node with one GPU; and the process must not crash or stall on a hung NVML, a
hung or garbled daemon, a kubelet that never answers Register, or a second
device plugin on the same directory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nri_gpushare.config import Config
from nri_gpushare.k8s import endpoint
from nri_gpushare.k8s.capacity import GIB, Grant, advertise
from nri_gpushare.k8s.generated import v1beta1 as pb
from nri_gpushare.k8s.plugin import read_status, serve
from nri_gpushare.k8s.registration import DevicePlugin
from nri_gpushare.k8s.service import DevicePluginService
from nri_gpushare.k8s.state import RESTART_TTL, SLOT_TTL, PluginState
from nri_gpushare.names import CORE, COUNT, MEMORY, RESOURCES
from nri_gpushare.share.ids import MAX_ID
from nri_gpushare.share.model import ShareRefused
from tests.k8s.kubelet import TestKubelet, healthy
from tests.unit.test_k8s_capacity import MI, Node
from tests.unit.test_k8s_plugin import GPUS, RESERVE, Clock, Daemon, allocate_request, status_doc


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


# -- capacity: a kubelet's lifecycle against the real allocator ----------------------------


@dataclass
class Pod:
    grants: dict[str, frozenset[int]]
    cid: str | None = None  # its live container
    stopped: bool = False  # its container exited; the kubelet will restart it


@dataclass
class Kubelet:
    """Admits by the healthy devices it does not hold, as the device manager
    does: GetPreferredAllocation (with what it holds none of) and Allocate
    per resource, from the lists it had when admission began."""

    node: Node
    state: PluginState
    held: dict[str, set[int]] = field(default_factory=lambda: {s: set() for s in RESOURCES})
    pods: list[Pod] = field(default_factory=list)

    def available(self) -> dict[str, list[int]]:
        return {
            short: [int(d.id) for d in devs if d.healthy and int(d.id) not in self.held[short]]
            for short, devs in self.state.devices.items()
        }

    def admit(self, memory_gib: int, core: int) -> None:
        free = self.available()
        asked = {MEMORY: memory_gib, CORE: core}
        if any(len(free[s]) < n for s, n in asked.items()):
            return
        grants = {}
        for short, n in asked.items():
            if n:
                self.state.kubelet_frees(short, frozenset(free[short]))
                ids = frozenset(free[short][:n])
                self.held[short] |= ids
                self.state.grant([Grant(short, ids)])
                grants[short] = ids
        self.pods.append(Pod(grants))

    def create(self, pod: Pod) -> None:
        """CreateContainer (first start or a restart): never refused for
        capacity, but for a restart the GPU's container slots may be taken
        (max_inst; docs/kubernetes.md): the kubelet tries again later then."""
        try:
            alloc = self.node.create(pod.grants)
        except ShareRefused as e:
            [gpu] = self.node.status()["gpus"]
            if pod.stopped and len(gpu["containers"]) >= self.node.policy.max_inst:
                return
            raise AssertionError(f"admitted, then refused: {e}") from None
        pod.cid, pod.stopped = alloc.container_id, False

    def stop(self, pod: Pod) -> None:
        """The container exits (StopContainer releases its share)."""
        if pod.cid is not None:
            alloc = self.node.allocations.pop(pod.cid)
            self.node.ledger.remove(alloc)
            self.node.ids.pop(pod.cid)
            pod.cid = None

    def delete(self, pod: Pod) -> None:
        self.stop(pod)
        self.pods.remove(pod)
        for short, ids in pod.grants.items():
            self.held[short] -= ids


@settings(max_examples=400, deadline=None)
@given(
    memory_gib=st.integers(1, 16),
    max_inst=st.integers(1, 5),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "create", "stop", "restart", "delete", "outside", "refresh"]),
            st.integers(1, 8),
            st.sampled_from([0, 10, 30, 50, 100]),
        ),
        max_size=40,
    ),
)
# A pod deleted before its container came leaves a grant; a share taken by hand
# meanwhile must not make its IDs admittable.
@example(1, 1, [("admit", 1, 0), ("delete", 1, 0), ("outside", 1, 0), ("admit", 1, 0)])
# The kubelet hands a deleted pod's IDs out again before the plugin saw it go:
# the rest of that pod's IDs are not healthy as a live container's.
@example(
    2,
    1,
    [("admit", 2, 0), ("create", 1, 0), ("refresh", 1, 0), ("delete", 1, 0), ("admit", 1, 0)]
    + [("admit", 1, 0)],
)
# A container that exited: its memory waits for its restart, not its slot.
@example(
    2,
    1,
    [("admit", 1, 0), ("create", 1, 0), ("refresh", 1, 0), ("stop", 1, 0), ("refresh", 1, 0)]
    + [("admit", 1, 0), ("create", 1, 0), ("restart", 1, 0)],
)
@example(
    4,
    4,
    [("admit", 3, 50), ("create", 1, 0), ("refresh", 1, 0), ("stop", 1, 0), ("refresh", 1, 0)]
    + [("admit", 2, 50), ("create", 1, 0), ("restart", 1, 0)],
)
def test_one_gpu_lifecycle_never_admits_what_cannot_be_placed(
    memory_gib: int, max_inst: int, steps: list[tuple[str, int, int]]
) -> None:
    """Whatever order the kubelet admits, creates, restarts (same IDs, no
    Allocate), deletes (before or after the container is created, IDs then
    handed out again) and the plugin refreshes in, every container it
    admitted is placed.  Shares taken by hand only while no pod waits, and
    seen before the next admission (one taken while a pod waits, or in the
    second before a refresh, can take its room: the documented race)."""
    node = Node(1, memory_gib * GIB, 0, max_inst)
    clock = Clock()
    state = PluginState(node.gpus, 0, max_inst, status=node.status, clock=clock)
    state.update(node.status(), frozenset())
    kubelet = Kubelet(node, state)
    for op, a, b in steps:
        waiting = [p for p in kubelet.pods if p.cid is None]
        live = [p for p in kubelet.pods if p.cid is not None]
        if op == "admit":
            kubelet.admit(a, b)
        elif op == "create" and waiting:
            kubelet.create(waiting[a % len(waiting)])
        elif op == "stop" and live:
            pod = live[a % len(live)]
            kubelet.stop(pod)
            pod.stopped = True
        elif op == "restart" and waiting:
            kubelet.create(waiting[a % len(waiting)])
        elif op == "delete" and kubelet.pods:
            kubelet.delete(kubelet.pods[a % len(kubelet.pods)])
        elif op == "outside" and not waiting:
            node.outside(a * 1000 * MI, b)
            state.update(node.status(), frozenset())  # seen before the next admission
        elif op == "refresh":
            state.update(node.status(), frozenset())
    state.update(node.status(), frozenset())
    # New pods first: an exited container's slot is not kept for its restart
    # (docs/kubernetes.md), so a restart after them may find the slots taken.
    for pod in sorted((p for p in kubelet.pods if p.cid is None), key=lambda p: p.stopped):
        kubelet.create(pod)


async def test_a_restarting_container_keeps_its_room(daemon: Daemon, clock: Clock) -> None:
    """A container that exited holds no share in the daemon, but the kubelet
    restarts it with the same IDs without asking: its IDs wait again."""
    state = PluginState(GPUS, RESERVE, 16, status=daemon, clock=clock)
    daemon.doc = status_doc(({"container_id": "c1", "kubelet": {MEMORY: "0-3"}},), used_gib=(4, 0))
    await state.refresh()
    daemon.doc = status_doc()  # c1 exited
    await state.refresh()
    assert state.pending == (Grant(MEMORY, frozenset(range(4)), slot=False),)
    memory = state.devices[MEMORY]
    assert sum(d.healthy for d in memory) == 30  # its 4 IDs and 26 others
    # The kubelet offers them to another pod: it deleted c1's pod.
    await DevicePluginService(MEMORY, state).get_preferred_allocation(
        pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(["0", "9"], [], 1)]
        )
    )
    assert not state.pending
    # Restarted with the same IDs: a new container holds them.
    daemon.doc = status_doc(({"container_id": "c1", "kubelet": {MEMORY: "0-3"}},), used_gib=(4, 0))
    await state.refresh()
    daemon.doc = status_doc()
    await state.refresh()
    daemon.doc = status_doc(({"container_id": "c2", "kubelet": {MEMORY: "0-3"}},), used_gib=(4, 0))
    await state.refresh()
    assert not state.pending
    daemon.doc = status_doc()
    await state.refresh()
    clock.now += RESTART_TTL
    await state.refresh()
    assert not state.pending  # a pod deleted without a word: its IDs wait no longer


async def test_must_include_ids_are_not_the_kubelets_free_ones(state: PluginState) -> None:
    service = DevicePluginService(MEMORY, state)
    await service.allocate(allocate_request(["0", "1"]))  # an init container
    await service.get_preferred_allocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(["0", "1", "5"], ["0", "1"], 3)
            ]
        )
    )
    assert state.pending == (Grant(MEMORY, frozenset({0, 1})),)


async def test_ids_handed_out_again_replace_the_old_grant(state: PluginState) -> None:
    """The pod was deleted before its container was created; the kubelet
    gives its IDs to the next pod: its room counts once, not twice."""
    service = DevicePluginService(MEMORY, state)
    await service.allocate(allocate_request(["0", "1", "2", "3"]))
    await service.allocate(allocate_request(["2", "3"]))
    assert state.pending == (Grant(MEMORY, frozenset({2, 3})),)


async def test_a_grant_is_not_live_by_the_container_that_let_go_of_its_ids(
    daemon: Daemon, state: PluginState
) -> None:
    """The kubelet freed c1's IDs (its pod is gone) and allocated them again
    before the daemon saw c1 stop: c1 does not make the new grant live."""
    daemon.doc = status_doc(({"container_id": "c1", "kubelet": {MEMORY: "0-3"}},), (4, 0))
    await state.refresh()
    await DevicePluginService(MEMORY, state).allocate(allocate_request(["0", "1", "2", "3"]))
    await state.refresh()
    assert state.pending == (Grant(MEMORY, frozenset(range(4))),)
    daemon.doc = status_doc()  # c1 stops: no restart to wait for, the kubelet let go
    await state.refresh()
    assert state.pending == (Grant(MEMORY, frozenset(range(4))),)
    daemon.doc = status_doc(({"container_id": "c2", "kubelet": {MEMORY: "0-3"}},), (4, 0))
    await state.refresh()
    assert not state.pending


# -- robustness ------------------------------------------------------------------------------


def test_a_garbled_document_does_not_list_ten_to_the_twenty_devices() -> None:
    doc = status_doc()
    doc["gpus"][0]["memory_total"] = doc["gpus"][0]["memory_free"] = (MAX_ID + 2) * GIB
    with pytest.raises(ValueError, match="more than the 100000 IDs"):
        advertise(doc, GPUS, RESERVE, 16)


async def test_a_garbled_document_is_the_daemon_down(daemon: Daemon, state: PluginState) -> None:
    daemon.doc = status_doc()
    daemon.doc["gpus"][1]["memory_total"] = (MAX_ID + 2) * GIB
    await asyncio.wait_for(state.refresh(), 30)  # a hang guard, not a threshold
    assert not any(d.healthy for d in state.devices[MEMORY])
    assert len(state.devices[MEMORY]) == 30  # from the inventory


async def test_a_hung_nvml_makes_every_gpu_unhealthy_without_more_threads(
    daemon: Daemon, clock: Clock
) -> None:
    release = threading.Event()
    calls = []

    def hung() -> frozenset[int]:
        calls.append(1)
        release.wait(60)
        return frozenset()

    state = PluginState(
        GPUS, RESERVE, 16, status=daemon, health=hung, clock=clock, health_timeout=0.05
    )
    try:
        for _ in range(3):
            await asyncio.wait_for(state.refresh(), 30)
            assert not any(d.healthy for d in state.devices[COUNT])
        assert len(calls) == 1
    finally:
        release.set()
    for _ in range(100):  # the check answers: healthy again
        await asyncio.sleep(0.05)
        await state.refresh()
        if any(d.healthy for d in state.devices[COUNT]):
            break
    assert sum(d.healthy for d in state.devices[COUNT]) == 2


class FakeDaemonSocket:
    """A unix socket that answers every connection with `reply` (bytes, or
    None to send one byte at a time forever)."""

    def __init__(self, path: str, reply: bytes | None) -> None:
        self.reply = reply
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                if self.reply is not None:
                    conn.sendall(self.reply)
                    return
                while not self.done.wait(0.01):
                    conn.sendall(b" ")

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        self.thread.join(10)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-r2-") as d:  # short: socket paths
        yield Path(d)


@pytest.mark.parametrize(
    ("reply", "error", "words"),
    [
        (None, TimeoutError, "took more than"),  # trickles forever
        (b" " * 5000, ValueError, "larger than 4096 bytes"),
        (b"{not json", ValueError, "Expecting property name"),
        (b"[1, 2]", ValueError, "not a JSON object"),
    ],
)
def test_read_status_is_bounded(
    short_dir: Path, reply: bytes | None, error: type[Exception], words: str
) -> None:
    path = str(short_dir / "status.sock")
    server = FakeDaemonSocket(path, reply)
    try:
        with pytest.raises(error, match=words):
            read_status(path, timeout=0.3, limit=4096)
    finally:
        server.close()


def test_read_status_reads_a_document(short_dir: Path) -> None:
    path = str(short_dir / "status.sock")
    server = FakeDaemonSocket(path, json.dumps(status_doc()).encode())
    try:
        assert read_status(path)["gpus"][0]["index"] == 0
    finally:
        server.close()


async def test_stop_does_not_wait_for_a_kubelet_that_never_answers(
    state: PluginState, short_dir: Path
) -> None:
    """kubelet.sock accepts and says nothing: a stop ends the Register call."""
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(short_dir / "kubelet.sock"))
    silent.listen()
    plugin = DevicePlugin(str(short_dir), state, register_timeout=3600)
    stop = asyncio.Event()
    try:
        running = asyncio.create_task(plugin.run(stop, poll=0.01))
        while not plugin.serving:  # serving, then registering
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(running, 30)  # a hang guard: Register alone waits an hour
    finally:
        silent.close()
        await plugin.close()
    assert plugin.registered == frozenset()


async def test_a_second_device_plugin_takes_over_and_the_first_steps_back(
    state: PluginState, short_dir: Path
) -> None:
    first = DevicePlugin(str(short_dir), state)
    second = DevicePlugin(str(short_dir), state)
    try:
        async with TestKubelet(short_dir) as kubelet:
            await first.tick()
            await kubelet.wait_registered(3)
            await second.tick()  # a DaemonSet update with surge, or a stray copy
            await kubelet.wait_registered(6)
            for _ in range(3):  # no ping-pong: the first does not take them back
                await first.tick()
                await second.tick()
            assert first.serving == frozenset() and second.serving == set(RESOURCES)
            assert len(kubelet.requests) == 6
            await kubelet.wait_for(RESOURCES[MEMORY], lambda d: healthy(d) == 30)
            await second.close()  # the second goes: the first serves again
            await first.tick()
            assert first.serving == set(RESOURCES)
            await kubelet.wait_registered(9)
            assert {r.endpoint for r in kubelet.requests[6:]} == {endpoint(s) for s in RESOURCES}
            await kubelet.wait_for(RESOURCES[MEMORY], lambda d: healthy(d) == 30)
    finally:
        await first.close()
        await second.close()
    assert not any(short_dir.iterdir())


async def test_a_planted_symlink_at_our_socket_path_is_replaced_not_followed(
    state: PluginState, short_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    (short_dir / endpoint(MEMORY)).symlink_to(target)
    plugin = DevicePlugin(str(short_dir), state)
    try:
        await plugin.tick()
        assert (short_dir / endpoint(MEMORY)).is_socket()
    finally:
        await plugin.close()
    assert target.read_text() == "keep"


async def test_list_and_watch_streams_do_not_pile_up(state: PluginState, daemon: Daemon) -> None:
    """A stream whose reader never reads holds one message, however often
    the lists change; many streams end on stop."""
    service = DevicePluginService(MEMORY, state)
    streams = [service.list_and_watch(pb.Empty()) for _ in range(200)]
    for s in streams:
        await asyncio.wait_for(s.__anext__(), 5)
    assert service.streams == 200
    for used in range(1, 10):  # changes nobody reads
        daemon.doc = status_doc(used_gib=(used, 0))
        await state.refresh()
    service.stop()
    for s in streams:
        got: list[Any] = [m async for m in s]
        assert len(got) <= 1  # the latest list, or none
    assert service.streams == 0


class HungNvml:
    """nvmlInit never returns (a wedged driver) until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def nvmlInit(self) -> None:
        self.release.wait(120)
        raise RuntimeError("NVML Shared Library Not Found")


async def test_a_hung_nvml_init_does_not_stop_serving_or_exiting(short_dir: Path) -> None:
    """The process serves (every GPU unhealthy) and SIGTERM ends it although
    nvmlInit never returns; the stuck thread is not one exit waits for."""
    config = Config(device_plugin_dir=str(short_dir), status_socket=str(short_dir / "none.sock"))
    nvml = HungNvml()
    try:
        async with TestKubelet(short_dir) as kubelet:
            running = asyncio.create_task(serve(config, GPUS, nvml))
            devices = await kubelet.wait_for(
                RESOURCES[MEMORY], lambda d: len(d) == 32
            )  # no reserve
            assert healthy(devices) == 0
            stuck = [t for t in threading.enumerate() if t.name == "gpushare-health"]
            assert stuck and all(t.daemon for t in stuck)
            os.kill(os.getpid(), signal.SIGTERM)
            assert await asyncio.wait_for(running, 30) == 0  # a hang guard
    finally:
        nvml.release.set()


async def test_allocate_with_100k_ids_or_huge_strings_is_refused_briefly(
    state: PluginState,
) -> None:
    service = DevicePluginService(MEMORY, state)
    for devices in ([str(n) for n in range(100_000)], ["7" * 1_000_000], ["1", "x" * 10**6]):
        with pytest.raises(GRPCError) as refused:
            await service.allocate(allocate_request(devices))
        assert len(refused.value.message or "") < 300
    assert not state.pending


async def test_a_stale_socket_of_a_killed_plugin_is_replaced(
    state: PluginState, short_dir: Path
) -> None:
    path = short_dir / endpoint(CORE)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # kill -9 left it; nobody listens
    stale.close()
    plugin = DevicePlugin(str(short_dir), state)
    try:
        await plugin.tick()
        assert plugin.serving == set(RESOURCES)
        channel = Channel(path=str(path))
        try:
            options = await pb.DevicePluginStub(channel).get_device_plugin_options(
                pb.Empty(), timeout=10
            )
            assert options.get_preferred_allocation_available
        finally:
            channel.close()
    finally:
        await plugin.close()


async def test_a_dead_grant_holds_a_container_slot_for_slot_ttl_only(
    daemon: Daemon, clock: Clock
) -> None:
    """Two pods deleted before their containers were seen, max_inst 1 on
    each GPU: their grants hold both slots (nothing else is admittable but
    their own IDs) until SLOT_TTL; their memory stays reserved, admittable."""
    daemon.doc["policy"]["max_inst"] = 1
    state = PluginState(GPUS, RESERVE, 1, status=daemon, clock=clock)
    await state.refresh()
    service = DevicePluginService(MEMORY, state)
    await service.allocate(allocate_request(["0"], ["1"]))
    assert sum(d.healthy for d in state.devices[MEMORY]) == 2
    clock.now += SLOT_TTL
    await state.refresh()
    assert len(state.pending) == 2
    assert sum(d.healthy for d in state.devices[MEMORY]) == 30
