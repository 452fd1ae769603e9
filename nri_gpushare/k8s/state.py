"""The device plugin's state: the device lists of every resource, refreshed
about once a second from the daemon's status document and GPU health, plus
the grants of ``Allocate`` calls whose containers the daemon does not show
yet.  The IDs an ``Allocate`` handed out count as in use until the daemon
shows them on a new live container, the kubelet shows it no longer holds them
(it offers them again in ``GetPreferredAllocation`` or allocates them again),
or an hour passes (the kubelet allocates at admission; the container is
created after the image pull and the init containers, which can take long).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from nri_gpushare.k8s.capacity import Device, Grant, advertise, live_ids
from nri_gpushare.share.ids import format_ids, id_number
from nri_gpushare.share.model import Gpu

log = logging.getLogger(__name__)

PENDING_TTL = 3600.0
"""Seconds an Allocate's IDs count as in use at most, when neither the daemon
nor the kubelet shows what became of them."""
SLOT_TTL = 600.0
"""Seconds a grant also holds a container slot (max_inst).  A grant whose pod
was deleted before its container was seen holds memory and compute without
harm (its IDs stay admittable), but a slot held keeps the node's room out of
sight."""
RESTART_TTL = 360.0
"""Seconds the IDs of a container that stopped count as in use at most (the
kubelet restarts a container with the same IDs, after a back-off of up to
5 minutes), when neither the daemon nor the kubelet shows what became of them."""
HEALTH_TIMEOUT = 10.0
"""Seconds an NVML health check may take before every GPU counts as unhealthy."""
HEALTH_WAIT = 1.0
"""Seconds a refresh waits for a health check (the last result stands meanwhile)."""

StatusSource = Callable[[], Mapping[str, Any]]
"""The daemon's status document (blocking); raises when it cannot be had."""
HealthSource = Callable[[], Collection[int]]
"""The GPU indexes that are unhealthy (blocking)."""


class _Waiting(NamedTuple):
    """A grant whose container is not live yet."""

    stamp: float
    grant: Grant
    holders: frozenset[str]
    """Containers that held some of its IDs when it was made (the kubelet let
    go of them; the daemon had not yet): they do not make the grant live."""
    ttl: float = PENDING_TTL


def _holders(status: Mapping[str, Any] | None) -> list[tuple[str, Mapping[str, frozenset[int]]]]:
    """(container ID, resource -> IDs) of every live allocation in `status`."""
    out: list[tuple[str, Mapping[str, frozenset[int]]]] = []
    for alloc in (status or {}).get("allocations", ()):
        if isinstance(alloc, Mapping):
            out.append((str(alloc.get("container_id")), live_ids({"allocations": [alloc]})))
    return out


