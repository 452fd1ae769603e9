"""pytest plugin for the in-guest fault suite (tests/guest/fault_guest_*.py).

Runs only inside the qemu guest (tests/guest/test_faults_guest.py loads it
with `-p tests.guest.fault_support`), as root, with the real gpushare.ko
loaded, a real containerd 1.7 (CRI + NRI) and the real plugin processes
(`nri-gpushare run`, kmod: required).  One containerd serves the whole
session; the plugin is started, SIGKILLed, SIGSTOPped and started again by the
tests through `Plugins`.  `Chaos` (the plugin killed at random points of pod
lifecycles) and `consistent(..., module=False)` serve the host test bed's
fault tests too (tests/integration/test_faults.py).

`consistent()` is the invariant every fault test ends on: the plugin's
allocations are exactly the live containers whose spec carries their share,
its unserved list exactly the running ones that asked and got none (created
while it was away: containerd fails open; a created one may be listed or
not), the module's registry exactly the
allocations with the same memory per GPU, each running one bound to its
container's cgroup, and the module's reference count the number of
registrations.  A failed test's report gets every plugin log and the end of
containerd's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import pytest_asyncio
from grpclib.exceptions import GRPCError, StreamTerminatedError

from tests.guest.kmod_support import CGROUP2, ROOT, loaded, refcount, registered, value
from tests.integration.plugin import PluginProcess, gpu_inventory
from tests.testbed.containerd import Containerd
from tests.testbed.cri import CriClient, cri

GiB = 1 << 30
P = "gpushare.io/"
BASE = Path("/tmp/gs-fault")  # short: unix socket paths
SLOW = 120.0  # only keeps a broken run from hanging: everything is 5-20x slower under TCG
# containerd's NRI timeouts, and the plugin's copy of them: a SIGSTOPped plugin
# is closed after REQUEST_TIMEOUT.
REQUEST_TIMEOUT = 5
REGISTRATION_TIMEOUT = 30
GPUS = gpu_inventory(2, "16Gi")
SEED_ENV = "GPUSHARE_FAULT_SEED"
OUT_ENV = "GPUSHARE_FAULT_OUT"  # a directory shared with the host: summaries
ASKS = "gs-fault/asks"  # a container label: "1" when the test asked for a share


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def seed() -> int:
    """The suite's seed: $GPUSHARE_FAULT_SEED (the host driver always sets it)."""
    return int(os.environ.get(SEED_ENV) or 1)


def rng(name: str) -> random.Random:
    """A generator for one test, from the suite's seed and the test's name."""
    return random.Random(f"{seed()}:{name}")


def report(name: str, summary: dict[str, Any]) -> None:
    """Write a test's figures where the host driver prints them from."""
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(summary, sort_keys=True))


class Plugins:
    """The plugin processes of the session, one running at a time."""

    def __init__(self, nri_socket: Path) -> None:
        self.nri_socket = nri_socket
        self.started: list[PluginProcess] = []
        # One local API socket for all of them, as on a node: gpushare-runc
        # finds whichever plugin runs now.
        self.api_socket = BASE / "api.sock"

    @property
    def current(self) -> PluginProcess:
        assert self.started, "no plugin was started"
        return self.started[-1]

    def alive(self) -> bool:
        proc = self.started[-1].proc if self.started else None
        return proc is not None and proc.poll() is None

    def start(self, wait: bool = True) -> PluginProcess:
        plugin = PluginProcess(
            self.nri_socket,
            BASE / f"p{len(self.started)}",
            nri={
                "socket": str(self.nri_socket),
                "plugin_index": "10",
                "request_timeout": REQUEST_TIMEOUT,
                "registration_timeout": REGISTRATION_TIMEOUT,
            },
            api_socket=str(self.api_socket),
            # The list's exactness is checked here; deny's kills in
            # tests/integration/test_faults_unserved.py and test_trust.py.
            unserved="warn",
            kmod="required",
            use_nvml=False,
            inventory=GPUS,
        )
        self.started.append(plugin)
        plugin.start(wait=False)
        if wait:
            plugin.wait_connected(timeout=SLOW)
        return plugin

    def running(self) -> PluginProcess:
        """The live plugin, synchronized; started when there is none."""
        if not self.alive():
            return self.start()
        plugin = self.current
        plugin.wait_connected(timeout=SLOW)
        return plugin

    def kill(self) -> None:
        """SIGKILL the current plugin (no chance to say anything)."""
        plugin = self.current
        assert plugin.proc is not None
        plugin.proc.send_signal(signal.SIGKILL)
        plugin.proc.wait()

    def stop_all(self) -> None:
        for plugin in self.started:
            if plugin.proc is not None and plugin.proc.poll() is None:
                plugin.proc.send_signal(signal.SIGCONT)
                plugin.stop()


