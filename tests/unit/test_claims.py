"""Prepared DRA claims in the share domain (share/claims.py) over the fake
kernel module: booking at prepare (idempotent, refusals book nothing), the
container that carries the claim's variable taking exactly the claim's
share, one holder at a time, the booking coming back at its release, a
daemon restart, Synchronize, and resize refusing a claim's share."""

import dataclasses
import json

import pytest

from nri_gpushare.names import DRA_CLAIM_ENV
from nri_gpushare.share.claims import WHOLE, ClaimAsk, MemoryClaimStore, ShareAsk
from nri_gpushare.share.model import ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, MiB, done, make_gpus

UID = "5f0c1a2b-0000-4000-8000-000000000001"


def service(kmod=None, store=None, claims=None, gpus=2, **policy):
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        make_gpus(gpus, 16 * GiB),
        NodePolicy(**policy),
        Inline(kmod),
        FakeDevices(),
        store,
        claim_store=claims,
    )
    done(svc.start())
    return svc, kmod


def ask(uid=UID, gpu=0, memory=2 * GiB, core=30, pods=("pod-a",), svc=None):
    uuid = f"GPU-{gpu}" if svc is None else svc.by_index[gpu].uuid
    return ClaimAsk(uid, "ns", "claim-a", tuple(pods), (ShareAsk(uuid, memory, core),))


def container(cid="c1", pod_uid="pod-a", uid=UID, env=None):
    return ContainerInfo(
        id=cid,
        name="main",
        pod_name="p",
        pod_namespace="ns",
        pod_uid=pod_uid,
        env={DRA_CLAIM_ENV: uid} if env is None else env,
        cgroups_path=f"/k8s/{cid}",
    )


def used(svc, gpu=0):
    u = svc.ledger.usage[gpu]
    return u.memory_bytes, u.core_percent, len(u.containers)


def test_prepare_books_the_claim_and_is_idempotent():
    svc, _ = service()
    claim = svc.claims.prepare(ask(svc=svc))
    assert used(svc) == (2 * GiB, 30, 1)
    assert svc.claims.prepare(ask(svc=svc)) is claim  # the kubelet retries
    assert used(svc) == (2 * GiB, 30, 1)
    assert svc.status()["claims"][0]["gpus"] == [
        {"index": 0, "uuid": svc.by_index[0].uuid, "memory": 2 * GiB, "core": 30}
    ]


def test_the_same_uid_with_another_share_is_refused():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    with pytest.raises(ShareRefused, match="prepared already") as e:
        svc.claims.prepare(ask(svc=svc, memory=4 * GiB))
    assert e.value.reason == "conflict"
    assert used(svc) == (2 * GiB, 30, 1)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"memory": 3 * MiB // 2}, "whole MiB"),
        ({"memory": 0}, "whole MiB"),
        ({"core": 33}, "steps of 5"),
        ({"core": 101}, "steps of 5"),
        ({"uid": "../x"}, "not a Kubernetes UID"),
        ({"pods": ("a b",)}, "pod UIDs"),
    ],
)
def test_bad_values_are_refused_and_book_nothing(change, match):
    svc, _ = service()
    with pytest.raises(ShareRefused, match=match) as e:
        svc.claims.prepare(ask(svc=svc, **change))
    assert e.value.reason == "invalid"
    assert used(svc) == (0, 0, 0) and not svc.claims.book


def test_an_unknown_gpu_is_refused():
    svc, _ = service()
    with pytest.raises(ShareRefused, match="not one of this node's"):
        svc.claims.prepare(ask(uid=UID))  # "GPU-0" is not a fake GPU's UUID


def test_a_claim_that_does_not_fit_is_refused_with_why():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc, memory=15 * GiB))
    with pytest.raises(ShareRefused, match="exceeds the free") as e:
        svc.claims.prepare(ask(uid="other", svc=svc, memory=2 * GiB))
    assert e.value.reason == "capacity"
    assert "other" not in svc.claims.book


def test_a_whole_gpu_claim_takes_all_of_it():
    svc, _ = service(memory_reserve_bytes=GiB)
    svc.claims.prepare(ask(svc=svc, memory=WHOLE, core=0))
    assert used(svc) == (15 * GiB, 100, 1)


