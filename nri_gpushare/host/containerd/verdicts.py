"""Whether what containerd says shows a local allocation's container gone: a
task listing (`listing_verdict`) or an event about it (`event_verdict`).
Each answers why in words, or None; the Reconciler releases on an answer."""

from __future__ import annotations

from datetime import datetime

from nri_gpushare.host.containerd.client import (
    CONTAINER_DELETE,
    TASK_DELETE,
    TASK_EXIT,
    Event,
    TaskInfo,
)
from nri_gpushare.share.model import LocalRef

_WHAT = {TASK_EXIT: "exited", TASK_DELETE: "was deleted", CONTAINER_DELETE: "was deleted"}


def listing_verdict(ref: LocalRef, task: TaskInfo | None) -> str | None:
    """Why the listing shows this allocation's container gone, or None."""
    if task is None:
        return "containerd has no task for the container"
    if task.status == "stopped":
        return f"its task (pid {task.pid}) has stopped"
    if ref.pid and task.pid and task.pid != ref.pid:
        return f"its task is a new one (pid {task.pid}, not {ref.pid})"
    return None


def event_verdict(ref: LocalRef, event: Event) -> str | None:
    """Why `event` (one of TOPICS about `ref`'s container, its init process
    for a task event) ends this incarnation, or None: with the allocation's
    pid known the event's pid must be it; where either pid is not known the
    event must be no older than the allocation."""
    topic = event.topic
    pid: int | None = None
    if topic != CONTAINER_DELETE:  # /containers/delete has no pid
        if type(event.pid) is int and event.pid > 0:
            pid = event.pid
        elif event.pid not in (None, 0):
            return None  # a pid that is not one
    when = epoch(event.timestamp)
    if ref.pid and pid is not None:
        if pid != ref.pid:
            return None  # an earlier incarnation's
    elif when is None or when < ref.since:
        return None  # older than the allocation, or undated
    subject = "the container" if topic == CONTAINER_DELETE else "its task"
    detail = f" (pid {pid})" if pid is not None else ""
    return f"{subject} {_WHAT[topic]}{detail}: containerd event {topic}"


def epoch(stamp: object) -> float | None:
    """An event's timestamp in seconds since the epoch; None when it has none
    that is one."""
    if not isinstance(stamp, datetime):
        return None
    try:
        return stamp.timestamp()
    except (OverflowError, ValueError, OSError):
        return None
