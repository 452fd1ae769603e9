"""Memory in use per container and GPU, for status: what the kernel module's
ledger counts (the interposer reserves there before each allocation).

The daemon wires in `MemoryUsage` (`nri_gpushare.host.ModuleMemInfo`, reading
/proc/gpushare/<gpu>/<id>/meminfo); without the module it is unknown, and
status says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class MemoryUse:
    """used: bytes held on the GPU by the container's processes (quota − the
    module's Free), None when unknown; processes: pid -> bytes; why: when
    unknown, why."""

    used: int | None
    processes: Mapping[int, int] = field(default_factory=dict)
    why: str = ""


class MemoryUsage(Protocol):
    async def usage(
        self, wanted: Sequence[tuple[int, str, int]]
    ) -> Mapping[tuple[int, str], MemoryUse]:
        """For each (GPU index, container ID, quota bytes): what it uses."""
