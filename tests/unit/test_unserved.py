"""The unserved list kept exact across the plugin's registrations: what
containerd says of CRI's tasks (`UnservedObserver`) takes a container off
the list for good, a PostStartContainer finds a container whose
StartContainer containerd dropped, and Configure waits for containerd's
events to be followed (see nri_gpushare/share/unserved.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nri_gpushare.daemon.adapters import CRI_NAMESPACE, UnservedObserver
from nri_gpushare.daemon.main import build_service
from nri_gpushare.daemon.nri_handler import GpuShareHandler
from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    Event,
    TaskInfo,
)
from nri_gpushare.nri.api import lite, nri
from tests.unit.test_daemon import container_in_pod, off_config, pod_asking_1gi

RUNNING = nri.ContainerState.CONTAINER_RUNNING


async def handler_for(tmp_path, **settings) -> GpuShareHandler:
    return GpuShareHandler(await build_service(off_config(tmp_path, **settings), None))


async def test_a_container_that_ended_stays_off_the_list_whatever_an_older_snapshot_says(
    tmp_path,
):
    """containerd tells NRI of an exit before CRI shows it, and sends no stop
    to a plugin that registers in between: its Synchronize still lists the
    container running.  containerd's own word that the first process ended
    keeps it off the list until the container is removed or no longer listed."""
    handler = await handler_for(tmp_path, unserved="warn")
    watch = handler.service.unserved_watch
    pod, c1 = pod_asking_1gi(), container_in_pod("c1", 42, RUNNING)
    await handler.synchronize([pod], [c1, container_in_pod("c2", 43, RUNNING)])
    assert sorted(handler.service.unserved) == ["c1", "c2"]
    watch.end("c1", "containerd: /tasks/exit")
    assert list(handler.service.unserved) == ["c2"]
    await handler.synchronize([pod], [c1])  # a snapshot older than the exit
    assert handler.service.unserved == {} and watch.ended == {"c1"}
    await handler.start_container(pod, c1)  # nor does a late event bring it back
    await handler.post_start_container(pod, c1)
    assert handler.service.unserved == {}
    await handler.synchronize([pod], [])  # no longer listed: nothing left to remember
    assert watch.ended == set()
    watch.end("c3", "containerd: /tasks/exit")
    watch.gone("c3")  # removed
    assert watch.ended == set()


async def test_removing_a_container_forgets_it(tmp_path):
    handler = await handler_for(tmp_path, unserved="warn")
    pod, c1 = pod_asking_1gi(), container_in_pod("c1", 42, RUNNING)
    await handler.synchronize([pod], [c1])
    handler.service.unserved_watch.end("c1", "containerd: /tasks/exit")
    await handler.remove_container(pod, c1)
    assert handler.service.unserved_watch.ended == set()


async def test_post_start_finds_a_container_whose_start_event_was_dropped(tmp_path, monkeypatch):
    """containerd adds a registering plugin after Synchronize: an event queued
    behind the snapshot (here c5's StartContainer; c5 was created after it)
    never reaches the plugin.  Its PostStartContainer does, and finds it."""
    handler = await handler_for(tmp_path, unserved="deny")
    killed: list[tuple[str, int]] = []
    monkeypatch.setattr(
        "nri_gpushare.daemon.unserved_policy.kill_container",
        lambda cid, pid: killed.append((cid, pid)) or f"killed (process {pid})",
    )
    pod = pod_asking_1gi()
    await handler.synchronize([pod], [])
    await handler.post_start_container(pod, container_in_pod("c5", 42, RUNNING))
    [entry] = handler.service.status()["unserved"]
    assert entry["container_id"] == "c5" and entry["action"] == "denied: killed (process 42)"
    assert killed == [("c5", 42)]
    # One that asks for nothing, or holds its share, is left alone.
    web = lite.decode_pod_sandbox(bytes(nri.PodSandbox(id="q", name="web", namespace="ns")))
    plain = lite.decode_container(bytes(nri.Container(id="c7", pod_sandbox_id="q", pid=7)))
    await handler.post_start_container(web, plain)
    served = container_in_pod("c6", 0, nri.ContainerState.CONTAINER_CREATED)
    assert await handler.create_container(pod, served) is not None
    await handler.post_start_container(pod, container_in_pod("c6", 44, RUNNING))
    assert list(handler.service.unserved) == ["c5"] and killed == [("c5", 42)]


async def test_the_observer_takes_containerds_word_on_cri_tasks_only(tmp_path):
    handler = await handler_for(tmp_path, unserved="warn")
    watch = handler.service.unserved_watch
    observer = UnservedObserver(watch)
    assert observer.namespace == CRI_NAMESPACE == "k8s.io"
    pod = pod_asking_1gi()
    await handler.synchronize([pod], [container_in_pod(c, 1, RUNNING) for c in "abcdef"])
    # A listing right after subscribing: what had stopped before, not what runs.
    observer.listed([TaskInfo("a", 1, "stopped"), TaskInfo("b", 1, "running")])
    observer.event(Event(CRI_NAMESPACE, TASK_EXIT, "c", pid=1, process_id="c"))
    observer.event(Event(CRI_NAMESPACE, TASK_DELETE, "d", pid=1, process_id="d"))
    observer.event(Event(CRI_NAMESPACE, CONTAINER_DELETE, "e"))
    # Not ended: an exec'd process, another namespace's container of the same
    # ID, an event whose payload could not be read.
    observer.event(Event(CRI_NAMESPACE, TASK_EXIT, "b", pid=9, process_id="exec-1"))
    observer.event(Event("default", TASK_EXIT, "f", pid=1, process_id="f"))
    observer.event(Event(CRI_NAMESPACE, TASK_EXIT))
    assert sorted(handler.service.unserved) == ["b", "f"]
    assert watch.ended == {"a", "c", "d"}


class Follower:
    """A Reconciler as Configure sees it."""

    def __init__(self) -> None:
        self.following = asyncio.Event()
        self.retried = 0

    def retry_now(self) -> None:
        self.retried += 1


async def test_configure_waits_until_containerds_events_are_followed(tmp_path, caplog):
    service = await build_service(off_config(tmp_path), None)
    follower = Follower()
    handler = GpuShareHandler(service, request_timeout=lambda: 60.0, follower=follower)
    configure = asyncio.create_task(handler.configure("", "containerd", "1.7.24"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not configure.done() and follower.retried == 1  # its backoff is cut short
    follower.following.set()
    assert await configure is None
    await handler.configure("", "containerd", "1.7.24")  # followed already: no wait
    assert follower.retried == 1 and "not followed" not in caplog.text


async def test_configure_does_not_wait_past_half_the_request_timeout(tmp_path, caplog):
    service = await build_service(off_config(tmp_path), None)
    follower = Follower()
    handler = GpuShareHandler(service, request_timeout=lambda: 0.02, follower=follower)
    caplog.set_level(logging.WARNING)
    await asyncio.wait_for(handler.configure("", "containerd", "1.7.24"), 5)
    assert "containerd's events are not followed yet" in caplog.text
    without = GpuShareHandler(service)  # containerd.socket: "" follows nothing
    await without.configure("", "containerd", "1.7.24")


@pytest.mark.parametrize("policy", ["warn", "deny"])
async def test_an_ended_container_is_not_denied(tmp_path, monkeypatch, policy):
    handler = await handler_for(tmp_path, unserved=policy)
    killed: list[str] = []
    monkeypatch.setattr(
        "nri_gpushare.daemon.unserved_policy.kill_container",
        lambda cid, pid: killed.append(cid) or "killed",
    )
    handler.service.unserved_watch.end("c1", "containerd lists its task as stopped")
    await handler.synchronize([pod_asking_1gi()], [container_in_pod("c1", 42, RUNNING)])
    assert handler.service.unserved == {} and killed == []
