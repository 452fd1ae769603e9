"""nri_gpushare.k8s.dra.slices: the node's ResourceSlice is valid (strict
schemas of 1.34 and 1.37, and the API server's own rules on request
policies), its capacities are what non-DRA shares leave, and quantities are
read and written exactly."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.k8s.dra import DRIVER
from nri_gpushare.k8s.dra.slices import (
    MiB,
    QuantityError,
    SliceGpu,
    format_quantity,
    node_slice,
    quantity,
    semver,
    slice_changed,
    slice_name,
)

GiB = 1 << 30
VERSIONS = ("1.34", "1.37")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
GPUS = [
    SliceGpu(
        1,
        "GPU-bbbb",
        "NVIDIA H100 80GB HBM3",
        80 * GiB,
        "580.65.06",
        memory_held=10 * GiB,
        core_held=30,
        containers_held=2,
    ),
    SliceGpu(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * GiB, "580.65.06"),
    SliceGpu(2, "GPU-cccc", "NVIDIA H100 80GB HBM3", 80 * GiB, "580.65.06", healthy=False),
]


def build(gpus: list[SliceGpu] = GPUS, node: str = "gpu-node-1", **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"memory_reserve_bytes": GiB, "max_inst": 16, "generation": 3}
    return node_slice(node, gpus, **(args | kw))


def policy_problems(capacity: dict[str, Any]) -> list[str]:
    """The API server's rules on a capacity's requestPolicy (from the v1 API's
    field documentation), which a JSON schema cannot say."""
    value = quantity(capacity["value"])
    policy = capacity.get("requestPolicy")
    if policy is None:
        return []
    problems = []
    default = quantity(policy["default"]) if "default" in policy else None
    if "validValues" in policy:
        valid = [quantity(v) for v in policy["validValues"]]
        if valid != sorted(set(valid)) or len(valid) > 10 or default not in valid:
            problems.append("validValues unsorted, too many, or without the default")
        if max(valid) > value:
            problems.append("a valid value above the capacity")
    if "validRange" in policy:
        r = policy["validRange"]
        low, step = quantity(r["min"]), quantity(r.get("step", "0"))
        high = quantity(r["max"]) if "max" in r else None
        if default is None or default < low or (high is not None and default > high):
            problems.append("default outside the range")
        if not 0 <= low <= value or low + step > value:
            problems.append("min (+ step) above the capacity")
        if high is not None and (high > value or (step and (high - low) % step)):
            problems.append("max above the capacity or off step")
        if step and default is not None and (default - low) % step:
            problems.append("default off step")
    return problems


@pytest.mark.parametrize("version", VERSIONS)
def test_the_slice_is_valid_strictly(version: str) -> None:
    kubernetes_validate.validate(build(), version, strict=True)
    bad = build()
    bad["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["stepp"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_one_device_per_healthy_gpu_with_what_non_dra_shares_leave() -> None:
    obj = build()
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"] == {"name": "gpu-node-1-gpushare.io"}
    spec = obj["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "gpu-node-1"
    assert spec["pool"] == {"name": "gpu-node-1", "generation": 3, "resourceSliceCount": 1}
    gpu0, gpu1 = spec["devices"]
    assert gpu0 == {
        "name": "gpu-0",
        "attributes": {
            "uuid": {"string": "GPU-aaaa"},
            "model": {"string": "NVIDIA H100 80GB HBM3"},
            "index": {"int": 0},
            "driverVersion": {"version": "580.65.6"},
        },
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "79Gi",
                "requestPolicy": {"default": "79Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            "compute": {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "5"},
                },
            },
            "slots": {"value": "16", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
    }
    assert gpu1["name"] == "gpu-1"
    capacity = gpu1["capacity"]
    assert quantity(capacity["memory"]["value"]) == 69 * GiB
    assert capacity["compute"]["value"] == "70"
    assert capacity["compute"]["requestPolicy"]["validRange"]["max"] == "70"
    assert capacity["slots"]["value"] == "14"


@pytest.mark.parametrize(
    ("held", "published"),
    [
        ({"memory_held": 79 * GiB - 2 * MiB}, True),  # 2Mi: min + step
        ({"memory_held": 79 * GiB - 2 * MiB + 1}, False),
        ({"memory_held": 200 * GiB}, False),  # never below 0
        ({"core_held": 90}, True),
        ({"core_held": 100}, True),  # memory-only claims (compute 0) still fit
        ({"containers_held": 15}, True),
        ({"containers_held": 16}, False),
    ],
)
def test_a_gpu_that_cannot_take_one_more_claim_is_left_out(
    held: dict[str, int], published: bool
) -> None:
    gpu = SliceGpu(0, "GPU-a", "m", 80 * GiB, **held)
    devices = build([gpu])["spec"]["devices"]
    assert bool(devices) == published
    for device in devices:
        assert not policy_problems(device["capacity"]["compute"])
    for version in VERSIONS:
        kubernetes_validate.validate(build([gpu]), version, strict=True)


@given(
    total=st.integers(0, 200 * GiB),
    reserve=st.integers(0, 4 * GiB),
    memory_held=st.integers(0, 100 * GiB),
    core_held=st.integers(0, 120),
    containers=st.integers(0, 30),
)
def test_every_published_policy_keeps_the_api_servers_rules(
    total: int, reserve: int, memory_held: int, core_held: int, containers: int
) -> None:
    gpu = SliceGpu(0, "GPU-a", "m", total, "", True, memory_held, core_held, containers)
    for device in build([gpu], memory_reserve_bytes=reserve)["spec"]["devices"]:
        for name, capacity in device["capacity"].items():
            assert policy_problems(capacity) == [], (name, capacity)
        assert quantity(device["capacity"]["memory"]["value"]) == (
            (total - reserve - memory_held) // MiB * MiB
        )


def test_the_rule_checker_catches_a_bad_policy() -> None:
    capacity = build()["spec"]["devices"][1]["capacity"]["compute"]
    bad = copy.deepcopy(capacity)
    bad["requestPolicy"]["validRange"]["max"] = "100"  # above the 70 left
    assert policy_problems(bad)
    assert policy_problems(capacity) == []


@pytest.mark.parametrize("length", [1, 63, 230, 241, 253])
def test_the_name_is_a_dns_subdomain_for_any_node_name(length: int) -> None:
    node = ("a" * 62 + ".") * 5
    node = node[:length].rstrip(".") or "a"
    name = slice_name(node)
    assert len(name) <= 253 and SUBDOMAIN.fullmatch(name), name
    assert slice_name(node) == name
    obj = build(node=node)
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
    if len(node) > 240:  # two long names alike in their first 230 characters differ
        assert slice_name(node[:-1] + "b") != name


def test_a_bad_node_name_or_a_repeated_gpu_is_refused() -> None:
    for node in ("", "Node", "a_b", "-a", "a" * 254):
        with pytest.raises(ValueError, match="node name"):
            build(node=node)
    with pytest.raises(ValueError, match="repeat"):
        build([GPUS[0], GPUS[0]])


@pytest.mark.parametrize(
    ("version", "wanted"),
    [
        ("580.65.06", "580.65.6"),
        ("535.104.05", "535.104.5"),
        ("550.54", "550.54.0"),
        (" 570.00.1 ", "570.0.1"),
        ("580", ""),
        ("580.65.06.1", ""),
        ("580.65b", ""),
        ("", ""),
        ("５８０.65.06", ""),
    ],
)
def test_driver_version_as_semver(version: str, wanted: str) -> None:
    assert semver(version) == wanted
    gpu = SliceGpu(0, "GPU-a", "m", 80 * GiB, version)
    attributes = build([gpu])["spec"]["devices"][0]["attributes"]
    assert attributes.get("driverVersion") == ({"version": wanted} if wanted else None)


def test_long_strings_are_cut_to_what_an_attribute_holds() -> None:
    gpu = SliceGpu(0, "GPU-" + "a" * 100, "M" * 100, 80 * GiB)
    obj = build([gpu])
    assert len(obj["spec"]["devices"][0]["attributes"]["model"]["string"]) == 64
    kubernetes_validate.validate(obj, "1.37", strict=True)


def test_slice_changed_ignores_metadata_generation_and_quantity_forms() -> None:
    old = build()
    new = build(generation=9)
    new["metadata"] = {"name": "x", "resourceVersion": "7", "uid": "u"}
    assert not slice_changed(old, new)
    new["spec"]["devices"][0]["capacity"]["memory"]["value"] = f"{79 * 1024}Mi"
    assert not slice_changed(old, new)
    assert slice_changed(old, build(memory_reserve_bytes=2 * GiB))
    assert slice_changed(old, build(max_inst=8))
    assert slice_changed(old, build(GPUS[:1]))
    assert slice_changed(old, build(node="gpu-node-2"))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2Gi", 2 * GiB),
        ("2147483648", 2 * GiB),
        ("1.5Gi", 3 * GiB // 2),
        ("500Mi", 500 * MiB),
        ("30", 30),
        ("0", 0),
        ("+5", 5),
        ("1k", 1000),
        ("2M", 2_000_000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2000m", 2),
        ("0.5Ki", 512),
        ("7Ei", 7 << 60),
        (".5Ki", 512),
    ],
)
def test_quantity(text: str, value: int) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "1.5",
        "1m",
        "-1",
        "-0.5Gi",
        "8Ei",
        "1e30",
        "1e-1",
        "",
        "Gi",
        ".",
        "2 Gi",
        "2gi",
        "2GiB",
        "1e",
        "0x10",
        "1" * 65,
        "２",
    ],
)
def test_quantity_refuses(text: str) -> None:
    with pytest.raises(QuantityError):
        quantity(text)


@pytest.mark.parametrize("value", [None, 3, 1.5, b"2Gi", ["2Gi"]])
def test_quantity_refuses_what_is_no_string(value: object) -> None:
    with pytest.raises(QuantityError, match="not a quantity string"):
        quantity(value)


@given(st.integers(0, (1 << 63) - 1), st.booleans())
def test_format_quantity_reads_back(value: int, binary: bool) -> None:
    text = format_quantity(value, binary)
    assert quantity(text) == value
    if not binary:
        assert text == str(value)


def test_format_quantity_picks_the_largest_binary_suffix() -> None:
    assert format_quantity(81920 * MiB, binary=True) == "80Gi"
    assert format_quantity(1536 * MiB, binary=True) == "1536Mi"
    assert format_quantity(1000, binary=True) == "1000"
    assert format_quantity(0, binary=True) == "0"
