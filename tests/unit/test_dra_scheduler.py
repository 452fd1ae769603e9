"""tests/k8s/dra_scheduler.py: the test scheduler follows KEP-5075's rules
(request policies, shared devices up to their capacity, exclusive devices),
and what it allocates on the slices the driver publishes is what the
driver's claim parser reads back."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from nri_gpushare.k8s.dra import DRIVER
from nri_gpushare.k8s.dra.claims import ClaimShare, claim_shares, reserved_pods
from nri_gpushare.k8s.dra.slices import SliceGpu, node_slice, quantity
from tests.k8s.dra_scheduler import allocate, consumed_by

GiB = 1 << 30
MiB = 1 << 20
POD = ("trainer", "6b1c9a52-0d3e-4a8e-9a57-0c2f0e0a1b2c")


def slices(*free_gib: int, node: str = "node-a", generation: int = 1) -> list[dict[str, Any]]:
    gpus = [SliceGpu(i, f"GPU-{i}", "H100", g * GiB) for i, g in enumerate(free_gib)]
    return [node_slice(node, gpus, memory_reserve_bytes=0, max_inst=4, generation=generation)]


def claim(name: str = "c", count: int = 1, **requests: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount"}
    if count != 1:
        exactly["count"] = count
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def place(pool: list[dict[str, Any]], done: list[dict[str, Any]], obj: dict[str, Any]) -> str:
    why = allocate(obj, pool, done, POD)
    if not why:
        done.append(obj)
    return why


RANGE = {
    "value": "100",
    "requestPolicy": {"default": "100", "validRange": {"min": "5", "max": "60", "step": "5"}},
}


@pytest.mark.parametrize(
    ("capacity", "requested", "consumed"),
    [
        (RANGE, 30, 30),
        (RANGE, 7, 10),  # up to min + k*step
        (RANGE, 1, 5),  # at least min
        (RANGE, 60, 60),
        (RANGE, 61, None),  # rounded above max
        (RANGE, None, 100),  # the default
        ({"value": "10", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}}, 3, 4),
        (
            {"value": "10", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}},
            5,
            None,
        ),
        (
            {"value": "10", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}},
            None,
            2,
        ),
        ({"value": "10", "requestPolicy": {"validRange": {"min": "3"}, "default": "3"}}, 4, 4),
        ({"value": "8Gi"}, None, 8 * GiB),  # no policy: the whole capacity
        ({"value": "8Gi"}, GiB, GiB),
    ],
)
def test_what_a_request_consumes(
    capacity: dict[str, Any], requested: int | None, consumed: int | None
) -> None:
    assert consumed_by(capacity, requested) == consumed


def test_an_allocation_is_what_the_claim_parser_reads_back() -> None:
    pool = slices(80, 40)
    obj = claim(memory="2Gi", compute="30")
    assert place(pool, [], obj) == ""
    for version in ("1.34", "1.37"):
        kubernetes_validate.validate(obj, version, strict=True)
    [r] = obj["status"]["allocation"]["devices"]["results"]
    assert r["consumedCapacity"] == {"memory": "2Gi", "compute": "30", "slots": "1"}
    assert (r["driver"], r["pool"], r["device"]) == (DRIVER, "node-a", "gpu-0")
    assert obj["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    ]
    assert claim_shares(obj, "node-a", [0, 1]) == [
        ClaimShare(("gpu",), "gpu-0", 0, 2 * GiB, 30, r["shareID"])
    ]
    assert reserved_pods(obj) == (POD[1],)


def test_claims_share_a_device_up_to_each_capacity() -> None:
    pool, done = slices(8, 8), []
    for n in range(3):
        assert place(pool, done, claim(f"c{n}", memory="1Gi", compute="30")) == ""
    devices = [c["status"]["allocation"]["devices"]["results"][0]["device"] for c in done]
    assert devices == ["gpu-0"] * 3
    place(pool, done, claim("c3", memory="1Gi", compute="15"))  # 90 + 15 > 100
    assert done[-1]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    place(pool, done, claim("c4", memory="1Gi", compute="10"))  # 90 + 10 fits
    assert done[-1]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    # Slots: max_inst 4, gpu-0 is full now whatever else is left.
    assert place(pool, done, claim("c5", memory="1Mi", compute="5")) == ""
    assert done[-1]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"


def test_the_reason_says_what_is_left() -> None:
    pool, done = slices(4, 3), []
    assert place(pool, done, claim("a", memory="2Gi", compute="5")) == ""
    assert place(pool, done, claim("b", memory="2Gi", compute="5")) == ""
    why = place(pool, done, claim("c", memory="4Gi", compute="5"))
    assert why == "node-a: request gpu: no device has 4Gi memory left: gpu-0 has 0, gpu-1 3Gi"
    why = place(pool, done, claim("d", memory="1Gi", compute="101"))
    assert "refuses compute 101" in why


def test_a_claim_without_a_memory_request_takes_all_the_memory() -> None:
    pool, done = slices(8), []
    assert place(pool, done, claim("all", compute="10")) == ""
    r = done[0]["status"]["allocation"]["devices"]["results"][0]
    assert quantity(r["consumedCapacity"]["memory"]) == 8 * GiB
    assert r["consumedCapacity"]["compute"] == "10"
    assert "no device has 1Gi memory left" in place(pool, done, claim("x", memory="1Gi"))


def test_an_exclusive_device_serves_one_claim() -> None:
    pool = slices(8)
    del pool[0]["spec"]["devices"][0]["allowMultipleAllocations"]
    for capacity in pool[0]["spec"]["devices"][0]["capacity"].values():
        del capacity["requestPolicy"]
    done: list[dict[str, Any]] = []
    assert place(pool, done, claim("a", memory="1Gi")) == ""
    assert "consumedCapacity" not in done[0]["status"]["allocation"]["devices"]["results"][0]
    assert "gpu-0 is allocated (exclusive)" in place(pool, done, claim("b", memory="1Gi"))
    [share] = claim_shares(done[0], "node-a", [0])
    assert share.whole


def test_count_takes_distinct_devices_and_only_the_newest_generation_counts() -> None:
    old = slices(8, 8, 8, generation=1)
    new = slices(8, 8, generation=2)
    obj = claim(count=2, memory="1Gi")
    assert place(old + new, [], obj) == ""
    devices = [r["device"] for r in obj["status"]["allocation"]["devices"]["results"]]
    assert devices == ["gpu-0", "gpu-1"]
    assert "no device" in place(old + new, [], claim(count=3, memory="1Gi"))


def test_all_requests_on_one_node() -> None:
    pool = slices(2, node="node-a") + slices(8, node="node-b")
    obj = claim(memory="4Gi")
    assert place(pool, [], obj) == ""
    assert claim_shares(obj, "node-b", [0])[0].memory_bytes == 4 * GiB
    unplaced = copy.deepcopy(claim(memory="16Gi"))
    why = place(pool, [], unplaced)
    assert why.startswith("node-a: ") and "; node-b: " in why and "status" not in unplaced
    assert consumed_by({"value": "1Gi"}, None) == GiB and MiB
