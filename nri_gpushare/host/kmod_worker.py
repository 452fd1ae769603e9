"""The kernel module off the event loop: a blocking `KernelModuleClient` run on
one `BlockingWorker` thread, awaited under a timeout.

- Accesses run one at a time in the order they were asked, so an
  unregistration asked after a registration runs after it, even when the
  registration's caller gave up waiting.
- Each await gives up after `timeout` seconds with `KmodError` (ETIMEDOUT).
  A caller that is cancelled gives up the same way.
  A file access cannot be interrupted: a running one goes on, so a caller
  treats a timed-out request as possibly done (the share domain undoes a
  registration that timed out).  One that had not started yet is dropped,
  except unregistrations and quota changes, which always run (a resize's
  change back must land after the change it undoes).
- While one access has been running for longer than `timeout`, the module is
  stuck: new requests fail at once instead of each waiting out its timeout
  (unregistrations and quota changes are still queued), so a stuck kernel costs one
  CreateContainer at most one timeout, far inside containerd's 2 s.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import TypeVar

from nri_gpushare.host.worker import BlockingWorker, WorkerStuck, WorkerTimeout
from nri_gpushare.share.kernel import (
    GpuDeclaration,
    GpuQuota,
    KernelModuleClient,
    KmodError,
    Registration,
)

DEFAULT_TIMEOUT = 0.5  # seconds per access; real ones take microseconds
T = TypeVar("T")


class OffLoopKernelModule:
    """`KernelModule` over a blocking client, on one daemon thread."""

    def __init__(self, client: KernelModuleClient, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.client = client
        self.timeout = timeout
        self._worker = BlockingWorker("gpushare-kmod", timeout, strict=True)

    # -- KernelModule ---------------------------------------------------------------------

    async def loaded(self) -> bool:
        return await self._call(self.client.loaded, "checking whether gpushare.ko is loaded")

    async def declare_gpus(self, gpus: Sequence[GpuDeclaration]) -> None:
        listed = ", ".join(str(g.index) for g in gpus)
        await self._call(
            lambda: self.client.declare_gpus(gpus), f"declaring GPUs {listed} to gpushare.ko"
        )

    async def register(self, registration: Registration) -> None:
        cid = registration.container_id
        await self._call(lambda: self.client.register(registration), f"registering container {cid}")

    async def bind_cgroup(self, container_id: str, cgroup_path: str) -> None:
        await self._call(
            lambda: self.client.bind_cgroup(container_id, cgroup_path),
            f"binding container {container_id} to cgroup {cgroup_path}",
        )

    async def unregister(self, container_id: str) -> None:
        await self._call(
            lambda: self.client.unregister(container_id),
            f"unregistering container {container_id}",
            must_run=True,
        )

    async def registrations(self) -> list[Registration]:
        return await self._call(self.client.registrations, "reading gpushare.ko's registry")

    async def update_quota(self, container_id: str, quota: GpuQuota) -> None:
        await self._call(
            lambda: self.client.update_quota(container_id, quota),
            f"changing container {container_id}'s quota on GPU {quota.gpu_index}",
            must_run=True,
        )

    async def upgrading(self) -> bool:
        """Whether `nri-gpushare kmod-upgrade` has frozen the module."""
        return await self._call(self.client.upgrading, "reading gpushare.ko's upgrade state")

    # -- the worker ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker after the accesses already queued."""
        self._worker.close()

    def stuck_for(self) -> float | None:
        """Seconds the running access has taken, when that is more than `timeout`
        (or its caller already gave up on it); None when the module is not stuck."""
        return self._worker.stuck_for()

    async def _call(self, fn: Callable[[], T], what: str, *, must_run: bool = False) -> T:
        """The worker's call, its timeouts in the module's words (KmodError
        ETIMEDOUT; each message says all there is to say)."""
        try:
            return await self._worker.call(fn, what, must_run=must_run)
        except WorkerStuck as e:
            since = f"gpushare.ko has not answered for {e.seconds:.1f} s ({e.running})"
            if e.queued:
                message = f"{since}; {what} will run when it does"
            else:
                message = (
                    f"{since}, so it was not asked ({what}); the kernel may be stuck, see dmesg"
                )
            raise KmodError(message, errno.ETIMEDOUT) from None
        except WorkerTimeout as e:
            if e.attempted:
                message = f"gpushare.ko did not answer within {self.timeout:g} s ({what})"
            else:
                message = (
                    f"gpushare.ko did not answer within {self.timeout:g} s (an earlier request"
                    f" was still running; {what} was not attempted)"
                )
            raise KmodError(
                f"{message}; the kernel may be stuck, see dmesg", errno.ETIMEDOUT
            ) from None
