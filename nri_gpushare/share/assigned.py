"""The ``gpushare.io/assigned`` annotation: what a container was given, written
into it at CreateContainer for people and tools (``crictl inspect``).

Compact JSON, keys sorted::

    {"gpus": [{"core": 30, "index": 0, "memory": 2147483648, "uuid": "GPU-..."}],
     "isolation": "full", "priority": "normal", "version": 1}

It is output only: the plugin never reads it back (a container or its pod can
set it), and one found on a container's input is ignored with a warning and
removed.  Recovery uses the daemon's records and the kernel module
(`records`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nri_gpushare.share.model import Allocation, GpuShare

VERSION = 1


def share_json(s: GpuShare) -> dict[str, Any]:
    """One GPU share as the annotation, the records and the status document write it."""
    return {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}


def assigned_annotation(alloc: Allocation) -> str:
    """The gpushare.io/assigned value for an allocation."""
    data: Mapping[str, Any] = {
        "version": VERSION,
        "gpus": [share_json(s) for s in alloc.shares],
        "priority": alloc.priority,
        "isolation": alloc.isolation,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
