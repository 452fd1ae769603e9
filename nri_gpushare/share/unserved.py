"""Containers that asked for a share and run without one: created while the
plugin was not serving (containerd failed open: the plugin was away,
registering after Synchronize's snapshot, or answered too late).  What the
node does about them is its `unserved` policy (warn | deny: the daemon's)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nri_gpushare.share.model import ContainerInfo, ShareRefused
from nri_gpushare.share.request import parse_request
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

    def find(self, live: Sequence[ContainerInfo]) -> None:
        """Live containers that ask for a share and hold none (fail-open); the
        ones already known keep what was done about them."""
        table = self.table
        before, table.unserved = table.unserved, {}
        for c in live:
            if not c.running or c.id in table.allocations:
                continue
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
        if c.id in table.allocations:
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
