"""nri_gpushare.k8s.dra.claims: what a ResourceClaim's allocation asks of
this node, and that any malformed or hostile claim is a ClaimError with a
message a person can act on."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpushare.k8s.dra import DRIVER, ClaimError
from nri_gpushare.k8s.dra.claims import ClaimShare, claim_shares, reserved_pods

GiB = 1 << 30
POD_UID = "6b1c9a52-0d3e-4a8e-9a57-0c2f0e0a1b2c"


def result(device: str = "gpu-0", request: str = "gpu", **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "request": request,
        "driver": DRIVER,
        "pool": "node-a",
        "device": device,
        "shareID": "a3c1e0b2-5f1d-4a47-8f3c-111111111111",
        "consumedCapacity": {"memory": "2Gi", "compute": "30", "slots": "1"},
    }
    return r | kw


def claim(*results: dict[str, Any], reserved: list[Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "trainer-gpu", "uid": "c1"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": list(results or [result()])}},
            "reservedFor": reserved
            if reserved is not None
            else [{"resource": "pods", "name": "trainer", "uid": POD_UID}],
        },
    }


def shares(obj: object, published: tuple[int, ...] = (0, 1, 2)) -> list[ClaimShare]:
    return claim_shares(obj, "node-a", published)


def test_one_share_per_device_of_this_driver_and_pool() -> None:
    other = result(driver="other.example.com", pool="elsewhere", device="nic-0")
    got = shares(
        claim(
            result(),
            other,
            result("gpu-2", "big", consumedCapacity={"memory": "1536Mi", "compute": "100"}),
        )
    )
    assert got == [
        ClaimShare(("gpu",), "gpu-0", 0, 2 * GiB, 30, "a3c1e0b2-5f1d-4a47-8f3c-111111111111"),
        ClaimShare(("big",), "gpu-2", 2, 1536 << 20, 100, "a3c1e0b2-5f1d-4a47-8f3c-111111111111"),
    ]
    assert not got[0].whole


def test_results_on_one_device_are_summed() -> None:
    second = result(
        request="more", shareID="b2", consumedCapacity={"memory": "1Gi", "compute": "20"}
    )
    [share] = shares(claim(result(), second))
    assert share == ClaimShare(("gpu", "more"), "gpu-0", 0, 3 * GiB, 50, result()["shareID"])
    too_much = result(request="more", consumedCapacity={"memory": "1Gi", "compute": "80"})
    with pytest.raises(ClaimError, match="110 % compute of gpu-0"):
        shares(claim(result(), too_much))


def test_a_result_without_consumed_capacity_is_the_whole_gpu() -> None:
    whole = result()
    del whole["consumedCapacity"], whole["shareID"]
    [share] = shares(claim(whole))
    assert share.whole and share.memory_bytes == -1 and share.core_percent == 100
    assert share.share_id == ""
    [share] = shares(claim(result(), whole))  # whole wins when merged
    assert share.whole and share.requests == ("gpu", "gpu")


def test_a_claim_of_other_drivers_only_asks_nothing_here() -> None:
    assert shares(claim(result(driver="other.example.com"))) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.pop("status"), "claim team-a/trainer-gpu is not allocated yet"),
        (lambda c: c["status"].pop("allocation"), "is not allocated yet"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-b"),
            "claim team-a/trainer-gpu is allocated to pool 'node-b', not this node's 'node-a'",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="gpu-7"),
            "device 'gpu-7' is not one this node publishes (gpu-0, gpu-1, gpu-2)",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "1.5", "compute": "30"}
            ),
            "consumedCapacity memory '1.5' is not a whole number of bytes",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "-2Gi", "compute": "30"}
            ),
            "consumedCapacity memory '-2Gi' is not a Kubernetes quantity",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "9Ei", "compute": "30"}
            ),
            "too large",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "2Gi"}
            ),
            "consumedCapacity has no compute",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "2Gi", "compute": "101"}
            ),
            "compute 101 is not 0..100 percent",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                consumedCapacity={"memory": "0", "compute": "5"}
            ),
            "memory is 0 bytes",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"].update(results=[result()] * 33),
            "33 allocated devices: at most 32",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(request="A b"),
            "is not a request name",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(shareID="x y"),
            "shareID 'x y' is not an ID",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("device"),
            "result 0 has no device",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool=7),
            "result 0.pool is not a str",
        ),
    ],
)
def test_malformed_claims_say_what_is_wrong(change: Any, message: str) -> None:
    obj = claim()
    change(obj)
    with pytest.raises(ClaimError) as caught:
        shares(obj)
    assert message in str(caught.value)


def test_reserved_pods() -> None:
    reserved = [
        {"resource": "pods", "name": "a", "uid": POD_UID},
        {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "other"},
        {"resource": "deployments", "name": "b", "uid": "d1"},
        {"resource": "pods", "name": "c", "uid": "u-2"},
    ]
    assert reserved_pods(claim(reserved=reserved)) == (POD_UID, "u-2")
    assert reserved_pods(claim(reserved=[])) == ()
    assert reserved_pods({"metadata": {}}) == ()
    for bad, message in [
        ([{"resource": "pods", "name": "a"}], "reservedFor[0] has no uid"),
        ([{"resource": "pods", "uid": "a b"}], "is not a Kubernetes UID"),
        ([{"resource": "pods", "uid": POD_UID}] * 257, "257 consumers: at most 256"),
        ("pods", "reservedFor is not a list"),
    ]:
        with pytest.raises(ClaimError, match=message.replace("[", r"\[").replace("]", r"\]")):
            reserved_pods(claim(reserved=bad))  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def mutations(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`base` with one value somewhere replaced by anything JSON holds."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, path + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, path + (i,))

    walk(base, ())

    def apply(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        if not path:
            return value  # type: ignore[no-any-return]
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return obj

    return st.builds(apply, st.sampled_from(paths), json_values)


@settings(max_examples=400)
@given(mutations(claim(result(), result("gpu-1", "two"))))
def test_hostile_claims_raise_only_claim_error(obj: Any) -> None:
    json.dumps(obj)  # what an API server could send
    for call in (shares, reserved_pods):
        try:
            call(obj)
        except ClaimError as exc:
            assert str(exc) and len(str(exc)) < 600
