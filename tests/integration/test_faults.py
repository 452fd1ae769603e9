"""Fault suite on the host test bed (real containerd 1.7.24 with CRI and NRI,
the real plugin process; no kernel module: its side runs in the qemu guest,
tests/guest/test_faults_guest.py, where the same lifecycles are slower).

The plugin SIGKILLed at random points of 200 pod lifecycles and started again
(`fault_support.Chaos`): after each restart and at the end, the plugin's
allocations are exactly the live containers whose spec carries the share and
its unserved list exactly the live ones created while it was away.

containerd SIGKILLed and started again while pods are being created:

CRI lifecycles run WORKERS at a time (a pod, a container asking for a share,
started; a drawn half of them stopped and removed again); after a drawn
number of them containerd is SIGKILLed (shims and containers live on) and
started on the same directories, while the lifecycles go on (their calls fail
while it is down and are retried).  Once the plugin has registered again and
the lifecycles are done: the plugin's allocations are exactly the live
containers whose spec carries the share (none left for a container that
containerd never committed or that stopped while it was down), its
unserved list exactly the live ones that asked and got none, and the
GPUs' totals their sum; after every pod is removed, nothing is allocated.

The kernel-module side of the same faults runs in the qemu guest
(tests/guest/test_faults_guest.py).  The seed is $GPUSHARE_FAULT_SEED, else
drawn and printed.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from grpclib.exceptions import GRPCError, StreamTerminatedError

from tests.guest.fault_support import (
    Chaos,
    check_unserved,
    consistent,
    create,
    live_containers,
    served_lifecycle,
)
from tests.integration.plugin import PluginProcess
from tests.testbed.containerd import Containerd
from tests.testbed.cri import CriClient, cri

pytestmark = pytest.mark.containerd

P = "gpushare.io/"
LIFECYCLES = 40
WORKERS = 3
STUCK = 60.0  # only keeps a broken run from hanging
T = TypeVar("T")
# What a CRI call raises while containerd is away (grpclib raises AttributeError
# on a connection that closed under a request).
DOWN = (
    GRPCError,
    StreamTerminatedError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
    AttributeError,
)


def fault_seed() -> int:
    seed = int(os.environ.get("GPUSHARE_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"fault seed: {seed} (replay: GPUSHARE_FAULT_SEED={seed})")
    return seed


def consistent_status(live: Any, status: dict[str, Any]) -> None:
    """Allocations exactly the served live containers, unserved exactly the
    live ones without their share, GPU totals the allocations' sum."""
    allocs = {a["container_id"]: a for a in status["allocations"]}
    where = f"live {live}, allocations {sorted(allocs)}"
    assert set(allocs) == set(live.served), f"stale or missing allocation: {where}"
    unserved = {u["container_id"] for u in status["unserved"]}
    check_unserved(unserved, live, where)
    for cid, alloc in allocs.items():
        assert sorted(g["memory"] for g in alloc["gpus"]) == sorted(live.served[cid]), alloc
    for gpu in status["gpus"]:
        held = sum(
            g["memory"] for a in allocs.values() for g in a["gpus"] if g["index"] == gpu["index"]
        )
        assert gpu["memory_allocated"] == held, (gpu, held)


class HostPlugins:
    """The test's plugin processes, for Chaos: one alive at a time."""

    def __init__(self, bed: Containerd, start_plugin: Callable[..., PluginProcess]) -> None:
        self.bed, self.start_plugin = bed, start_plugin
        self.current = self.start()

    def alive(self) -> bool:
        proc = self.current.proc
        return proc is not None and proc.poll() is None

    def kill(self) -> None:
        self.current.kill()

    def start(self) -> PluginProcess:
        # The list's exactness is checked here (deny's kills: test_faults_unserved.py).
        self.current = self.start_plugin(self.bed, wait=False, unserved="warn")
        self.current.wait_connected(timeout=STUCK)
        return self.current


