"""The ResourceSlice a node publishes (resource.k8s.io/v1), and Kubernetes
quantities (`quantity`, `format_quantity`): pure, no I/O.

One slice per node: pool = the node's name, one device per healthy GPU that
can still take a claim.  Each device has ``allowMultipleAllocations`` and
three consumable capacities (KEP-5075), net of what shares made outside DRA
(device-plugin pods, hand-started containers) hold on the GPU:

- ``memory``: bytes free for claims, whole MiB; requests in steps of 1Mi
  from 1Mi.  Default (a request that names no memory): all of it, as the
  KEP does for a capacity without a policy: a claim that does not say how
  much memory gets the GPU's memory to itself, never a useless 1 MiB.
- ``compute``: percent, 5..(free, rounded down to 5) in steps of 5.
  Default: all of it, for the same reason (a claim that names only memory
  does not get throttled to 5 %).
- ``slots``: containers; each claim takes exactly one (validValues ["1"]).

The API server refuses a policy whose min + step exceeds the capacity, so a
GPU with less than 2Mi memory, 10 % compute or no slot free is left out
(no claim could get it anyway), as are unhealthy GPUs.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from nri_gpushare.k8s.dra import CAPACITY_COMPUTE, CAPACITY_MEMORY, CAPACITY_SLOTS, DRIVER
from nri_gpushare.k8s.dra import device_name as _device_name

API_VERSION: Final = "resource.k8s.io/v1"
MiB: Final = 1 << 20
COMPUTE_STEP: Final = 5
MAX_QUANTITY: Final = 1 << 63
"""Quantities at or above this are refused (Kubernetes' own int64 limit)."""
MAX_QUANTITY_CHARS: Final = 64
MAX_NAME: Final = 253
MAX_STRING_ATTRIBUTE: Final = 64

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(
    r"\+?([0-9]*)(?:\.([0-9]*))?(?:([KMGTPE]i|[numkMGTPE])|[eE]([-+]?[0-9]{1,3}))?"
)
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{f"{s}i": Fraction(1 << (10 * (n + 1))) for n, s in enumerate("KMGTPE")},
}
_BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


class QuantityError(ValueError):
    """Not a whole, non-negative Kubernetes quantity; str() says why."""


def quantity(value: object, what: str = "quantity", unit: str = "") -> int:
    """The whole number a Kubernetes quantity string stands for ("2Gi",
    "2147483648", "1.5Gi", "500Mi", "30", "1e3"); refuses fractions,
    negatives, values >= 2^63 and anything that is not a string.  `what` and
    `unit` ("bytes") name it in the message."""
    if not isinstance(value, str):
        raise QuantityError(f"{what} {type(value).__name__} is not a quantity string")
    shown = value[:MAX_QUANTITY_CHARS]
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"{what} '{shown}...' is longer than {MAX_QUANTITY_CHARS} characters")
    m = _QUANTITY.fullmatch(value) if value.isascii() else None
    if m is None or not (m.group(1) or m.group(2)):
        raise QuantityError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 2Gi, 500Mi, 30)")
    whole, frac, suffix, exponent = m.groups()
    number = Fraction(int(whole or "0")) + (
        Fraction(int(frac), 10 ** len(frac)) if frac else Fraction(0)
    )
    number *= Fraction(10) ** int(exponent) if exponent else _SUFFIX[suffix or ""]
    if number.denominator != 1:
        raise QuantityError(f"{what} {value!r} is not a whole number{' of ' if unit else ''}{unit}")
    if number >= MAX_QUANTITY:
        raise QuantityError(f"{what} {value!r} is too large (2^63 or more)")
    return int(number)


def format_quantity(value: int, binary: bool = False) -> str:
    """`value` as a quantity string: with the largest binary suffix that
    divides it when `binary` (81920Mi -> "80Gi"), else plain digits."""
    if value < 0:
        raise ValueError(f"negative quantity {value}")
    if binary and value:
        for n, suffix in enumerate(_BINARY):
            unit = 1 << (10 * (len(_BINARY) - n))
            if value % unit == 0:
                return f"{value // unit}{suffix}"
    return str(value)