@pytest.fixture(scope="session")
def bed() -> Iterator[Containerd]:
    if os.environ.get("GPUSHARE_IN_GUEST") != "1":
        pytest.fail("fault_guest_* tests run only inside the qemu guest (test_faults_guest.py)")
    assert loaded(), "the host side loads gpushare.ko before the suite"
    for point in (BASE, Path("/run/containerd")):
        point.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(point))
    sh("ip", "link", "set", "lo", "up")
    containerd = Containerd(
        BASE / "ctd",
        plugin_registration_timeout=f"{REGISTRATION_TIMEOUT}s",
        plugin_request_timeout=f"{REQUEST_TIMEOUT}s",
    )
    containerd.start(timeout=SLOW)
    yield containerd
    containerd.stop()


@pytest.fixture(scope="session")
def plugins(bed: Containerd) -> Iterator[Plugins]:
    plugins = Plugins(bed.nri_socket)
    yield plugins
    plugins.stop_all()


@pytest_asyncio.fixture
async def client(bed: Containerd, plugins: Plugins) -> AsyncIterator[CriClient]:
    """A CRI client; the pods it started are stopped and removed afterwards,
    through a live plugin, and then nothing may be left registered."""
    async with bed.cri_client() as c:
        c.runtime.timeout = c.images.timeout = SLOW
        await c.wait_ready(SLOW)
        try:
            yield c
        finally:
            plugins.running()
            await c.cleanup()
    if loaded():
        left = registered()
        assert left == [], f"containers left registered in gpushare.ko: {left}"
        assert refcount() == 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    result = outcome.get_result()
    if not result.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    if (plugins := funcargs.get("plugins")) is not None:
        for plugin in plugins.started[-4:]:
            result.sections.append((f"plugin log {plugin.log_path}", plugin.log()[-4000:]))
    if (containerd := funcargs.get("bed")) is not None:
        result.sections.append((f"containerd log {containerd.log_path}", containerd.log_tail(60)))


async def create(client: CriClient, pod: str, name: str, share: dict[str, str] | None) -> str:
    """A container that sleeps; share (gpushare.io/ keys) goes in its
    annotations, and its ASKS label says whether it asked."""
    return await client.create_container(
        pod,
        name,
        command=["sleep", "3600"],
        annotations=share or {},
        labels={ASKS: "1" if share else "0"},
    )


# -- the invariant --------------------------------------------------------------------


LIVE = (cri.ContainerState.CONTAINER_CREATED, cri.ContainerState.CONTAINER_RUNNING)


@dataclass
class Live:
    """What containerd has: the live containers, split by whether their spec
    carries the share (GPUSHARE_MEMORY_LIMIT, injected by the plugin)."""

    served: dict[str, list[int]] = field(default_factory=dict)  # id -> memory per GPU
    unserved: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    cgroups: dict[str, str] = field(default_factory=dict)  # id -> cgroupsPath


def memory_limits(text: str) -> list[int]:
    """GPUSHARE_MEMORY_LIMIT's bytes, one per GPU ("N" or "N,M,...")."""
    return [int(n) for n in text.split(",")]


