"""The unserved list across the plugin's registrations, on the host test bed
(real containerd 1.7.24 with CRI and NRI, the real plugin process).

Containers that asked for a share and were created while no plugin ran
(containerd fails open) die by themselves (SIGKILL from outside, as an OOM
kill or a crash would) while a new plugin registers.  containerd 1.7 tells
NRI of an exit before CRI shows it (NotifyContainerExit, then the status), so
a Synchronize snapshot taken in between shows the container still running,
and no stop follows for a container nobody stopped through CRI: only
containerd's own task events tell the plugin.  After each registration, once
the exits under way have landed, the list must be exactly the asking
containers still running.

With the default `unserved: deny`, containers that asked for a share are
created and started before, while and after a plugin registers: each one
that holds no share is killed, whichever event told the plugin of it, and
the kubelet's next attempt (a new container in the pod) is served.  The seed
is $GPUSHARE_FAULT_SEED, else drawn and printed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from tests.guest.fault_support import P, create, live_containers
from tests.integration.plugin import PluginProcess
from tests.integration.test_faults import fault_seed
from tests.testbed.containerd import Containerd
from tests.testbed.cri import CriClient, GRPCError

pytestmark = pytest.mark.containerd

ROUNDS = 4
PER_ROUND = 16  # containers dying around one registration
SETTLE = 10.0  # how long the exits under way may take to reach the plugin
STARTING = "NRI socket"  # the daemon logs it just before it connects to NRI


async def asking_containers(
    client: CriClient, workers: int, count: int, tag: str, denied: set[str] | None = None
) -> dict[str, str]:
    """`count` containers that asked for a share (unserved when no plugin
    runs), started, by container ID: their pods.  With `denied`, a start that
    fails because the plugin killed the container's task between its create
    and its start (deny at Synchronize) is added there."""
    made: dict[str, str] = {}

    async def worker(start: int) -> None:
        for i in range(start, count, workers):
            pod = await client.run_pod(f"{tag}-{i}")
            cid = await create(client, pod, "main", {P + "gpu-memory": "512Mi"})
            made[cid] = pod
            try:
                await client.start(cid)
            except GRPCError as e:
                if denied is None or "stopped" not in (e.message or ""):
                    raise
                denied.add(cid)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return made


async def kill_around_registration(
    client: CriClient, plugin: PluginProcess, cids: list[str], r: random.Random
) -> None:
    """SIGKILL the containers' processes one by one, from the moment the
    plugin is about to register on (its Synchronize snapshot falls among them)."""
    pids = [(await client.container_info(cid))["pid"] for cid in cids]
    deadline = time.monotonic() + 60
    while STARTING not in plugin.log():
        assert time.monotonic() < deadline, "the plugin never started"
        await asyncio.sleep(0.005)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(r.uniform(0.002, 0.015))


async def listed_exactly(client: CriClient, plugin: PluginProcess) -> None:
    """Until the plugin lists exactly the running asking containers (bounded)."""
    deadline = time.monotonic() + SETTLE
    while True:
        live = await live_containers(client)
        shown = {u["container_id"] for u in plugin.status()["unserved"]}
        expected = live.unserved & live.running
        if shown == expected:
            return
        assert time.monotonic() < deadline, (
            f"unserved listed {sorted(shown)}, running unserved {sorted(expected)}"
        )
        await asyncio.sleep(0.1)


async def test_containers_dying_while_the_plugin_registers_leave_the_unserved_list(
    make_containerd, start_plugin
):
    r = random.Random(fault_seed())
    bed: Containerd = make_containerd()
    async with bed.cri_client() as client:
        plugin: PluginProcess | None = None
        for n in range(ROUNDS):
            if plugin is not None:
                plugin.kill()
            cids = await asking_containers(client, 4, PER_ROUND, f"r{n}")
            plugin = start_plugin(bed, wait=False, unserved="warn")
            await kill_around_registration(client, plugin, list(cids), r)
            await asyncio.to_thread(plugin.wait_connected, 60)
            await listed_exactly(client, plugin)
            assert plugin.status()["unserved"] == []


async def test_with_the_default_deny_no_container_runs_without_the_share_it_asked_for(
    make_containerd, start_plugin
):
    r = random.Random(fault_seed())
    bed: Containerd = make_containerd()
    async with bed.cri_client() as client:
        before = await asking_containers(client, 4, 6, "down")
        plugin = start_plugin(bed, wait=False)  # the default: unserved: deny
        # Created and started all along the registration, at a drawn pace.
        failed: set[str] = set()
        around = asyncio.create_task(asking_containers(client, 2, 14, "around", failed))
        await asyncio.sleep(r.uniform(0.0, 1.0))
        await asyncio.to_thread(plugin.wait_connected, 60)
        made = before | await around
        deadline = time.monotonic() + SETTLE
        while (await live_containers(client)).unserved:  # killed, or never unserved
            assert time.monotonic() < deadline, await live_containers(client)
            await asyncio.sleep(0.1)
        live = await live_containers(client)
        denied = [cid for cid in made if cid not in live.served]
        assert set(before) <= set(denied), "created while no plugin ran, so unserved"
        for cid in set(denied) - failed:
            assert (await client.container_status(cid)).exit_code == 137, cid
        assert "unserved policy deny: denied: killed" in plugin.log()
        await listed_exactly(client, plugin)
        # The kubelet's next attempt goes through the plugin and is served.
        cid = next(iter(before))
        again = await create(client, made[cid], "main-1", {P + "gpu-memory": "512Mi"})
        await client.start(again)
        assert again in (await live_containers(client)).served
