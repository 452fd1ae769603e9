"""A test scheduler for ResourceClaims on published ResourceSlices (tests
only), written from the rules of KEP-5075 (DRAConsumableCapacity):

- a request is ``exactly: {deviceClassName, allocationMode: ExactCount
  (the default; "All" is not simulated), count (default 1), capacity:
  {requests: {name: quantity}}}``; a DeviceClass matches by driver only;
- only the slices of each pool's highest generation count;
- a device with ``allowMultipleAllocations`` can serve several claims; one
  without is exclusive (no other allocation on it at all);
- per capacity of the device, what a request consumes is: the request
  rounded up by the capacity's requestPolicy; no request: the policy's
  default, or the whole capacity value without a policy/default;
  validValues: the smallest valid value >= the request (none: the device
  does not fit); validRange: at least min, rounded up to min + k*step,
  above max: does not fit; a request for a capacity the device lacks: does
  not fit;
- the device fits when, for every capacity, what claims already allocated
  on it consumed plus this request is <= the capacity's value;
- all requests of a claim on one node; count > 1 takes distinct devices;
  first fit (nodes by name, devices in slice order).

The result goes into claim.status: allocation.devices.results [{request,
driver, pool, device, shareID (multi-allocatable devices), consumedCapacity}],
allocation.nodeSelector for the node, reservedFor [{resource: pods, name, uid}].
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from nri_gpushare.k8s.dra import DRIVER
from nri_gpushare.k8s.dra.slices import format_quantity, quantity
from tests.k8s.apiserver import ApiServer

DeviceKey = tuple[str, str, str]  # driver, pool, device
Why = str | tuple[str, str, str]


def consumed_by(capacity: dict[str, Any], requested: int | None) -> int | None:
    """What one request consumes of one capacity; None: the policy refuses it."""
    value = quantity(capacity["value"])
    policy = capacity.get("requestPolicy") or {}
    if requested is None:
        return quantity(policy["default"]) if "default" in policy else value
    if "validValues" in policy:
        valid = [quantity(v) for v in policy["validValues"]]
        return min((v for v in valid if v >= requested), default=None)
    if "validRange" in policy:
        valid_range = policy["validRange"]
        low = quantity(valid_range["min"])
        amount = max(requested, low)
        if "step" in valid_range:
            step = quantity(valid_range["step"])
            amount = low + -(-(amount - low) // step) * step
        if "max" in valid_range and amount > quantity(valid_range["max"]):
            return None
        return amount
    return requested


def _newest_slices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, -1), s["spec"]["pool"]["generation"])
    return [
        s
        for s in slices
        if s["spec"]["pool"]["generation"]
        == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
    ]


def _usage(claims: list[dict[str, Any]]) -> dict[DeviceKey, list[dict[str, int]]]:
    """Per device, what each allocation on it consumed."""
    used: dict[DeviceKey, list[dict[str, int]]] = defaultdict(list)
    for claim in claims:
        allocation = claim.get("status", {}).get("allocation")
        for r in allocation["devices"]["results"] if allocation else []:
            consumed = {k: quantity(v) for k, v in r.get("consumedCapacity", {}).items()}
            used[(r["driver"], r["pool"], r["device"])].append(consumed)
    return used


def _show(amount: int, capacity: dict[str, Any]) -> str:
    return format_quantity(amount, binary=str(capacity["value"]).endswith("i"))


def _fit(
    device: dict[str, Any], requests: dict[str, int], used: list[dict[str, int]]
) -> tuple[dict[str, int] | None, Why]:
    """(what the request consumes, "") or (None, why the device does not fit:
    a text, or (capacity, wanted, left) when it has too little left)."""
    capacities: dict[str, Any] = device.get("capacity") or {}
    for name in requests:
        if name not in capacities:
            return None, f"has no {name}"
    if not device.get("allowMultipleAllocations"):
        return ({}, "") if not used else (None, "is allocated (exclusive)")
    consumed: dict[str, int] = {}
    for name, capacity in capacities.items():
        amount = consumed_by(capacity, requests.get(name))
        if amount is None:
            return None, f"refuses {name} {requests[name]} (requestPolicy)"
        left = quantity(capacity["value"]) - sum(u.get(name, 0) for u in used)
        if amount > left:
            return None, (name, _show(amount, capacity), _show(max(left, 0), capacity))
        consumed[name] = amount
    return consumed, ""


def _reason(request: str, failures: list[tuple[str, Why]]) -> str:
    if not failures:
        return f"request {request}: no device of its class"
    short = [(dev, why) for dev, why in failures if isinstance(why, tuple)]
    if len(short) == len(failures) and len({why[:2] for _, why in short}) == 1:
        name, wanted, _ = short[0][1]
        lefts = ", ".join(f"{dev} {why[2]}" for dev, why in short).replace(" ", " has ", 1)
        return f"request {request}: no device has {wanted} {name} left: {lefts}"
    texts = [why if isinstance(why, str) else f"has {why[2]} {why[0]} left" for _, why in failures]
    return f"request {request}: " + "; ".join(
        f"{dev} {t}" for (dev, _), t in zip(failures, texts, strict=True)
    )


def allocate(
    claim: dict[str, Any],
    slices: list[dict[str, Any]],
    others: list[dict[str, Any]],
    pod: tuple[str, str],
    classes: dict[str, str] | None = None,
) -> str:
    """Allocate `claim` beside the allocated claims `others`, reserved for
    `pod` (name, uid): writes claim["status"] and returns "", or returns why
    nothing fits (claim unchanged).  `classes`: DeviceClass -> driver."""
    classes = classes or {DRIVER: DRIVER}
    usage = _usage(others)
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in _newest_slices(slices):
        by_node[s["spec"]["nodeName"]].append(s)
    reasons: list[str] = []
    for node in sorted(by_node):
        results, why = _on_node(claim, by_node[node], usage, classes)
        if results is not None:
            claim["status"] = {
                "allocation": {
                    "devices": {"results": results},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": pod[0], "uid": pod[1]}],
            }
            return ""
        reasons.append(f"{node}: {why}")
    return "; ".join(reasons) or "no ResourceSlices"


def _on_node(
    claim: dict[str, Any],
    slices: list[dict[str, Any]],
    usage: dict[DeviceKey, list[dict[str, int]]],
    classes: dict[str, str],
) -> tuple[list[dict[str, Any]] | None, str]:
    used = {k: list(v) for k, v in usage.items()}
    results: list[dict[str, Any]] = []
    for request in claim["spec"]["devices"]["requests"]:
        exactly = request["exactly"]
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            return None, f"request {request['name']}: only ExactCount is simulated"
        driver = classes.get(exactly["deviceClassName"])
        wanted = {
            k: quantity(v) for k, v in exactly.get("capacity", {}).get("requests", {}).items()
        }
        taken: set[DeviceKey] = set()
        for _ in range(exactly.get("count", 1)):
            failures: list[tuple[str, Why]] = []
            for s in slices:
                if s["spec"]["driver"] != driver:
                    continue
                for device in s["spec"].get("devices", []):
                    key = (driver, s["spec"]["pool"]["name"], device["name"])
                    if key in taken:
                        continue
                    consumed, why = _fit(device, wanted, used.get(key, []))
                    if consumed is None:
                        failures.append((device["name"], why))
                        continue
                    result: dict[str, Any] = {
                        "request": request["name"],
                        "driver": driver,
                        "pool": key[1],
                        "device": key[2],
                    }
                    if device.get("allowMultipleAllocations"):
                        result["shareID"] = str(uuid.uuid4())
                        result["consumedCapacity"] = {
                            n: _show(a, device["capacity"][n]) for n, a in consumed.items()
                        }
                    used.setdefault(key, []).append(consumed)
                    taken.add(key)
                    results.append(result)
                    break
                else:
                    continue
                break
            else:
                return None, _reason(request["name"], failures)
    return results, ""


def schedule(api: ApiServer, namespace: str, name: str, pod: tuple[str, str]) -> str:
    """Allocate the API server's claim namespace/name on its slices and store
    it; "" or why not."""
    claim = api.claims[(namespace, name)]
    others = [c for k, c in api.claims.items() if k != (namespace, name)]
    why = allocate(claim, list(api.slices.values()), others, pod)
    if not why:
        api.put_claim(claim)
    return why