class PluginState:
    """The device lists of every resource and what they are computed from."""

    def __init__(
        self,
        inventory: Sequence[Gpu],
        memory_reserve_bytes: int,
        max_inst: int,
        status: StatusSource,
        health: HealthSource = frozenset,
        clock: Callable[[], float] = time.monotonic,
        health_timeout: float = HEALTH_TIMEOUT,
    ) -> None:
        self._inventory = tuple(inventory)
        self._reserve = memory_reserve_bytes
        self._max_inst = max_inst
        self._status_source = status
        self._health_source = health
        self._health_timeout = health_timeout
        self._health_job: asyncio.Future[Collection[int]] | None = None
        self._health_since = 0.0
        self._health_known = False
        self._clock = clock
        self._status: Mapping[str, Any] | None = None
        self._unhealthy: frozenset[int] = frozenset()
        self._pending: list[_Waiting] = []
        self._live: dict[str, Mapping[str, frozenset[int]]] = {}
        self._gone: set[str] = set()
        """Live containers whose IDs the kubelet handed out again: it let go of them."""
        self._reachable: bool | None = None
        self._changed = asyncio.Event()
        self.version = 0
        self.devices: dict[str, tuple[Device, ...]] = {}
        self._publish(self._advertise(None))

    @property
    def pending(self) -> tuple[Grant, ...]:
        return tuple(w.grant for w in self._pending)

    def listed(self, short: str) -> frozenset[int]:
        """The numbers of the devices `short` lists (healthy or not)."""
        return frozenset(id_number(d.id) for d in self.devices[short])

    async def refresh(self) -> None:
        """Ask the daemon and NVML (off the loop) and recompute."""
        try:
            status: Mapping[str, Any] | None = await asyncio.to_thread(self._status_source)
            problem = ""
        except Exception as e:  # down, restarting, a garbled reply: nothing is free
            status, problem = None, str(getattr(e, "strerror", None) or e)
        self.update(status, await self._health(), problem)

    async def _health(self) -> frozenset[int]:
        """The unhealthy GPUs.  One NVML check runs at a time, in a thread; a
        refresh waits for it a second at most and keeps the last result
        meanwhile.  One that has not answered within the timeout (a GPU
        wedged in the driver) makes every GPU unhealthy until it answers,
        as does having no answer yet."""
        if self._health_job is None:
            self._health_job = _in_daemon_thread(self._health_source)
            self._health_since = time.monotonic()
        job = self._health_job
        deadline = self._health_since + self._health_timeout
        await asyncio.wait({job}, timeout=max(0.0, min(deadline - time.monotonic(), HEALTH_WAIT)))
        if not job.done():
            late = time.monotonic() >= deadline
            if not late and self._health_known:
                return self._unhealthy
            if late and self._unhealthy != self._all():
                log.warning(
                    "NVML has not answered a health check for %.0f s: every GPU is reported "
                    "unhealthy until it does",
                    self._health_timeout,
                )
            return self._all()
        self._health_job = None
        try:
            unhealthy = frozenset(job.result())
        except Exception as e:
            log.warning("GPU health check failed (%s); keeping the last result", e)
            return self._unhealthy
        self._health_known = True
        return unhealthy

    @property
    def health_busy(self) -> bool:
        """Whether a health check is still running (NVML may hang in it)."""
        return self._health_job is not None and not self._health_job.done()

    def _all(self) -> frozenset[int]:
        return frozenset(g.index for g in self._inventory)

    def update(
        self, status: Mapping[str, Any] | None, unhealthy: frozenset[int], problem: str = ""
    ) -> None:
        """Take a new status document (None: the daemon cannot be reached,
        `problem` says why) and the unhealthy GPUs; drop the grants the
        daemon now shows or that are too old; recompute."""
        if unhealthy != self._unhealthy:
            log.warning("unhealthy GPUs (NVML): %s", sorted(unhealthy) or "none")
        self._unhealthy = unhealthy
        try:
            holders = _holders(status)
            if status is not None:
                self._stopped(dict(holders))
            self._drop_grants(holders)
            devices = self._advertise(status)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if status is None:
                raise
            # A daemon of another version, say: treat it as unreachable.
            status, problem = None, f"the document is not understood: {type(e).__name__} {e}"
            devices = self._advertise(None)
        if (status is not None) != self._reachable:
            if status is None:
                log.warning(
                    "the daemon's status cannot be read (%s): every device is reported "
                    "unhealthy until it can (is `nri-gpushare run` running?)",
                    problem or "no reply",
                )
            else:
                log.info("the daemon's status can be read: advertising its free capacity")
            self._reachable = status is not None
        self._status = status
        self._publish(devices)

    def _stopped(self, live: dict[str, Mapping[str, frozenset[int]]]) -> None:
        """A container that held kubelet IDs and is gone may be restarted by
        the kubelet with the same IDs (no Allocate then): its IDs count as a
        grant again until a new container holds them, the kubelet shows it
        let go of them, or `RESTART_TTL` passes.  Its memory and compute,
        not its container slot: most such containers belong to deleted pods,
        and holding their slots would keep the node's room out of sight."""
        now = self._clock()
        for cid, held in self._live.items():
            if cid in live or cid in self._gone:
                continue
            for short, ids in held.items():
                if ids:
                    log.debug("container %s stopped: its %s %s wait", cid, short, format_ids(ids))
                    grant = Grant(short, ids, slot=False)
                    self._pending.append(_Waiting(now, grant, frozenset({cid}), RESTART_TTL))
        self._live = live
        self._gone &= live.keys()

    def _drop_grants(self, holders: Sequence[tuple[str, Mapping[str, frozenset[int]]]]) -> None:
        """Forget the grants a new live container holds and those too old."""
        now = self._clock()
        kept = []
        for waiting in self._pending:
            grant = waiting.grant
            if any(
                grant.ids & ids.get(grant.short, frozenset())
                for cid, ids in holders
                if cid not in waiting.holders
            ):
                log.debug("grant %s %s is live", grant.short, format_ids(grant.ids))
            elif now - waiting.stamp >= waiting.ttl:
                log.info(
                    "grant %s %s expired: no container took it within %.0f s",
                    grant.short,
                    format_ids(grant.ids),
                    waiting.ttl,
                )
            else:
                kept.append(waiting)
        self._pending = kept

    def grant(self, grants: Iterable[Grant]) -> None:
        """Count what an Allocate call handed out as in use from now on.  A
        new grant replaces older ones sharing its IDs: the kubelet hands IDs
        out again only once it let go of them (that container will not come)
        or to a container reusing its pod's init container's IDs."""
        now = self._clock()
        holders = _holders(self._status)
        for grant in grants:
            self._forget(grant.short, grant.ids, "the kubelet allocated its IDs again")
            old = frozenset(
                cid for cid, ids in holders if grant.ids & ids.get(grant.short, frozenset())
            )
            self._gone |= old
            self._pending.append(_Waiting(now, grant, old))
        self._publish(self._advertise(self._status))

    def kubelet_frees(self, short: str, ids: frozenset[int]) -> None:
        """The kubelet offers `ids` as available: it holds none of them, so
        grants with any of them belong to containers it gave up."""
        if self._forget(short, ids, "the kubelet lists its IDs as free"):
            self._publish(self._advertise(self._status))

    def _forget(self, short: str, ids: frozenset[int], why: str) -> bool:
        kept = [w for w in self._pending if w.grant.short != short or not w.grant.ids & ids]
        if len(kept) == len(self._pending):
            return False
        for w in self._pending:
            if w not in kept:
                log.info("grant %s %s dropped: %s", short, format_ids(w.grant.ids), why)
        self._pending = kept
        return True

    def _advertise(self, status: Mapping[str, Any] | None) -> dict[str, tuple[Device, ...]]:
        if status is not None and self._gone:
            # Their share is still in the daemon's figures, but their IDs are
            # the kubelet's to hand out: not healthy as a live container's.
            status = dict(status)
            status["allocations"] = [
                a
                for a in status.get("allocations", ())
                if not (isinstance(a, Mapping) and str(a.get("container_id")) in self._gone)
            ]
        now = self._clock()
        pending = [
            w.grant if now - w.stamp < SLOT_TTL else dataclasses.replace(w.grant, slot=False)
            for w in self._pending
        ]
        return advertise(
            status, self._inventory, self._reserve, self._max_inst, pending, self._unhealthy
        )

    def _publish(self, devices: dict[str, tuple[Device, ...]]) -> None:
        if devices != self.devices:
            self.devices = devices
            self.version += 1
            self.wake()

    def wake(self) -> None:
        """Wake every `changed` waiter."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, version: int) -> None:
        """Return once `version` is not current, or on `wake`."""
        if self.version == version:
            await self._changed.wait()


def _in_daemon_thread(call: Callable[[], Collection[int]]) -> asyncio.Future[Collection[int]]:
    """`call()` in a thread of its own that the process does not wait for at
    exit (the default executor's would be: a hung NVML call would hang SIGTERM)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Collection[int]] = loop.create_future()

    def settle(result: Collection[int] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def run() -> None:
        try:
            result, error = call(), None
        except Exception as e:
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="gpushare-health", daemon=True).start()
    return future