async def live_containers(client: CriClient) -> Live:
    live = Live()
    for c in await client.list_containers():
        if c.state not in LIVE:
            continue
        spec = (await client.container_info(c.id))["runtimeSpec"]
        env = dict(e.split("=", 1) for e in spec["process"].get("env", []) if "=" in e)
        if "GPUSHARE_MEMORY_LIMIT" in env:
            live.served[c.id] = memory_limits(env["GPUSHARE_MEMORY_LIMIT"])
        elif c.labels.get(ASKS) == "1":
            live.unserved.add(c.id)
        if c.state == cri.ContainerState.CONTAINER_RUNNING:
            live.running.add(c.id)
        live.cgroups[c.id] = spec["linux"]["cgroupsPath"]
    return live


def module_registry() -> dict[str, dict[int, int]]:
    """gpushare.ko's registrations: id -> {gpu: memsize}."""
    out: dict[str, dict[int, int]] = {}
    for cid in registered():
        out[cid] = {
            int(gpu.name): value(gpu / cid / "memsize")
            for gpu in sorted(ROOT.iterdir())
            if gpu.name.isdigit() and (gpu / cid).is_dir()
        }
    return out


def check_unserved(shown: set[str], live: Live, where: str) -> None:
    """The plugin's unserved list is exactly the running containers that asked
    and got nothing, plus only created ones (a created container may be
    listed or not: containerd can create it after Synchronize's snapshot with
    no event to the plugin until it starts)."""
    assert shown <= live.unserved, f"unserved: {shown}; {where}"
    started = live.unserved & live.running
    assert started <= shown, f"running unserved, not shown: {started - shown}; {where}"


async def consistent(
    client: CriClient, plugin: PluginProcess, module: bool = True, pinned: int = 0
) -> dict[str, int]:
    """Assert the invariant (module docstring); module=False leaves out
    gpushare.ko's side (the host test bed has no module); pinned: references to
    the module held by others (gs_hang.ko).  Returns counts."""
    live = await live_containers(client)
    status = plugin.status()
    allocs = {a["container_id"]: a for a in status["allocations"]}
    shown_unserved = {u["container_id"] for u in status["unserved"]}
    where = f"live {live}, allocations {sorted(allocs)}"

    assert set(allocs) == set(live.served), f"allocations differ from served containers: {where}"
    check_unserved(shown_unserved, live, where)
    for cid, alloc in allocs.items():
        shares = {g["index"]: g["memory"] for g in alloc["gpus"]}
        assert sorted(shares.values()) == sorted(live.served[cid]), (cid, shares, live)
    for gpu in status["gpus"]:
        held = sum(
            g["memory"] for a in allocs.values() for g in a["gpus"] if g["index"] == gpu["index"]
        )
        assert gpu["memory_allocated"] == held, (gpu, held)
        if module:
            free = value(ROOT / str(gpu["index"]) / "free_memsize")
            assert free == value(ROOT / str(gpu["index"]) / "total_memsize") - held, (gpu, free)
    if module:
        registry = module_registry()
        where += f", registry {registry}"
        assert set(registry) == set(allocs), f"module registry differs from allocations: {where}"
        for cid, alloc in allocs.items():
            assert alloc["registered"] is True, alloc
            shares = {g["index"]: g["memory"] for g in alloc["gpus"]}
            assert registry[cid] == shares, (cid, registry[cid], shares)
            if cid in live.running:  # bound to its cgroup once it runs
                bound = value(ROOT / str(min(shares)) / cid / "cgroup")
                cgroup = CGROUP2 / live.cgroups[cid].lstrip("/")
                assert bound == os.stat(cgroup).st_ino, (cid, bound, cgroup)
        assert refcount() == len(registry) + pinned, (refcount(), registry, pinned)
    return {"served": len(live.served), "unserved": len(live.unserved)}


