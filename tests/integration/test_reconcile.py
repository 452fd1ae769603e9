"""nri_gpushare.host.containerd.reconcile against the real containerd 1.7 of the
test bed, with containers started by hand (`ctr run`) and an owner that
records what it is told to release."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from nri_gpushare.host.containerd.client import TASK_EXIT, ContainerdClient
from nri_gpushare.host.containerd.reconcile import LocalRef, Reconciler
from tests.integration.test_containerd_client import NS, STUCK, actr, ctr, ctr_run_sleep
from tests.testbed.containerd import Containerd
from tests.testbed.images import build_images

pytestmark = pytest.mark.containerd


@pytest.fixture(scope="module")
def bed(containerd: Containerd) -> Containerd:
    """The module's test bed with the busybox image in namespace NS too."""
    if not containerd.running:
        containerd.start()
    ctr(containerd, "images", "import", str(build_images()))
    return containerd


@pytest.fixture
def names(bed: Containerd) -> Iterator[list[str]]:
    """Three fresh container IDs; whatever the test left of them is removed after."""
    base = "gs-rc-" + uuid.uuid4().hex[:8]
    made = [f"{base}-{n}" for n in ("a", "b", "c")]
    yield made
    for name in made:
        ctr(bed, "tasks", "kill", "-s", "SIGKILL", name, check=False)
        ctr(bed, "tasks", "rm", "-f", name, check=False)
        ctr(bed, "containers", "rm", name, check=False)


class Owner:
    """Holds local allocations; a release drops one and is recorded."""

    def __init__(self, refs: list[LocalRef]) -> None:
        self.refs = {(r.namespace, r.container_id): r for r in refs}
        self.released: list[tuple[str, str, str]] = []
        self.adopted: list[tuple[str, str, int]] = []

    def local_allocations(self) -> list[LocalRef]:
        return list(self.refs.values())

    async def adopt_local(self, namespace: str, container_id: str, pid: int) -> None:
        self.adopted.append((namespace, container_id, pid))
        ref = self.refs[(namespace, container_id)]
        self.refs[(namespace, container_id)] = LocalRef(namespace, container_id, pid, ref.since)

    async def release_local(self, namespace: str, container_id: str, why: str) -> None:
        self.released.append((namespace, container_id, why))
        del self.refs[(namespace, container_id)]

    def ids(self) -> list[str]:
        return [cid for _, cid, _ in self.released]


async def until(check: Callable[[], object], what: str) -> None:
    """Poll check() until it holds; STUCK only keeps a broken run from hanging."""
    deadline = asyncio.get_running_loop().time() + STUCK
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"stuck waiting for {what}"
        await asyncio.sleep(0.05)


async def kill_and_remove(bed: Containerd, name: str) -> None:
    """SIGKILL a task, then remove it once it has stopped: kill only sends the
    signal, and an rm at once can find the task still running."""
    await actr(bed, "tasks", "kill", "-s", "SIGKILL", name)
    deadline = asyncio.get_running_loop().time() + STUCK
    while True:
        listed = [line.split() for line in (await actr(bed, "tasks", "ls")).splitlines()[1:]]
        if [name, "STOPPED"] in [[f[0], f[-1]] for f in listed if f]:
            break
        assert asyncio.get_running_loop().time() < deadline, f"task {name} did not stop"
        await asyncio.sleep(0.05)
    await actr(bed, "tasks", "rm", name)


@contextlib.asynccontextmanager
async def following(bed: Containerd, owner: Owner) -> AsyncIterator[Reconciler]:
    """A running Reconciler that has made its first pass.  The period is long:
    what it releases after that pass, it releases on an event."""
    reconciler = Reconciler(str(bed.grpc_address), owner, period=3600.0, backoff=(0.05, 0.5))
    task = asyncio.create_task(reconciler.run())
    try:
        await until(lambda: reconciler.state()["last_reconcile"] is not None, "the first pass")
        yield reconciler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def start(bed: Containerd, names: list[str]) -> list[LocalRef]:
    """Run a container per name; their allocations, placed a minute ago (past
    the grace), with their init pids as containerd knows them."""
    for name in names:
        await ctr_run_sleep(bed, name)
    async with ContainerdClient(bed.grpc_address) as cd:
        pids = {t.id: t.pid for t in await cd.tasks(NS)}
    return [LocalRef(NS, name, pids[name], time.time() - 60) for name in names]


async def test_released_on_events_and_by_the_listing_after_a_restart(
    bed: Containerd, names: list[str]
) -> None:
    a, b, c = names
    owner = Owner(await start(bed, names))

    async with following(bed, owner) as reconciler:
        assert owner.released == []  # all three run, with the pids of their allocations
        await kill_and_remove(bed, a)
        await until(lambda: owner.released, "a's release")
        assert owner.ids() == [a]
        assert TASK_EXIT in owner.released[0][2]  # the init's exit, before the rm
        assert reconciler.state()["released"] == 1

    # Nobody follows: b's task goes, and containerd restarts (it replays nothing).
    await kill_and_remove(bed, b)
    await asyncio.to_thread(bed.restart)

    async with following(bed, owner) as reconciler:
        assert owner.ids() == [a, b]  # b at connect, by the listing
        assert "no task" in owner.released[1][2]
        state = reconciler.state()
        assert state["released"] == 1 and state["connected"] and state["last_error"] is None
    assert list(owner.refs) == [(NS, c)]  # c ran all along: never released


async def test_follows_containerd_across_a_restart(bed: Containerd, names: list[str]) -> None:
    a, b, _ = names
    refs = await start(bed, [a, b])
    owner = Owner(refs)
    async with following(bed, owner) as reconciler:
        await asyncio.to_thread(bed.restart)
        await until(
            lambda: reconciler.state()["reconnects"] == 1 and reconciler.state()["connected"],
            "a reconnect",
        )
        assert reconciler.state()["last_error"]  # why it had to reconnect
        assert owner.released == []  # both still run, with the same pids
        await actr(bed, "tasks", "kill", "-s", "SIGKILL", a)
        await until(lambda: owner.released, "a's release")
        assert owner.ids() == [a]
        assert TASK_EXIT in owner.released[0][2]
        # An exec'd process that ends is not the end of the container.
        await actr(bed, "tasks", "exec", "--exec-id", "probe", b, "true")
        await actr(bed, "tasks", "kill", "-s", "SIGKILL", b)
        await until(lambda: len(owner.released) == 2, "b's release")
        assert owner.ids() == [a, b]
        assert f"pid {refs[1].pid}" in owner.released[1][2]  # the init's exit, not the exec's


async def test_a_recovered_allocation_is_given_its_running_task(
    bed: Containerd, names: list[str]
) -> None:
    # A daemon restart between a container's create and its start leaves the
    # allocation with no pid: the listing gives it the task's init pid, once.
    # (Its cgroup and the binding are checked in the guest, whose cgroup v2
    # is the container's; tests/guest/fault_guest_runc.py.)
    a, _, _ = names
    (ref,) = await start(bed, [a])
    owner = Owner([LocalRef(NS, a, 0, ref.since)])
    async with following(bed, owner):
        await until(lambda: owner.adopted, "the adoption")
    assert owner.adopted == [(NS, a, ref.pid)] and owner.released == []
