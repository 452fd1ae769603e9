"""Containers that asked for a share and run without one: created while the
plugin was not serving (containerd failed open: the plugin was away,
registering after Synchronize's snapshot, or answered too late).  What the
node does about them is its `unserved` policy (warn | deny: the daemon's).

The list is kept exact across the plugin's registrations, when containerd
drops an NRI event queued behind Synchronize (it adds the new plugin only
after the snapshot): a container is found at Synchronize, at its
StartContainer or at its PostStartContainer, and leaves the list at its NRI
stop or removal, or at containerd's own word that its first process ended
(`end`, `gone`: the daemon follows containerd's events, subscribed before
the plugin registers).  A CRI container never starts again once its first
process ended, so what ended stays out even when a Synchronize snapshot
taken before the end still shows it running."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nri_gpushare.share.model import ContainerInfo, ShareRefused
from nri_gpushare.share.request import may_ask, parse_request
from nri_gpushare.share.table import ShareTable

log = logging.getLogger(__name__)


@dataclass
class Unserved:
    """A live container that asked for a share and runs without one."""

    container: ContainerInfo
    asked: str  # what it asked for, or why that request is refused
    action: str = "warned"  # what the node's `unserved` policy did about it
    settled: bool = False  # nothing more to do (deny: it was killed or is gone)

    def json(self) -> dict[str, Any]:
        c = self.container
        return {
            "container_id": c.id,
            "name": c.name,
            "pod": c.pod,
            "asked": self.asked,
            "action": self.action,
        }


class UnservedWatch:
    """Finds the unserved containers of `table` (kept in `table.unserved`)."""

    def __init__(self, table: ShareTable) -> None:
        self.table = table
        #: Containers whose first process ended, as containerd said: never
        #: unserved again (kept until they are removed or a Synchronize no
        #: longer lists them).
        self.ended: set[str] = set()

    def find(self, live: Sequence[ContainerInfo]) -> None:
        """Live containers that ask for a share and hold none (fail-open); the
        ones already known keep what was done about them."""
        table = self.table
        self.ended &= {c.id for c in live}  # the others cannot come back
        before, table.unserved = table.unserved, {}
        for c in live:
            if not c.running or c.id in table.allocations or c.id in self.ended:
                continue
            if not may_ask(c):
                continue  # asks for nothing (most containers): what `asked` would say
            if c.id in before:
                if self.asked(c) is not None:
                    kept = before[c.id]
                    kept.container = c  # its pid may be known by now
                    table.unserved[c.id] = kept
                continue
            self.started(c)

    def started(self, c: ContainerInfo) -> Unserved | None:
        """`c` starts (or runs) holding no share: when it asks for one, it was
        created while the plugin was not serving, so it is unserved; None when
        it asks for nothing."""
        table = self.table
        if c.id in table.allocations or c.id in self.ended:
            return None
        if (known := table.unserved.get(c.id)) is not None:
            return known
        asked = self.asked(c)
        if asked is None:
            return None
        entry = table.unserved[c.id] = Unserved(c, asked)
        log.warning(
            "%s asked for %s but runs without a share: it was created while the plugin "
            "was not serving (containerd failed open); unserved policy: %s",
            c.describe(),
            asked,
            table.policy.unserved,
        )
        return entry

    def end(self, container_id: str, why: str) -> None:
        """The container's first process ended (`why`): it leaves the list
        and no older snapshot brings it back."""
        self.ended.add(container_id)
        if (entry := self.table.unserved.pop(container_id, None)) is not None:
            log.info("%s: no longer unserved: %s", entry.container.describe(), why)

    def gone(self, container_id: str) -> None:
        """The container was removed: nothing is left to remember of it."""
        self.ended.discard(container_id)
        self.table.unserved.pop(container_id, None)

    def asked(self, c: ContainerInfo) -> str | None:
        """What `c` asks for (or why it would be refused); None: nothing."""
        try:
            req = parse_request(c, self.table.gpus, self.table.policy)
            if req is None:
                return None
            return req.describe()
        except ShareRefused as e:
            return f"a share it would be refused: {e}"
        except Exception as e:  # never let one container stop the rest
            return f"a share that cannot be read ({type(e).__name__})"