@dataclass(frozen=True)
class SliceGpu:
    """One GPU as the slice publishes it, with what non-DRA shares hold on it."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    driver_version: str = ""
    healthy: bool = True
    memory_held: int = 0
    core_held: int = 0
    containers_held: int = 0


def dns_subdomain(name: str) -> bool:
    """Whether `name` is a DNS subdomain as Kubernetes names nodes and drivers."""
    return len(name) <= MAX_NAME and _SUBDOMAIN.fullmatch(name) is not None


def slice_name(node: str) -> str:
    """``<node>-gpushare.io``; for a long node name its head and a hash, so
    the name stays a DNS subdomain of at most 253 characters."""
    name = f"{node}-{DRIVER}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    tail = f"-{digest}-{DRIVER}"
    return node[: MAX_NAME - len(tail)].rstrip("-.") + tail


def semver(version: str) -> str:
    """A driver version as semver ("580.65.06" -> "580.65.6", "550.54" ->
    "550.54.0"); "" when it is not numbers separated by dots."""
    parts = version.strip().split(".")
    if not 1 < len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
        return ""
    text = ".".join(str(int(p)) for p in parts + ["0"] * (3 - len(parts)))
    return text if len(text) <= MAX_STRING_ATTRIBUTE else ""


def _device(gpu: SliceGpu, memory_reserve_bytes: int, max_inst: int) -> dict[str, Any] | None:
    memory = max(0, gpu.memory_bytes - memory_reserve_bytes - gpu.memory_held) // MiB * MiB
    compute = max(0, 100 - gpu.core_held) // COMPUTE_STEP * COMPUTE_STEP
    slots = max(0, max_inst - gpu.containers_held)
    if not gpu.healthy or memory < 2 * MiB or slots < 1:
        return None
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid[:MAX_STRING_ATTRIBUTE]},
        "model": {"string": gpu.model[:MAX_STRING_ATTRIBUTE]},
        "index": {"int": gpu.index},
    }
    version = semver(gpu.driver_version)
    if version:
        attributes["driverVersion"] = {"version": version}
    mib = format_quantity(MiB, binary=True)
    return {
        "name": _device_name(gpu.index),
        "attributes": attributes,
        "allowMultipleAllocations": True,
        "capacity": {
            CAPACITY_MEMORY: {
                "value": format_quantity(memory, binary=True),
                "requestPolicy": {
                    "default": format_quantity(memory, binary=True),
                    "validRange": {"min": mib, "step": mib},
                },
            },
            CAPACITY_COMPUTE: {"value": str(compute), "requestPolicy": _compute_policy(compute)},
            CAPACITY_SLOTS: {
                "value": str(slots),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }


def _compute_policy(compute: int) -> dict[str, Any]:
    """Requests in steps of 5 up to what is free; 0 (the default: a claim
    that names no compute) is no compute limit, as a share without gpu-core."""
    if compute < COMPUTE_STEP:  # a range needs min + step <= the capacity
        return {"default": "0", "validValues": ["0"]}
    return {
        "default": "0",
        "validRange": {"min": "0", "max": str(compute), "step": str(COMPUTE_STEP)},
    }


def node_slice(
    node: str,
    gpus: Iterable[SliceGpu],
    *,
    memory_reserve_bytes: int,
    max_inst: int,
    generation: int,
) -> dict[str, Any]:
    """The node's one ResourceSlice (a JSON-ready dict)."""
    if not dns_subdomain(node):
        raise ValueError(f"node name {node[:80]!r} is not a Kubernetes node name")
    ordered = sorted(gpus, key=_index)
    if len({g.index for g in ordered}) != len(ordered):
        raise ValueError(f"GPU indexes {[g.index for g in ordered]} repeat")
    devices = [_device(g, memory_reserve_bytes, max_inst) for g in ordered]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [d for d in devices if d is not None],
        },
    }


def _index(gpu: SliceGpu) -> int:
    return gpu.index


def _canonical(value: Any) -> Any:
    """Quantity strings as numbers, so "1024Mi" equals "1Gi" (the API server
    may write a quantity back in another form)."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str):
        try:
            return quantity(value)
        except QuantityError:
            return value
    return value


def _content(obj: object) -> Any:
    if not isinstance(obj, dict):
        return obj
    spec = copy.deepcopy(obj.get("spec"))
    if isinstance(spec, dict) and isinstance(spec.get("pool"), dict):
        spec["pool"].pop("generation", None)
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if isinstance(devices, list):
        for device in devices:
            if isinstance(device, dict) and isinstance(device.get("capacity"), dict):
                device["capacity"] = _canonical(device["capacity"])
    return (obj.get("apiVersion"), obj.get("kind"), spec)


def slice_changed(old: object, new: object) -> bool:
    """Whether publishing `new` over `old` changes anything but metadata and
    the pool's generation."""
    return bool(_content(old) != _content(new))
