"""The injection plan: what a container with a share is given.

Injected environment: NVIDIA_VISIBLE_DEVICES and GPUSHARE_GPU_UUIDS (UUIDs in
the container's GPU order), GPUSHARE_MEMORY_LIMIT (bytes per GPU),
GPUSHARE_CORE_LIMIT (percent per GPU, 0 for a GPU without a limit; absent when
no GPU has one or isolation is memory), GPUSHARE_PRIORITY (normal|high),
GPUSHARE_ISOLATION (full|memory|none).  The quota variables are also given with
isolation none, for applications that isolate themselves.

The interposer: a share that was given it (`Allocation.interposer`, decided at
create from its isolation and whether the node has the library) gets the
mounts and variables of `interposer.interposer_injection`.

The ``gpushare.io/assigned`` annotation says what the container was given,
for people and tools (``crictl inspect``); compact JSON, keys sorted::

    {"gpus": [{"core": 30, "index": 0, "memory": 2147483648, "uuid": "GPU-..."}],
     "isolation": "full", "priority": "normal", "version": 1}

It is output only: the plugin never reads it back as a grant (a container or
its pod can set it), and one found on a container's input is ignored with a
warning and removed.  Recovery uses the daemon's records and the kernel
module (`records`), and only compares a live container's annotation with
what the record says it was given.

Device nodes: the common NVIDIA nodes, one per GPU, and the kernel module's
control device when the container is registered with the module.  Which nodes
the host has is asked through `DeviceLookup` (the daemon wires in the host's,
`nri_gpushare.host.devices.HostDevices`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from nri_gpushare.names import ASSIGNED
from nri_gpushare.share.interposer import interposer_injection
from nri_gpushare.share.model import (
    Allocation,
    DeviceNode,
    Gpu,
    GpuShare,
    InjectionPlan,
    InterposerPolicy,
    Mount,
)

ASSIGNED_VERSION = 1


class DeviceLookup(Protocol):
    def common(self) -> tuple[DeviceNode, ...]:
        """Nodes every GPU container needs: nvidiactl, and uvm ones when present."""

    def gpu(self, minor: int) -> DeviceNode:
        """/dev/nvidia<minor>, from the host or the configured fallback."""

    def control(self) -> DeviceNode | None:
        """The kernel module's control device, when present."""


def injection_plan(
    alloc: Allocation,
    gpus: Mapping[int, Gpu],
    devices: DeviceLookup,
    registered: bool,
    interposer: InterposerPolicy | None = None,
    container_env: Mapping[str, str] | None = None,
) -> InjectionPlan:
    """The plan for `alloc`; `gpus` by index; `registered`: with the module;
    `interposer`: the node's, used when `alloc.interposer`; `container_env`: the
    container's own environment."""
    nodes = list(devices.common())
    nodes += [devices.gpu(gpus[s.index].minor) for s in alloc.shares]
    if registered and (ctl := devices.control()):
        nodes.append(ctl)
    uuids = ",".join(s.uuid for s in alloc.shares)
    env = {
        "NVIDIA_VISIBLE_DEVICES": uuids,
        "GPUSHARE_GPU_UUIDS": uuids,
        "GPUSHARE_MEMORY_LIMIT": ",".join(str(s.memory_bytes) for s in alloc.shares),
        "GPUSHARE_PRIORITY": alloc.priority,
        "GPUSHARE_ISOLATION": alloc.isolation,
    }
    if alloc.isolation != "memory" and any(s.core_percent for s in alloc.shares):
        env["GPUSHARE_CORE_LIMIT"] = ",".join(str(s.core_percent) for s in alloc.shares)
    mounts: tuple[Mount, ...] = ()
    if alloc.interposer and interposer is not None:
        mounts, more = interposer_injection(interposer, container_env or {})
        env.update(more)
    return InjectionPlan(tuple(nodes), env, {ASSIGNED: assigned_annotation(alloc)}, mounts)


def share_json(s: GpuShare) -> dict[str, Any]:
    """One GPU share as the annotation, the records and the status document write it."""
    return {"index": s.index, "uuid": s.uuid, "memory": s.memory_bytes, "core": s.core_percent}


def assigned_annotation(alloc: Allocation) -> str:
    """The gpushare.io/assigned value for an allocation."""
    data: Mapping[str, Any] = {
        "version": ASSIGNED_VERSION,
        "gpus": [share_json(s) for s in alloc.shares],
        "priority": alloc.priority,
        "isolation": alloc.isolation,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