async def test_plugin_killed_at_random_points_of_200_pod_lifecycles(make_containerd, start_plugin):
    r = random.Random(fault_seed())
    bed: Containerd = make_containerd()
    plugins = HostPlugins(bed, start_plugin)
    async with bed.cri_client() as client:

        async def check(plugin: PluginProcess) -> dict[str, int]:
            return await consistent(client, plugin, module=False)

        chaos = Chaos(client, plugins, r, check, lifecycles=200, kills=12)
        summary = await chaos.run()
        print(summary)
        assert await check(plugins.current) == {"served": 0, "unserved": 0}
        assert plugins.current.status()["allocations"] == []
        await served_lifecycle(client, plugins.current, module=False)
    assert chaos.kills >= 10 and len(chaos.checks) == chaos.kills, summary


class _FakePlugin:
    def __init__(self) -> None:
        self.dead = False


class _FakePlugins:
    """Killable without processes: what Chaos does with its kills alone."""

    def __init__(self) -> None:
        self.started = [_FakePlugin()]

    def alive(self) -> bool:
        return not self.started[-1].dead

    def kill(self) -> None:
        self.started[-1].dead = True

    def start(self) -> Any:
        self.started.append(_FakePlugin())
        return self.started[-1]


class _FakeClient:
    """The CRI calls of a lifecycle, answered at once."""

    async def run_pod(self, name: str) -> str:
        return name

    async def create_container(self, *args: Any, **kwargs: Any) -> str:
        return "c"

    async def start(self, cid: str) -> None: ...
    async def stop(self, cid: str) -> None: ...
    async def remove(self, cid: str) -> None: ...
    async def stop_pod(self, pod: str) -> None: ...
    async def remove_pod(self, pod: str) -> None: ...


async def test_chaos_returns_only_after_a_kill_due_after_the_last_step():
    """The harness, not the plugin: a kill drawn for the last step fires up to
    40 ms after it was sent, which can be after that step answered and every
    lifecycle ended.  Chaos.run() must wait for it, and for the restart and
    check it brings, before the test queries the plugin (a query of the
    plugin killed under it was ConnectionRefusedError, with the new plugin's
    log still empty)."""
    plugins = _FakePlugins()
    checked: list[_FakePlugin] = []

    async def check(plugin: Any) -> dict[str, int]:
        assert not plugin.dead, "checked a killed plugin"
        checked.append(plugin)
        return {"served": 0, "unserved": 0}

    chaos = Chaos(_FakeClient(), plugins, random.Random(0), check, lifecycles=2, kills=0, workers=1)  # type: ignore[arg-type]
    chaos.plan = {2 * 7 - 1: 0.04}  # the last step of the last lifecycle
    summary = await chaos.run()
    assert chaos.kills == 1 and checked == [plugins.started[-1]], summary
    assert len(plugins.started) == 2 and plugins.alive()


