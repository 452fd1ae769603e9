"""The share domain: requests, placement, allocations, injection plans.

Plain values in, plain values out: nothing here knows NRI, protobuf, sockets,
YAML or the host.  The daemon builds `ContainerInfo`, `Gpu` and `NodePolicy`
values, wires in the host's device nodes (`nri_gpushare.host`) and the kernel
module, and turns an `InjectionPlan` into a ContainerAdjustment.
"""

from .assigned import assigned_annotation
from .model import (
    ASSIGNED,
    Allocation,
    ContainerInfo,
    DeviceNode,
    Gpu,
    GpuShare,
    InjectionPlan,
    Mount,
    NodePolicy,
    ShareRefused,
)
from .plan import DeviceLookup
from .request import ShareRequest, parse_request
from .service import ShareService
from .units import format_bytes, parse_size

__all__ = [
    "ASSIGNED",
    "Allocation",
    "ContainerInfo",
    "DeviceLookup",
    "DeviceNode",
    "Gpu",
    "GpuShare",
    "InjectionPlan",
    "Mount",
    "NodePolicy",
    "ShareRefused",
    "ShareRequest",
    "ShareService",
    "assigned_annotation",
    "format_bytes",
    "parse_request",
    "parse_size",
]
