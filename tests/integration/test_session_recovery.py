"""A broken NRI session is dropped and the plugin comes back, against a real containerd.

containerd 1.7.24 (NRI 0.6) keeps a plugin whose Synchronize failed connected
but never sends it an event, and closes a plugin that answered an event after
its request timeout (the container is then created without the plugin).  In
both cases the stub must end up synchronized on a new connection and receive
CreateContainer for the next pod.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nri_gpushare.nri.stub import Plugin, Stub
from tests.testbed.containerd import Containerd
from tests.testbed.cri import CriClient


class Flaky(Plugin):
    """Records its calls; fails its first Synchronize or stalls its first CreateContainer."""

    def __init__(self, *, fail_first_sync: bool = False, stall_first_create: float = 0.0) -> None:
        self.fail_first_sync = fail_first_sync
        self.stall_first_create = stall_first_create
        self.syncs = 0
        self.created: list[str] = []

    async def synchronize(self, pods, containers):
        self.syncs += 1
        if self.fail_first_sync and self.syncs == 1:
            raise RuntimeError("first Synchronize fails on purpose")
        return []

    async def create_container(self, pod, container):
        self.created.append(container.name)
        if self.stall_first_create and len(self.created) == 1:
            await asyncio.sleep(self.stall_first_create)
        return None


async def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def create_in_new_pod(client: CriClient, name: str) -> str:
    pod_id = await client.run_pod(name)
    return await client.create_container(pod_id, name, command=["true"])


def state(plugin: Flaky, stub: Stub) -> str:
    return (
        f"syncs={plugin.syncs} sessions={stub.sessions}"
        f" synchronized={stub.synchronized.is_set()} created={plugin.created}"
        f" last_error={stub.last_error!r}"
    )


async def test_failed_synchronize_is_dropped_and_the_plugin_gets_events(containerd, cri):
    seen = len(containerd.log_text())
    plugin = Flaky(fail_first_sync=True)
    stub = Stub(plugin, name="flaky", index="30", socket_path=str(containerd.nri_socket))
    task = asyncio.create_task(stub.run())
    try:
        synchronized = await wait_until(stub.synchronized.is_set, 15)
        # Create a container either way: on a stub that stayed on the broken
        # session, containerd creates it without asking the plugin.
        await create_in_new_pod(cri, "after-sync-failure")
        assert synchronized, state(plugin, stub)
        assert plugin.syncs == 2 and stub.sessions == 1, state(plugin, stub)
        assert plugin.created == ["after-sync-failure"], state(plugin, stub)
        assert stub.last_error.startswith("Synchronize failed"), state(plugin, stub)
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)
    log = containerd.log_text()[seen:]
    assert "failed to synchronize plugin" in log, log[-3000:]


async def test_handler_past_the_request_timeout_reconnects(make_containerd):
    bed: Containerd = make_containerd(plugin_request_timeout="1s")
    plugin = Flaky(stall_first_create=3.0)
    stub = Stub(plugin, name="slow", index="30", socket_path=str(bed.nri_socket))
    task = asyncio.create_task(stub.run())
    try:
        assert await wait_until(stub.synchronized.is_set, 15), state(plugin, stub)
        async with bed.cri_client() as client:
            # containerd gives up after 1 s, closes the plugin and creates the
            # container without it; the stub must come back on a new connection.
            await create_in_new_pod(client, "stalled")
            back = await wait_until(lambda: stub.sessions >= 2 and stub.synchronized.is_set(), 15)
            assert back, state(plugin, stub)
            await create_in_new_pod(client, "after-reconnect")
        assert plugin.created == ["stalled", "after-reconnect"], state(plugin, stub)
        assert stub.last_error == "the runtime closed the connection", state(plugin, stub)
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)
    assert "closing plugin 30-slow, failed to handle CreateContainer request" in bed.log_text()