def test_the_container_takes_exactly_the_claims_share_and_gives_it_back():
    svc, kmod = service()
    svc.claims.prepare(ask(svc=svc))
    plan = done(svc.lifecycle.create_container(container()))
    assert plan is not None
    assert plan.env["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    alloc = svc.allocations["c1"]
    assert alloc.claim == UID
    assert [(s.index, s.memory_bytes, s.core_percent) for s in alloc.shares] == [(0, 2 * GiB, 30)]
    assert used(svc) == (2 * GiB, 30, 1)  # counted once: the container's, not the claim's too
    assert "c1" in kmod.regs
    assert svc.claims.book[UID].holder == "c1"
    done(svc.lifecycle.release("c1"))
    assert used(svc) == (2 * GiB, 30, 1)  # booked as the claim's again
    assert svc.claims.book[UID].holder == "" and "c1" not in kmod.regs
    done(svc.lifecycle.create_container(container("c2")))  # a restarted container
    assert svc.allocations["c2"].claim == UID


def test_one_holder_at_a_time():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    done(svc.lifecycle.create_container(container()))
    with pytest.raises(ShareRefused, match="one container at a time") as e:
        done(svc.lifecycle.create_container(container("c2")))
    assert e.value.reason == "claim"
    assert used(svc) == (2 * GiB, 30, 1)


@pytest.mark.parametrize(
    ("c", "match"),
    [
        (container(pod_uid="pod-b"), "not one claim"),
        (container(uid="nope"), "no claim of UID"),
        (dataclasses.replace(container(), pod_name="", pod_uid=""), "Kubernetes pods only"),
    ],
)
def test_a_container_that_may_not_take_the_claim_is_refused(c, match):
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    with pytest.raises(ShareRefused, match=match) as e:
        done(svc.lifecycle.create_container(c))
    assert e.value.reason == "claim"
    assert used(svc) == (2 * GiB, 30, 1) and svc.claims.book[UID].holder == ""
    assert not svc.allocations


def test_a_refused_registration_gives_the_booking_back():
    kmod = FakeKernelModule()
    svc, _ = service(kmod=kmod, kmod_mode="required")
    svc.claims.prepare(ask(svc=svc))
    from nri_gpushare.share.kernel import OverCommitted

    kmod.fail_next["register"] = OverCommitted("no room")
    with pytest.raises(ShareRefused):
        done(svc.lifecycle.create_container(container()))
    assert used(svc) == (2 * GiB, 30, 1) and svc.claims.book[UID].holder == ""


def test_unprepare_frees_the_room_and_is_idempotent():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    assert svc.claims.unprepare(UID) is True
    assert svc.claims.unprepare(UID) is False
    assert used(svc) == (0, 0, 0)


def test_unprepare_while_held_keeps_the_container_share_until_it_stops():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    done(svc.lifecycle.create_container(container()))
    svc.claims.unprepare(UID)
    assert used(svc) == (2 * GiB, 30, 1)
    done(svc.lifecycle.release("c1"))
    assert used(svc) == (0, 0, 0)


def test_a_restart_books_the_claims_again():
    claims, store = MemoryClaimStore(), MemoryStore()
    svc, kmod = service(store=store, claims=claims)
    svc.claims.prepare(ask(svc=svc))
    svc.claims.prepare(ask(uid="u2", svc=svc, gpu=1, memory=GiB, core=0))
    plan = done(svc.lifecycle.create_container(container()))
    live = dataclasses.replace(container(), annotations=dict(plan.annotations))
    again, _ = service(kmod=kmod, store=store, claims=claims)
    assert set(again.claims.book) == {UID, "u2"}
    # Synchronize finds the container holding the claim: counted once.
    done(again.recovery.synchronize([live]))
    assert again.allocations["c1"].claim == UID
    assert again.claims.book[UID].holder == "c1"
    assert used(again) == (2 * GiB, 30, 1) and used(again, 1) == (GiB, 0, 1)


def test_a_bad_claims_record_is_left_out_not_fatal(caplog):
    good = ask(uid="good", memory=GiB)
    svc, _ = service()
    text = json.dumps(
        {
            "claims": [
                {"uid": "bad", "namespace": "ns", "name": "x", "pods": [], "gpus": "no"},
                {
                    "uid": good.uid,
                    "namespace": "ns",
                    "name": "claim-a",
                    "pods": ["pod-a"],
                    "gpus": [{"uuid": svc.by_index[0].uuid, "memory": GiB, "core": 0}],
                },
            ]
        }
    )
    again, _ = service(claims=MemoryClaimStore(text))
    assert set(again.claims.book) == {"good"}
    assert "claim record is left out" in caplog.text


def test_synchronize_keeps_claims_booked():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    done(svc.recovery.synchronize([]))
    assert used(svc) == (2 * GiB, 30, 1)


def test_a_claims_share_is_not_resized():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    done(svc.lifecycle.create_container(container()))
    with pytest.raises(ShareRefused, match="DRA claim") as e:
        done(svc.resizer.resize("c1", ResizeAsk(memory="4Gi")))
    assert e.value.reason == "forbidden"


# -- found by the hostile review: every one failed before its fix ------------------------


def _created_and_live(svc):
    plan = done(svc.lifecycle.create_container(container()))
    return dataclasses.replace(container(), annotations=dict(plan.annotations))


def test_a_readopted_holder_takes_the_claim_back_counted_once():
    svc, _ = service(store=MemoryStore())
    svc.claims.prepare(ask(svc=svc))
    live = _created_and_live(svc)
    done(svc.recovery.synchronize([]))  # containerd did not list it yet
    assert used(svc) == (2 * GiB, 30, 1)  # booked as the claim's meanwhile
    assert done(svc.lifecycle.readopt(live))
    assert used(svc) == (2 * GiB, 30, 1) and svc.claims.book[UID].holder == "c1"
    with pytest.raises(ShareRefused, match="one container at a time"):
        done(svc.lifecycle.create_container(container("c2")))


def test_a_holder_only_the_module_remembered_is_the_claims_again():
    claims = MemoryClaimStore()
    svc, kmod = service(store=MemoryStore(), claims=claims)
    svc.claims.prepare(ask(svc=svc))
    live = _created_and_live(svc)
    again, _ = service(kmod=kmod, store=MemoryStore(), claims=claims)  # the journal lost
    done(again.recovery.synchronize([live]))
    assert again.allocations["c1"].claim == UID
    assert used(again) == (2 * GiB, 30, 1) and again.claims.book[UID].holder == "c1"
    with pytest.raises(ShareRefused, match="one container at a time"):
        done(again.lifecycle.create_container(container("c2")))


def test_prepared_again_while_its_old_holder_runs_books_nothing_more():
    svc, _ = service()
    svc.claims.prepare(ask(svc=svc))
    done(svc.lifecycle.create_container(container()))
    svc.claims.unprepare(UID)
    svc.claims.prepare(ask(svc=svc))  # the kubelet prepares it again
    assert used(svc) == (2 * GiB, 30, 1) and svc.claims.book[UID].holder == "c1"
    with pytest.raises(ShareRefused, match="one container at a time"):
        done(svc.lifecycle.create_container(container("c2")))
    with pytest.raises(ShareRefused, match="still holds its earlier share") as e:
        svc.claims.unprepare(UID)
        svc.claims.prepare(ask(svc=svc, memory=4 * GiB))
    assert e.value.reason == "conflict"
    done(svc.lifecycle.release("c1"))
    assert used(svc) == (0, 0, 0)


def test_the_reserved_pods_are_the_claims_current_ones_and_survive_a_restart():
    claims = MemoryClaimStore()
    svc, _ = service(claims=claims)
    for n in range(300):  # a shared claim whose pods come and go
        svc.claims.prepare(ask(svc=svc, pods=(f"pod-{n}", f"pod-{n + 1}")))
    assert svc.claims.book[UID].pods == {"pod-299", "pod-300"}
    again, _ = service(claims=claims)
    assert again.claims.book[UID].pods == {"pod-299", "pod-300"}
    assert used(again) == (2 * GiB, 30, 1)
