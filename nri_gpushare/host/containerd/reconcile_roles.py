"""Who the containerd `Reconciler` deals with: the owner of the local
allocations it releases, an observer it tells what containerd says, and the
containerd client it asks (tests give fakes of each)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from nri_gpushare.host.containerd.client import TaskInfo
from nri_gpushare.host.containerd.events import Event
from nri_gpushare.share.model import LocalRef


class LocalOwner(Protocol):
    """Who holds the local allocations (the daemon's share service)."""

    def local_allocations(self) -> list[LocalRef]: ...

    async def release_local(self, namespace: str, container_id: str, why: str) -> None: ...

    async def adopt_local(self, namespace: str, container_id: str, pid: int) -> None:
        """The container's task runs with first process `pid`, which the owner
        was never told (its LocalRef's pid is 0)."""


class TaskObserver(Protocol):
    """Told what containerd says of the tasks of `namespace`: a listing once
    per connection (events from then on are not missed) and every event
    followed, of any namespace."""

    namespace: str

    def listed(self, tasks: list[TaskInfo]) -> None: ...

    def event(self, event: Event) -> None: ...


class ContainerdAPI(Protocol):
    """What the Reconciler uses of a ContainerdClient (tests give a fake)."""

    async def __aenter__(self) -> ContainerdAPI: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    def subscribe(
        self, filters: Iterable[str] = ...
    ) -> AbstractAsyncContextManager[AsyncIterator[Event]]: ...

    async def namespaces(self) -> list[str]: ...

    async def tasks(self, namespace: str) -> list[TaskInfo]: ...
