"""The share domain: requests, inventory, placement, allocations, injection plans.

Plain values in, plain values out: nothing here knows NRI, protobuf, sockets or
YAML.  The daemon builds `ContainerInfo`, `Gpu` and `NodePolicy` values and
turns an `InjectionPlan` into a ContainerAdjustment.
"""

from .devices import DeviceLookup, HostDevices
from .inventory import load_inventory
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
from .request import ShareRequest, parse_request
from .service import ShareService, assigned_annotation

__all__ = [
    "ASSIGNED",
    "Allocation",
    "ContainerInfo",
    "DeviceLookup",
    "DeviceNode",
    "Gpu",
    "GpuShare",
    "HostDevices",
    "InjectionPlan",
    "Mount",
    "NodePolicy",
    "ShareRefused",
    "ShareRequest",
    "ShareService",
    "assigned_annotation",
    "load_inventory",
    "parse_request",
]