async def until(check: Any, what: str, timeout: float = SLOW) -> None:
    """Poll check() until true; the bound only keeps a broken run from hanging."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"stuck waiting for {what}"
        await asyncio.sleep(0.1)


# -- the plugin killed at random points of pod lifecycles -----------------------------


class Killable(Protocol):
    """The plugin processes a Chaos run kills and starts again."""

    def alive(self) -> bool: ...
    def kill(self) -> None: ...
    def start(self) -> PluginProcess: ...  # returns once it has synchronized


STEPS = ("run_pod", "create", "start", "stop", "remove", "stop_pod", "remove_pod")
BROKEN = (GRPCError, StreamTerminatedError, ConnectionError)
T = TypeVar("T")


def share_for(r: random.Random) -> dict[str, str]:
    share = {P + "gpu-memory": r.choice(["512Mi", "1Gi", "2Gi"])}
    if r.random() < 0.5:
        share[P + "gpu-core"] = str(r.choice([10, 20]))
    if r.random() < 0.2:
        share[P + "gpu-count"] = "2"
    return share


class Chaos:
    """Pod lifecycles through CRI, `workers` at a time, `lifecycles` in all
    (RunPodSandbox, CreateContainer asking for a drawn share, Start, Stop,
    Remove, StopPodSandbox, RemovePodSandbox); `kills` of their steps, drawn
    from r, get a SIGKILL of the plugin a drawn 0-40 ms after the step's CRI
    call was sent: before, inside or after the plugin's handler (one that
    falls while a new plugin is starting is done at the first step after).  A new
    plugin is started at once while the lifecycles go on without it
    (containerd fails open); once it has synchronized, the lifecycles pause
    at their next step and check() runs.  A step may fail only when a kill
    fell inside it; it is counted, and a removal is then done again."""

    def __init__(
        self,
        client: CriClient,
        plugins: Killable,
        r: random.Random,
        check: Callable[[PluginProcess], Awaitable[dict[str, int]]],
        *,
        lifecycles: int,
        kills: int,
        workers: int = 4,
    ) -> None:
        self.client, self.plugins, self.r, self.check = client, plugins, r, check
        self.lifecycles, self.workers = lifecycles, workers
        total = lifecycles * len(STEPS)
        self.plan = {s: r.uniform(0.0, 0.04) for s in r.sample(range(total), kills)}
        self.step = 0
        self.kills = 0
        self.landed: list[str] = []  # the step each kill was sent in
        self.broken: list[str] = []  # steps a kill broke
        self.checks: list[dict[str, int]] = []
        self.open = asyncio.Event()  # lifecycles may take their next step
        self.open.set()
        self.busy = 0  # steps under way
        self.idle = asyncio.Condition()
        self.restarting: asyncio.Task[None] | None = None
        self.took: dict[str, list[float]] = {}  # seconds per step, by name
        self.restarts: list[float] = []  # kill to the new plugin's Synchronize
        self.failure: BaseException | None = None
        self.deferred = 0  # kills that fell inside a restart, still to do
        self.pending: set[asyncio.TimerHandle] = set()  # kills sent, not yet fired
        self.fired = asyncio.Event()  # a pending kill fired

    async def run(self) -> dict[str, Any]:
        """All the lifecycles; then the last restart's check.  Returns figures."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(self.lifecycles):
            queue.put_nowait(i)
        began = time.monotonic()
        try:
            await asyncio.gather(*(self.worker(queue) for _ in range(self.workers)))
        finally:
            # A kill drawn for one of the last steps may still be due (its
            # step answered within the drawn 0-40 ms) and then the restart it
            # starts: both are done, and checked, before the caller looks at
            # the plugin (else it queries one that was killed under it).
            while self.pending or self.restarting_now():
                if self.pending:
                    self.fired.clear()
                    await self.fired.wait()
                else:
                    assert self.restarting is not None
                    await asyncio.wait([self.restarting])
        if self.restarting is not None:
            self.restarting.result()  # a failed check raises here
        return {
            "lifecycles": self.lifecycles,
            "kills": self.kills,
            "kills_left": self.deferred,
            "kills_during": self.landed,
            "broken_steps": self.broken,
            "checks": len(self.checks),
            "served_at_checks": sum(c["served"] for c in self.checks),
            "unserved_at_checks": sum(c["unserved"] for c in self.checks),
            "seconds": round(time.monotonic() - began, 1),
            "restart_s": self.restarts,
            "step_mean_s": {k: round(sum(v) / len(v), 3) for k, v in sorted(self.took.items())},
        }

    async def do(self, name: str, call: Awaitable[T]) -> tuple[bool, T | None]:
        """One step: (True, its result), or (False, None) when a kill broke it."""
        await self.open.wait()
        if self.failure is not None:
            raise AssertionError("a check after a restart failed") from self.failure
        self.busy += 1
        n, self.step = self.step, self.step + 1
        kills, down = self.kills, not self.plugins.alive()
        delay = self.plan.get(n)
        if delay is None and self.deferred and self.plugins.alive() and not self.restarting_now():
            self.deferred -= 1  # a kill that fell inside a restart, taken now
            delay = self.r.uniform(0.0, 0.04)
        if delay is not None:
            self.send_kill(delay, name)
        began = time.monotonic()
        try:
            result = await call
            self.took.setdefault(name, []).append(time.monotonic() - began)
            return True, result
        except BROKEN as e:
            if self.kills == kills and not down and n not in self.plan:
                raise AssertionError(f"step {name} failed with no kill near it: {e}") from e
            self.broken.append(f"{name}: {e}")
            return False, None
        finally:
            self.busy -= 1
            async with self.idle:
                self.idle.notify_all()

    def restarting_now(self) -> bool:
        return self.restarting is not None and not self.restarting.done()

    def send_kill(self, delay: float, during: str) -> None:
        """kill(during) in delay seconds; run() waits for it."""

        def fire() -> None:
            self.pending.discard(handle)
            try:
                self.kill(during)
            finally:
                self.fired.set()

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self.pending.add(handle)

    def kill(self, during: str) -> None:
        if self.restarting_now() or not self.plugins.alive():
            self.deferred += 1  # a new plugin is on its way: kill it once it serves
            return
        if self.plugins.alive():
            self.plugins.kill()
            self.kills += 1
            self.landed.append(during)
            self.restarting = asyncio.create_task(self.restart())

    async def restart(self) -> None:
        began = time.monotonic()
        plugin = await asyncio.to_thread(self.plugins.start)
        self.restarts.append(round(time.monotonic() - began, 2))
        self.open.clear()
        try:
            async with self.idle:
                await self.idle.wait_for(lambda: self.busy == 0)
            self.checks.append(await self.check(plugin))
        except BaseException as e:
            self.failure = e  # the lifecycles stop at their next step with it
            raise
        finally:
            self.open.set()

    async def restarted(self) -> None:
        while self.restarting_now():
            await asyncio.sleep(0.1)

    async def lifecycle(self, i: int) -> None:
        c, share = self.client, share_for(self.r)
        ok, pod = await self.do("run_pod", c.run_pod(f"f{i}"))
        if not ok:
            await self.restarted()
            ok, pod = await self.do("run_pod again", c.run_pod(f"f{i}"))
        assert ok and pod is not None, "RunPodSandbox failed twice"
        ok, cid = await self.do("create", create(c, pod, "main", share))
        if ok and cid is not None:
            await self.do("start", c.start(cid))
            await self.do("stop", c.stop(cid))
            if not (await self.do("remove", c.remove(cid)))[0]:
                await self.restarted()
                await self.do("remove again", c.remove(cid))
        await self.do("stop_pod", c.stop_pod(pod))
        if not (await self.do("remove_pod", c.remove_pod(pod)))[0]:
            await self.restarted()
            await self.do("remove_pod again", c.remove_pod(pod))

    async def worker(self, queue: asyncio.Queue[int]) -> None:
        while not queue.empty():
            await self.lifecycle(queue.get_nowait())


async def served_lifecycle(client: CriClient, plugin: PluginProcess, module: bool = True) -> None:
    """After the kills: one more pod with a share, checked at each step, so
    that releasing on Stop/Remove (not a restart's Synchronize) is what
    leaves the books empty."""
    pod = await client.run_pod("after")
    cid = await create(client, pod, "main", {P + "gpu-memory": "1Gi"})
    await client.start(cid)
    assert await consistent(client, plugin, module) == {"served": 1, "unserved": 0}
    await client.stop(cid)
    assert await consistent(client, plugin, module) == {"served": 0, "unserved": 0}
    assert plugin.status()["allocations"] == [], "StopContainer released nothing"
    await client.remove(cid)
    await client.stop_pod(pod)
    await client.remove_pod(pod)