class Load:
    """Lifecycles through CRI that ride out a containerd restart."""

    def __init__(self, bed: Containerd, client: CriClient, r: random.Random) -> None:
        self.bed, self.client, self.r = bed, client, r
        self.restart_after = r.randrange(LIFECYCLES // 4, LIFECYCLES // 2)
        self.done = 0
        self.failed: list[str] = []  # calls that failed while containerd was down
        self.restarted = asyncio.Event()
        self.down = False
        self.generation = 0  # changes when containerd goes away and comes back

    async def call(
        self,
        what: str,
        make: Callable[[int], Awaitable[T]],
        done_if: str = "",
        since: int | None = None,
    ) -> T | None:
        """make(attempt) until it succeeds; it may fail only when containerd
        went away during the call.  A retry whose error has done_if in it
        finds the first attempt done after all (its answer was lost): None."""
        deadline = asyncio.get_running_loop().time() + STUCK
        attempt = 0
        while True:
            generation = self.generation
            try:
                return await asyncio.wait_for(make(attempt), STUCK)
            except DOWN as e:
                message = getattr(e, "message", None) or str(e)
                if attempt and done_if and done_if in message:
                    return None
                if since is not None and since != self.generation:
                    # Made before containerd was killed (e.g. a start whose
                    # FIFOs went with it): containerd cannot do it now; the
                    # container stays as containerd has it, and is checked so.
                    self.failed.append(f"{what}: given up: {message[:80]}")
                    return None
                if self.generation and "snapshots" in message and "file exists" in message:
                    # containerd's own crash residue (a snapshot directory the killed
                    # containerd left, which its next create collides with), before
                    # any NRI call: not the plugin's; a kubelet retries, so do we.
                    self.failed.append(f"{what}: containerd snapshot residue")
                    assert asyncio.get_running_loop().time() < deadline, f"{what}: stuck"
                    attempt += 1
                    await asyncio.sleep(0.2)
                    continue
                if not self.down and generation == self.generation:
                    raise AssertionError(f"{what} failed with containerd up: {e!r}") from e
                self.failed.append(f"{what}: {type(e).__name__}")
                assert asyncio.get_running_loop().time() < deadline, f"{what}: stuck"
                attempt += 1
                await asyncio.sleep(0.2)

    async def restart(self) -> None:
        self.down = True
        self.generation += 1
        await asyncio.to_thread(self.bed.kill)  # SIGKILL: shims and containers stay
        await asyncio.sleep(self.r.uniform(0.0, 1.0))
        await asyncio.to_thread(self.bed.start)
        await self.client.wait_ready(STUCK)  # CRI answers "not initialized" until then
        self.generation += 1
        self.down = False
        self.restarted.set()

    async def lifecycle(self, i: int) -> None:
        c = self.client
        share = {P + "gpu-memory": self.r.choice(["256Mi", "512Mi"])}  # all fit
        keep = self.r.random() < 0.5
        pod = await self.call("run_pod", lambda _: c.run_pod(f"r{i}"))
        assert pod is not None
        # A create whose answer was lost leaves its container behind (live, and
        # checked like the others); the retry takes another name.
        made = self.generation
        cid = await self.call("create", lambda n: create(c, pod, f"main{n}", share))
        assert cid is not None
        started = await self.call(
            "start", lambda _: c.start(cid), done_if="CONTAINER_RUNNING", since=made
        )
        if started is None and not await self.running(cid):
            keep = False  # a start containerd gave up on: removed, as a kubelet does
        if not keep:
            await self.call("stop", lambda _: c.stop(cid))
            await self.call("remove", lambda _: c.remove(cid))
        self.done += 1
        if self.done == self.restart_after:
            asyncio.create_task(self.restart())

    async def running(self, cid: str) -> bool:
        status = await self.call("status", lambda _: self.client.container_status(cid))
        return status is not None and status.state == cri.ContainerState.CONTAINER_RUNNING

    async def worker(self, queue: asyncio.Queue[int]) -> None:
        while not queue.empty():
            await self.lifecycle(queue.get_nowait())


async def test_containerd_killed_under_load_leaves_no_stale_allocation(
    make_containerd, start_plugin
):
    r = random.Random(fault_seed())
    bed: Containerd = make_containerd()
    plugin: PluginProcess = start_plugin(bed, unserved="warn")  # the list is checked
    async with bed.cri_client() as client:
        load = Load(bed, client, r)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(LIFECYCLES):
            queue.put_nowait(i)
        await asyncio.gather(*(load.worker(queue) for _ in range(WORKERS)))
        await asyncio.wait_for(load.restarted.wait(), STUCK)
        await asyncio.to_thread(plugin.wait_connected, STUCK, 2)

        live = await live_containers(client)
        consistent_status(live, plugin.status())
        assert live.served, live
        # Stopping what is left releases it all.
        for cid in sorted(live.served.keys() & live.running)[::2]:
            await client.stop(cid)
        consistent_status(await live_containers(client), plugin.status())
        await client.cleanup()
        consistent_status(await live_containers(client), plugin.status())
        assert plugin.status()["allocations"] == []
    print(f"restart after {load.restart_after} lifecycles; calls retried: {load.failed}")
