"""The DRA driver's composition (nri_gpushare/k8s/dra/driver.py, claim_cdi.py)
with a fake API server client and daemon: what prepare sends the daemon and
answers, refusals passed on word for word, a claim of another UID, the
per-claim CDI spec files, what the published slice subtracts (shares not
made through DRA) and when it is published again (health, shares)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nri_gpushare.k8s.dra import CDI_KIND, CLAIM_ENV, ClaimError, ClaimRef, claim_cdi
from nri_gpushare.k8s.dra.driver import DraDriver, SlicePublisher, held_elsewhere
from nri_gpushare.k8s.dra.kubeapi import KubeApiError
from nri_gpushare.local.protocol import Reply, Request
from nri_gpushare.share.model import Gpu

GiB = 1 << 30
GPUS = [Gpu(i, f"GPU-{i}000-aaaa", "Sim", 16 * GiB, i) for i in range(2)]
UID = "0b6c2d3e-1111-4222-8333-444455556666"


def claim(device: str = "gpu-1", pool: str = "node-a", uid: str = UID) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpushare.io",
                            "pool": pool,
                            "device": device,
                            "shareID": "s-1",
                            "consumedCapacity": {"memory": "2Gi", "compute": "30", "slots": "1"},
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }


class FakeApi:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.published: list[dict[str, Any]] = []

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.obj

    def claim_uid(self, namespace: str, name: str) -> str:
        if name == "broken":
            raise KubeApiError("the API server said 500")
        return {"c": UID, "renamed": "another-uid"}.get(name, "")

    def publish(self, node: str, wanted: dict[str, Any]) -> dict[str, Any]:
        self.published.append(wanted)
        return wanted


class FakeDaemon:
    def __init__(self, reply: Reply | None = None) -> None:
        self.asked: list[Request] = []
        self.reply = reply or Reply(True, claim={})

    async def ask(self, request: Request) -> Reply:
        self.asked.append(request)
        if not self.reply.ok:
            raise ClaimError(self.reply.error)
        return self.reply


def driver(tmp_path: Path, obj: dict[str, Any], daemon: FakeDaemon | None = None) -> DraDriver:
    return DraDriver("node-a", GPUS, FakeApi(obj), daemon or FakeDaemon(), str(tmp_path))  # type: ignore[arg-type]


def test_prepare_books_the_allocated_share_and_writes_the_spec(tmp_path: Path) -> None:
    d = driver(tmp_path, claim())
    [device] = asyncio.run(d.prepare(ClaimRef("ns", "c", UID)))
    assert (device.device, device.pool, device.share_id) == ("gpu-1", "node-a", "s-1")
    assert device.cdi_ids == (f"{CDI_KIND}={UID}",)
    [asked] = d.daemon.asked  # type: ignore[attr-defined]
    assert asked.op == "claim-prepare" and asked.claim == {
        "uid": UID,
        "namespace": "ns",
        "name": "c",
        "pods": ["pod-1"],
        "gpus": [{"uuid": "GPU-1000-aaaa", "memory": 2 * GiB, "core": 30}],
    }
    spec = json.loads(claim_cdi.spec_path(str(tmp_path), UID).read_text())
    assert spec["devices"][0]["containerEdits"] == {"env": [f"{CLAIM_ENV}={UID}"]}
    assert os.stat(claim_cdi.spec_path(str(tmp_path), UID)).st_mode & 0o777 == 0o644


def test_the_daemons_refusal_is_the_kubelets_error_and_writes_no_spec(tmp_path: Path) -> None:
    daemon = FakeDaemon(Reply.refused("gpushare: cannot prepare: GPU 1 has no room", "capacity"))
    d = driver(tmp_path, claim(), daemon)
    with pytest.raises(ClaimError, match="GPU 1 has no room"):
        asyncio.run(d.prepare(ClaimRef("ns", "c", UID)))
    assert claim_cdi.written(str(tmp_path)) == set()


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        (claim(uid="other"), "deleted and made again"),
        (claim(pool="node-b"), "not this node's"),
        (claim(device="gpu-7"), "not one this node publishes"),
    ],
)
def test_a_claim_not_for_this_node_is_refused_before_the_daemon(
    tmp_path: Path, obj: dict[str, Any], match: str
) -> None:
    d = driver(tmp_path, obj)
    with pytest.raises(ClaimError, match=match):
        asyncio.run(d.prepare(ClaimRef("ns", "c", UID)))
    assert d.daemon.asked == []  # type: ignore[attr-defined]


def test_unprepare_releases_and_removes_the_spec(tmp_path: Path) -> None:
    d = driver(tmp_path, claim())
    asyncio.run(d.prepare(ClaimRef("ns", "c", UID)))
    asyncio.run(d.unprepare(ClaimRef("ns", "c", UID)))
    asyncio.run(d.unprepare(ClaimRef("ns", "c", UID)))  # again: nothing to do
    assert [r.op for r in d.daemon.asked] == ["claim-prepare"] + ["claim-unprepare"] * 2  # type: ignore[attr-defined]
    assert claim_cdi.written(str(tmp_path)) == set()


def test_stale_specs_of_claims_the_daemon_lost_are_removed(tmp_path: Path) -> None:
    claim_cdi.write_spec(str(tmp_path), UID)
    claim_cdi.write_spec(str(tmp_path), "kept-1")
    d = driver(tmp_path, claim(), FakeDaemon(Reply(True, claims=[{"uid": "kept-1"}])))
    asyncio.run(d.forget_stale_specs())
    assert claim_cdi.written(str(tmp_path)) == {"kept-1"}


def test_a_hostile_uid_never_names_a_path(tmp_path: Path) -> None:
    with pytest.raises(ClaimError, match="not a Kubernetes UID"):
        claim_cdi.write_spec(str(tmp_path), "../../etc/x")
    claim_cdi.remove_spec(str(tmp_path), "../../etc/x")  # nothing written, nothing removed


def test_held_elsewhere_counts_only_shares_not_made_through_dra() -> None:
    status = {
        "allocations": [
            {"claim": "", "gpus": [{"index": 0, "memory": GiB, "core": 20}]},
            {"claim": UID, "gpus": [{"index": 0, "memory": 2 * GiB, "core": 30}]},
            {"claim": "", "gpus": [{"index": 0, "memory": GiB, "core": 0}, {"index": 1}]},
            "garbage",
        ]
    }
    assert held_elsewhere(status) == {0: (2 * GiB, 20, 2)}


def test_the_slice_is_republished_when_health_or_shares_change() -> None:
    api = FakeApi({})
    status: dict[str, Any] = {"allocations": []}
    bad: set[int] = set()
    publisher = SlicePublisher(
        "node-a",
        GPUS,
        api,  # type: ignore[arg-type]
        lambda: status,
        lambda: frozenset(bad),
        memory_reserve_bytes=0,
        max_inst=4,
    )

    def devices() -> dict[str, str]:
        return {
            d["name"]: d["capacity"]["memory"]["value"]
            for d in api.published[-1]["spec"]["devices"]
        }

    asyncio.run(publisher.tick())
    asyncio.run(publisher.tick())  # nothing changed: not written again
    assert len(api.published) == 1 and devices() == {"gpu-0": "16Gi", "gpu-1": "16Gi"}
    status["allocations"] = [{"claim": "", "gpus": [{"index": 1, "memory": 4 * GiB, "core": 0}]}]
    asyncio.run(publisher.tick())
    assert len(api.published) == 2 and devices() == {"gpu-0": "16Gi", "gpu-1": "12Gi"}
    bad.add(0)
    asyncio.run(publisher.tick())
    assert len(api.published) == 3 and devices() == {"gpu-1": "12Gi"}


def test_a_spec_that_cannot_be_written_leaves_nothing_booked(tmp_path: Path) -> None:
    blocked = tmp_path / "cdi"
    blocked.write_text("a file where the CDI directory should be")
    d = driver(blocked, claim())
    with pytest.raises(ClaimError, match="cannot write the claim's CDI spec"):
        asyncio.run(d.prepare(ClaimRef("ns", "c", UID)))
    assert [r.op for r in d.daemon.asked] == ["claim-prepare", "claim-unprepare"]  # type: ignore[attr-defined]


def test_claims_whose_resourceclaim_is_gone_are_collected(tmp_path: Path) -> None:
    def entry(name: str, uid: str, holder: str = "") -> dict[str, Any]:
        return {"uid": uid, "namespace": "ns", "name": name, "holder": holder}

    claims = [
        entry("c", UID),  # still there: kept
        entry("gone", "u-gone"),  # 404: collected
        entry("renamed", "u-old"),  # made again with another UID: collected
        entry("held", "u-held", holder="c1"),  # a container holds it: kept
        entry("broken", "u-broken"),  # the API server cannot say: kept
    ]
    d = driver(tmp_path, claim(), FakeDaemon(Reply(True, claims=claims)))
    asyncio.run(d.collect())
    unprepared = [r.id for r in d.daemon.asked if r.op == "claim-unprepare"]  # type: ignore[attr-defined]
    assert unprepared == ["u-gone", "u-old"]
