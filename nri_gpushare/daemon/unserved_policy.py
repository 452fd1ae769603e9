"""The node's `unserved` policy, where the NRI handler finds a container that
asked for a share and runs without one (Synchronize, StartContainer,
PostStartContainer): `deny` kills it once it has a process.  And Configure's
wait for containerd's events (`Follower`), which keep the list exact while
the plugin registers: containerd adds a registering plugin only after its
Synchronize, so an event queued behind the snapshot never reaches it."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from nri_gpushare.host.devices import kill_container
from nri_gpushare.share.service import ShareService
from nri_gpushare.share.unserved import Unserved

log = logging.getLogger(__name__)

FOLLOW_WITHIN = 0.5
"""Share of the runtime's request timeout Configure may wait for containerd's
events to be followed."""


class Follower(Protocol):
    """containerd's events, followed (the daemon's Reconciler)."""

    @property
    def following(self) -> asyncio.Event: ...

    def retry_now(self) -> None: ...


class UnservedPolicy:
    def __init__(self, service: ShareService, follower: Follower | None = None) -> None:
        self.service = service
        #: containerd's events; None: config containerd.socket is off.
        self.follower = follower

    def deny(self, entry: Unserved) -> None:
        """With unserved: deny, end an unserved container (once it has a process)."""
        if self.service.policy.unserved != "deny" or entry.settled:
            return
        info = entry.container
        outcome = kill_container(info.id, info.pid)
        entry.action = "denied: " + outcome
        entry.settled = outcome.startswith(("killed", "already gone"))
        log.warning("%s: unserved policy deny: %s", info.describe(), entry.action)

    async def followed(self, request_timeout: float) -> None:
        """Until containerd's events are followed, at most `FOLLOW_WITHIN` of
        the runtime's request timeout (Configure must be answered in time)."""
        follower = self.follower
        if follower is None or follower.following.is_set():
            return
        follower.retry_now()  # a reconnection waiting out its backoff goes now
        try:
            async with asyncio.timeout(FOLLOW_WITHIN * request_timeout):
                await follower.following.wait()
        except TimeoutError:
            log.warning(
                "containerd's events are not followed yet: a container that stops while "
                "the plugin registers may stay listed as unserved until the next Synchronize"
            )
