"""A pod's resources.limits, as the device plugin's Allocate hands them over
(``gpushare.io/kubelet.*`` container annotations), turned into its share;
forgeries refused; the IDs in records and status; fragmentation refused,
counted and posted as an event."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest

from nri_gpushare.config import parse_config
from nri_gpushare.daemon.adapters import FRAGMENTED, PodEvents
from nri_gpushare.daemon.main import build_service
from nri_gpushare.daemon.metrics import Snapshot
from nri_gpushare.daemon.nri_handler import GpuShareHandler
from nri_gpushare.k8s.events import PodRef
from nri_gpushare.names import ASSIGNED, CORE, COUNT, KUBELET_ANNOTATIONS, MEMORY
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.stub import PluginError
from nri_gpushare.share import records
from nri_gpushare.share.decisions import REFUSAL_REASONS, refusal_reason
from nri_gpushare.share.kernel import GpuQuota, Registration
from nri_gpushare.share.model import (
    Allocation,
    ContainerInfo,
    GpuShare,
    NodePolicy,
    ShareRefused,
    SourcePolicy,
)
from nri_gpushare.share.plan import assigned_annotation
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.request import ignored, parse_request
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, make_gpus
from tests.unit.test_metrics import by_name, lab, scrape

P = "gpushare.io/"
KM, KC, KN = KUBELET_ANNOTATIONS[MEMORY], KUBELET_ANNOTATIONS[CORE], KUBELET_ANNOTATIONS[COUNT]
POLICY = NodePolicy()  # the defaults: pods ask through annotations and the kubelet


def ids(n: int, start: int = 0) -> str:
    """n device IDs as Allocate writes them."""
    return f"{start}-{start + n - 1}" if n > 1 else str(start)


def limits(memory: int | None = None, core: int | None = None, count: int | None = None):
    """The container annotations the kubelet copies from Allocate's answer."""
    out = {}
    for key, n in ((KM, memory), (KC, core), (KN, count)):
        if n is not None:
            out[key] = ids(n)
    return out


def pod(annotations=None, pod_annotations=None, labels=None, cid="c", name="main", uid="u-1"):
    return ContainerInfo(
        id=cid,
        name=name,
        pod_name=f"pod-{cid}",
        pod_namespace="ns",
        pod_uid=uid,
        pod_annotations=pod_annotations or {},
        annotations=annotations or {},
        labels=labels or {},
    )


def by_hand(annotations=None, labels=None) -> ContainerInfo:
    return ContainerInfo(id="c", name="main", annotations=annotations or {}, labels=labels or {})


def refusal(c: ContainerInfo, gpus=None, policy=POLICY) -> ShareRefused:
    with pytest.raises(ShareRefused) as info:
        parse_request(c, gpus or make_gpus(2), policy)
    return info.value


# -- amounts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 9))
def test_memory_over_each_count_on_nodes_of_1_to_8_gpus(n):
    gpus = make_gpus(n, 80 * GiB)
    for k in range(1, n + 1):
        req = parse_request(pod(limits(memory=8 * k, count=k)), gpus, POLICY)
        assert req is not None
        assert req.memory_bytes == (8 * GiB,) * k
        assert req.core_percent == (0,) * k
        assert req.devices is None
        assert req.kubelet == {"gpu-count": ids(k), "gpu-memory": ids(8 * k)}
    # one more GPU than the node has: the usual capacity refusal, citing the limit
    e = refusal(pod(limits(memory=8 * (n + 1), count=n + 1)), gpus)
    assert e.reason == "capacity"
    assert f"resources.limits gpushare.io/gpu-count={n + 1} asks for {n + 1} GPUs" in str(e)
    assert f"this node has {n}" in str(e)


def test_without_count_one_gpu():
    req = parse_request(pod(limits(memory=8, core=60)), make_gpus(4), POLICY)
    assert (req.memory_bytes, req.core_percent, req.count) == ((8 * GiB,), (60,), 1)
    assert req.keys["memory"] == "gpushare.io/gpu-memory"


def test_core_is_a_total_over_the_gpus():
    req = parse_request(pod(limits(memory=8, core=60, count=2)), make_gpus(2), POLICY)
    assert (req.memory_bytes, req.core_percent) == ((4 * GiB,) * 2, (30, 30))
    assert req.kubelet == {"gpu-core": "0-59", "gpu-count": "0-1", "gpu-memory": "0-7"}


def test_memory_that_does_not_divide_by_the_count():
    e = refusal(pod(limits(memory=8, count=3)), make_gpus(4))
    assert e.reason == "invalid" and e.key == "gpushare.io/gpu-memory"
    assert "resources.limits gpushare.io/gpu-memory=8" in str(e)
    assert "8 over 3 GPUs is not whole GiB; use a multiple of 3" in str(e)


@pytest.mark.parametrize(
    ("core", "count", "fragment"),
    [
        (3, 1, "3 over 1 GPU is 3% per GPU"),
        (105, 1, "105 over 1 GPU is 105% per GPU"),
        (50, 3, "50 over 3 GPUs is not a whole percent per GPU"),
        (30, 2, "30 over 2 GPUs is 15% per GPU"),  # fine: 15 is a multiple of 5
        (10, 4, "10 over 4 GPUs is not a whole percent"),
        (220, 2, "220 over 2 GPUs is 110% per GPU"),
    ],
)
def test_core_per_gpu_follows_the_gpu_core_rule(core, count, fragment):
    c = pod(limits(memory=4 * count, core=core, count=count))
    if core == 30:
        assert parse_request(c, make_gpus(4), POLICY).core_percent == (15, 15)
        return
    e = refusal(c, make_gpus(4))
    assert e.reason == "invalid" and e.key == "gpushare.io/gpu-core"
    assert f"resources.limits gpushare.io/gpu-core={core}" in str(e)
    assert fragment in str(e)
    assert "must be a multiple of 5 between 5 and 100 (percent of a GPU)" in str(e)
    assert f"use a multiple of {5 * count} from {5 * count} to {100 * count}" in str(e)


@pytest.mark.parametrize(
    ("asked", "cited"),
    [
        (limits(core=50), "gpushare.io/gpu-core=50"),
        (limits(count=2), "gpushare.io/gpu-count=2"),
        (limits(core=50, count=2), "gpushare.io/gpu-core=50 and gpushare.io/gpu-count=2"),
    ],
)
def test_core_or_count_without_memory(asked, cited):
    e = refusal(pod(asked))
    assert e.reason == "invalid" and e.key == "gpushare.io/gpu-memory"
    assert f"resources.limits {cited} needs gpushare.io/gpu-memory in resources.limits too" in str(
        e
    )


# -- with the annotations --------------------------------------------------------------------


def test_annotations_that_agree_are_fine_and_the_rest_still_apply():
    annotations = {
        P + "gpu-memory": "4096Mi",
        P + "gpu-count": "2",
        P + "priority": "high",
        P + "isolation": "memory",
        P + "placement": "spread",
    }
    req = parse_request(pod(limits(memory=8, count=2), annotations), make_gpus(2), POLICY)
    assert req.memory_bytes == (4 * GiB, 4 * GiB)
    assert (req.priority, req.isolation, req.placement) == ("high", "memory", "spread")


@pytest.mark.parametrize(
    ("annotation", "kubelet_cite", "their_cite"),
    [
        (
            {P + "gpu-memory": "2Gi"},
            "resources.limits gpushare.io/gpu-memory=8",
            "pod annotation gpushare.io/gpu-memory=2Gi",
        ),
        (
            {P + "container.main.gpu-memory": "3Gi"},
            "resources.limits gpushare.io/gpu-memory=8",
            "pod annotation gpushare.io/container.main.gpu-memory=3Gi",
        ),
        (  # an opt-out cannot undo what the scheduler counted
            {P + "gpu-memory": "0"},
            "resources.limits gpushare.io/gpu-memory=8",
            "pod annotation gpushare.io/gpu-memory=0",
        ),
        (  # without gpu-count the limits mean one GPU: 2 would double the memory
            {P + "gpu-count": "2"},
            "resources.limits gpushare.io/gpu-memory=8 without gpushare.io/gpu-count (one GPU)",
            "pod annotation gpushare.io/gpu-count=2",
        ),
        (
            {P + "gpu-core": "20"},
            "resources.limits gpushare.io/gpu-core=60",
            "pod annotation gpushare.io/gpu-core=20",
        ),
    ],
)
def test_annotations_that_disagree_are_a_conflict_naming_both(annotation, kubelet_cite, their_cite):
    e = refusal(pod(limits(memory=8, core=60), pod_annotations=annotation))
    assert e.reason == "conflict"
    assert f"{kubelet_cite} disagrees with {their_cite}" in str(e)


@pytest.mark.parametrize(
    ("annotations", "env", "cite", "key"),
    [
        ({P + "gpu-core": "50"}, {}, "pod annotation gpushare.io/gpu-core=50", P + "gpu-core"),
        (
            {P + "container.main.gpu-core": "100"},
            {},
            "pod annotation gpushare.io/container.main.gpu-core=100",
            P + "container.main.gpu-core",
        ),
        (
            {},
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_SCHD_WEIGHT": "16"},
            "environment ALIYUN_COM_GPU_SCHD_WEIGHT=16 (100%)",
            "ALIYUN_COM_GPU_SCHD_WEIGHT",
        ),
        ({}, {"EGPU": "PGPU=0,MEM=4096,WEIGHT=50"}, "environment EGPU WEIGHT=50", "EGPU"),
    ],
)
def test_no_source_adds_compute_the_limits_did_not_ask_for(annotations, env, cite, key):
    # limits without gpu-core: the scheduler counted no compute; a gpu-core from
    # elsewhere would reserve compute it never counted (others then refused)
    policy = NodePolicy(pod_sources=SourcePolicy(env=True))
    c = dataclasses.replace(pod(limits(memory=4), pod_annotations=annotations), env=env)
    e = refusal(c, make_gpus(1), policy)
    assert (e.reason, e.key) == ("conflict", key)
    assert f"{cite}: the container asks with resources.limits without gpushare.io/gpu-core" in str(
        e
    )
    assert "ask for the compute in resources.limits" in str(e)
    # no compute limit from the environment (weight 1, eGPU without WEIGHT) is no compute
    for env in ({"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_SCHD_WEIGHT": "1"},):
        c = dataclasses.replace(pod(limits(memory=4)), env=env)
        assert parse_request(c, make_gpus(1), policy).core_percent == (0,)
    c = dataclasses.replace(pod(limits(memory=4)), env={"EGPU": "PGPU=0,MEM=4096"})
    assert parse_request(c, make_gpus(1), policy).core_percent == (0,)


def test_per_gpu_cite_when_the_count_splits_the_total():
    e = refusal(pod(limits(memory=8, count=2), pod_annotations={P + "gpu-memory": "8Gi"}))
    assert "resources.limits gpushare.io/gpu-memory=8 (4096Mi on each of 2 GPUs) disagrees" in str(
        e
    )


def test_gpu_devices_from_an_annotation_must_match_the_count():
    c = pod(limits(memory=8, count=2), pod_annotations={P + "gpu-devices": "1,0"})
    assert parse_request(c, make_gpus(2), POLICY).devices == (1, 0)
    e = refusal(pod(limits(memory=8, count=2), pod_annotations={P + "gpu-devices": "1"}))
    assert "resources.limits gpushare.io/gpu-count=2 does not match" in str(e)


# -- who may write them ----------------------------------------------------------------------


@pytest.mark.parametrize("key", [KM, KC, KN, P + "kubelet.anything"])
def test_a_pod_annotation_under_the_kubelet_prefix_is_a_forgery(key):
    # containerd's pod_annotations passthrough copies it onto the container too
    for policy in (POLICY, NodePolicy(pod_sources=SourcePolicy(annotations=False))):
        e = refusal(pod({key: "0-7"}, pod_annotations={key: "0-7"}), policy=policy)
        assert e.reason == "forbidden" and e.key == key
        assert f"pod annotation {key}" in str(e)
        assert "written only by nri-gpushare's device plugin through the kubelet" in str(e)
        assert "resources.limits gpushare.io/gpu-memory / gpu-core / gpu-count instead" in str(e)
        assert refusal_reason(e.reason) == "source_denied"


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_containers_outside_kubernetes_never_carry_them(where):
    e = refusal(by_hand(**{where: {KM: "0-7"}}))
    assert e.reason == "forbidden"
    kind = "container annotation" if where == "annotations" else "container label"
    assert f"{kind} {KM}: only Kubernetes pods get gpushare.io/kubelet.* annotations" in str(e)


def test_with_sources_pods_kubelet_off_they_are_ignored_with_a_warning():
    policy = NodePolicy(pod_sources=SourcePolicy(kubelet=False))
    c = pod(limits(memory=8, core=60))
    assert parse_request(c, make_gpus(2), policy) is None
    assert ignored(c, policy.pod_sources) == [
        f"container annotation {KC} (resources.limits)",
        f"container annotation {KM} (resources.limits)",
    ]
    assert ignored(c, POLICY.pod_sources) == []
    # nor do they stand in the way of an annotation's request
    c = pod({**limits(memory=8), KC: "junk"}, pod_annotations={P + "gpu-memory": "1Gi"})
    assert parse_request(c, make_gpus(2), policy).memory_bytes == (GiB,)


def test_read_without_the_annotations_source():
    policy = NodePolicy(pod_sources=SourcePolicy(annotations=False))
    c = pod(limits(memory=8), pod_annotations={P + "gpu-memory": "2Gi"})
    assert parse_request(c, make_gpus(2), policy).memory_bytes == (8 * GiB,)
    assert ignored(c, policy.pod_sources) == ["pod annotation gpushare.io/gpu-memory"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        "5-1",
        "0-3,2",
        "1,,2",
        " 1",
        "-1",
        "0x10",
        "１",  # a fullwidth digit
        "100000",
        "0-" + "9" * 40,
        "1," * 3000,
        "\n0",
    ],
)
def test_hostile_id_texts_are_refused_naming_the_annotation_and_the_device_plugin(text):
    e = refusal(pod({KM: text}))
    assert e.reason == "invalid" and e.key == KM
    assert f"container annotation {KM}=" in str(e)
    assert "written by nri-gpushare's device plugin (Allocate), not by a person" in str(e)
    assert len(str(e)) < 600


def test_an_unknown_kubelet_annotation_is_refused():
    e = refusal(pod({**limits(memory=2), P + "kubelet.gpu-mem": "0"}))
    assert e.reason == "invalid"
    assert "not one nri-gpushare's device plugin writes" in str(e)


def test_ids_are_kept_canonical():
    c = pod({KM: "4-7,0-3", KN: "1"})
    assert parse_request(c, make_gpus(2), POLICY).kubelet == {"gpu-count": "1", "gpu-memory": "0-7"}


# -- the service: records, recovery, status --------------------------------------------------


def service(gpus=None, kmod=None, store=None, **policy) -> ShareService:
    svc = ShareService(
        gpus or make_gpus(2, 16 * GiB),
        NodePolicy(**policy),
        Inline(kmod or FakeKernelModule()),
        FakeDevices(),
        store,
    )
    return svc


def live(c: ContainerInfo, plan) -> ContainerInfo:
    return ContainerInfo(
        id=c.id,
        name=c.name,
        pod_name=c.pod_name,
        pod_namespace=c.pod_namespace,
        pod_uid=c.pod_uid,
        pod_annotations=c.pod_annotations,
        annotations={**c.annotations, **plan.annotations},
    )


async def test_status_and_records_carry_the_ids():
    svc = service()
    await svc.start()
    c = pod(limits(memory=8, core=60, count=2))
    plan = await svc.lifecycle.create_container(c)
    assert plan.env["GPUSHARE_MEMORY_LIMIT"] == f"{4 * GiB},{4 * GiB}"
    assert plan.env["GPUSHARE_CORE_LIMIT"] == "30,30"
    other = pod(cid="d", pod_annotations={P + "gpu-memory": "1Gi"})
    await svc.lifecycle.create_container(other)
    entries = {a["container_id"]: a for a in svc.status()["allocations"]}
    want = {"gpu-core": "0-59", "gpu-count": "0-1", "gpu-memory": "0-7"}
    assert entries["c"]["kubelet"] == want
    assert entries["d"]["kubelet"] == {}
    [line] = [ln for ln in svc.store.load().splitlines() if '"c"' in ln]
    assert json.loads(line)["add"]["kubelet"] == want
    assert "kubelet" not in [ln for ln in svc.store.load().splitlines() if '"d"' in ln][0]
    decoded = records.decode(svc.store.load(), svc.gpus)
    assert decoded["c"] == svc.allocations["c"] and decoded["d"].kubelet == {}


def test_records_without_ids_still_load_and_bad_ids_cost_only_the_ids(caplog):
    gpus = make_gpus(1)
    share = {"core": 0, "index": 0, "memory": GiB, "uuid": gpus[0].uuid}
    entry = {
        "container_id": "old",
        "gpus": [share],
        "isolation": "full",
        "name": "main",
        "pod": "ns/p",
        "priority": "normal",
    }
    bad = [
        {"gpu-memory": "7-0"},
        {"gpu-memory": 8},
        ["0-7"],
        {"gpu-mem": "0"},
        "0-7",
        None,
        {"gpu-memory": "0-" + "9" * 5000},
        {"gpu-memory": "0-1", "gpu-core": "x"},
    ]
    lines = [json.dumps({"version": 1}), json.dumps({"add": entry})]
    lines += [
        json.dumps({"add": {**entry, "container_id": f"b{i}", "kubelet": k}})
        for i, k in enumerate(bad)
    ]
    lines.append(
        json.dumps({"add": {**entry, "container_id": "new", "kubelet": {"gpu-memory": "1,0"}}})
    )
    with caplog.at_level(logging.ERROR):
        got = records.decode("\n".join(lines), gpus)
    assert got["old"].kubelet == {}
    assert got["new"].kubelet == {"gpu-memory": "0-1"}
    # the share is kept (forgetting it would let others be placed on top of it)
    assert set(got) == {"old", "new"} | {f"b{i}" for i in range(len(bad))}
    assert all(got[f"b{i}"].kubelet == {} for i in range(len(bad)))
    assert got["b0"].shares == got["old"].shares
    assert caplog.text.count("its kubelet device IDs are left out") == len(bad)
    assert all(len(r.getMessage()) < 600 for r in caplog.records)


async def test_a_record_with_garbled_ids_keeps_its_share_and_the_container_gives_the_ids():
    kmod = FakeKernelModule()
    svc = service(kmod=kmod, store=MemoryStore())
    await svc.start()
    c = pod(limits(memory=4, core=20))
    lc = live(c, await svc.lifecycle.create_container(c))
    text = svc.store.load().replace('"gpu-memory":"0-3"', '"gpu-memory":"junk"')
    assert "junk" in text
    kmod.regs.clear()  # the module lost it (reloaded) or is not there: the record is all
    fresh = service(kmod=kmod, store=MemoryStore(text))
    await fresh.start()
    await fresh.recovery.synchronize([lc])
    want = {"gpu-core": "0-19", "gpu-memory": "0-3"}
    assert fresh.allocations["c"].kubelet == want
    assert fresh.status()["allocations"][0]["kubelet"] == want
    assert fresh.ledger.usage[0].memory_bytes == 4 * GiB  # still accounted


async def test_restart_recovers_the_ids_from_the_records_or_the_container():
    kmod = FakeKernelModule()
    svc = service(kmod=kmod, store=MemoryStore())
    await svc.start()
    c = pod(limits(memory=4, core=20))
    lc = live(c, await svc.lifecycle.create_container(c))
    want = {"gpu-core": "0-19", "gpu-memory": "0-3"}
    for store in (MemoryStore(svc.store.load()), MemoryStore()):  # records; the module only
        fresh = service(kmod=kmod, store=store)
        await fresh.start()
        await fresh.recovery.synchronize([lc])
        assert fresh.allocations["c"].kubelet == want
        assert fresh.status()["allocations"][0]["kubelet"] == want


async def test_when_the_module_wins_over_a_record_the_ids_stay():
    kmod = FakeKernelModule()
    svc = service(kmod=kmod, store=MemoryStore())
    await svc.start()
    c = pod(limits(memory=4))
    lc = live(c, await svc.lifecycle.create_container(c))
    kmod.regs["c"] = Registration("c", (GpuQuota(1, 2 * GiB, 0),))  # differs from the record
    fresh = service(kmod=kmod, store=MemoryStore(svc.store.load()))
    await fresh.start()
    await fresh.recovery.synchronize([lc])
    alloc = fresh.allocations["c"]
    assert alloc.shares[0].index == 1 and alloc.kubelet == {"gpu-memory": "0-3"}


def test_where_the_module_wins_over_a_record_the_records_ids_stay():
    gpus = make_gpus(2)
    record = Allocation(
        "c", "main", "ns/pod-c", (GpuShare(0, gpus[0].uuid, GiB, 0),), kubelet={MEMORY: "0"}
    )
    c = pod({ASSIGNED: assigned_annotation(record)})  # no kubelet annotations to fall back on
    got = records.recover(c, record, Registration("c", (GpuQuota(1, 2 * GiB, 0),)), gpus)
    assert got is not None and got.shares[0].index == 1
    assert got.kubelet == {MEMORY: "0"}


# -- fragmentation ---------------------------------------------------------------------------


async def two_gpus_with_10gib_free() -> ShareService:
    svc = service(gpus=make_gpus(2, 16 * GiB))
    await svc.start()
    for i in range(2):
        await svc.lifecycle.create_container(
            pod(
                cid=f"fill{i}", pod_annotations={P + "gpu-memory": "6Gi", P + "gpu-devices": str(i)}
            )
        )
    return svc


async def test_twelve_gib_on_two_gpus_with_ten_free_each_is_fragmentation():
    svc = await two_gpus_with_10gib_free()
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(pod(limits(memory=12), cid="big"))
    e = info.value
    assert e.reason == "fragmentation" and e.key == "gpushare.io/gpu-memory"
    text = str(e)
    assert "the kubelet admitted resources.limits gpushare.io/gpu-memory=12" in text
    assert "the node's free total is enough (20480Mi and 200% compute over 2 GPUs)" in text
    assert "no GPU has 12288Mi free" in text
    for i in range(2):
        assert f"GPU {i} ({svc.gpus[i].uuid}) 10240Mi and 100% compute free" in text
    assert 'docs/kubernetes.md "Fragmentation"' in text
    assert "ask for the same total over more GPUs (gpushare.io/gpu-count)" in text
    assert "big" not in svc.allocations
    assert svc.decisions.refusals == {"fragmentation": 1}
    # split over both GPUs it fits
    await svc.lifecycle.create_container(pod(limits(memory=12, count=2), cid="split"))
    assert svc.allocations["split"].shares[0].memory_bytes == 6 * GiB


async def test_fragmentation_for_several_gpus_and_compute():
    svc = service(gpus=make_gpus(3, 16 * GiB))
    await svc.start()
    for i, core in enumerate((70, 50, 40)):
        await svc.lifecycle.create_container(
            pod(
                cid=f"fill{i}",
                pod_annotations={
                    P + "gpu-memory": "1Gi",
                    P + "gpu-core": str(core),
                    P + "gpu-devices": str(i),
                },
            )
        )
    with pytest.raises(ShareRefused) as info:  # 2 x 55%: 140% free, only GPU 2 has 60%
        await svc.lifecycle.create_container(pod(limits(memory=2, core=110, count=2), cid="x"))
    assert info.value.reason == "fragmentation"
    assert "only 1 GPU has 1024Mi and 55% compute free, 2 needed" in str(info.value)
    assert "GPU 0 (" in str(info.value) and "15360Mi and 30% compute free" in str(info.value)


async def test_not_fragmentation_when_the_total_is_short_or_the_request_is_an_annotation():
    svc = await two_gpus_with_10gib_free()
    for c in (
        pod(limits(memory=24), cid="too-big"),  # the kubelet's view was out of date
        pod(pod_annotations={P + "gpu-memory": "12Gi"}, cid="annotation"),
    ):
        with pytest.raises(ShareRefused) as info:
            await svc.lifecycle.create_container(c)
        assert info.value.reason == "capacity", str(info.value)
    assert svc.decisions.refusals == {"capacity": 2}


async def test_max_inst_is_the_usual_refusal():
    svc = service(gpus=make_gpus(2, 16 * GiB), max_inst=1)
    await svc.start()
    for i in range(2):
        await svc.lifecycle.create_container(
            pod(
                cid=f"fill{i}", pod_annotations={P + "gpu-memory": "1Gi", P + "gpu-devices": str(i)}
            )
        )
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(pod(limits(memory=2), cid="x"))
    assert info.value.reason == "capacity" and "max_inst 1" in str(info.value)


async def test_a_gpu_full_of_containers_does_not_hide_fragmentation():
    # GPU 0 holds max_inst containers: the device plugin leaves it out of the
    # totals (3 + 3 GiB advertised), so 4 GiB admitted is fragmentation over GPUs 1-2
    svc = service(gpus=make_gpus(3, 16 * GiB), max_inst=2)
    await svc.start()
    fills = [(0, "1Gi"), (0, "1Gi"), (1, "13Gi"), (2, "13Gi")]
    for n, (i, size) in enumerate(fills):
        await svc.lifecycle.create_container(
            pod(cid=f"fill{n}", pod_annotations={P + "gpu-memory": size, P + "gpu-devices": str(i)})
        )
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(pod(limits(memory=4), cid="x"))
    e = info.value
    assert e.reason == "fragmentation", str(e)
    text = str(e)
    assert "the node's free total is enough (6144Mi and 200% compute over 2 GPUs)" in text
    assert "no GPU has 4096Mi free" in text
    assert "14336Mi and 100% compute free (holds 2 containers, max_inst 2: not in" in text
    # 3 GiB fits GPU 1 or 2; 7 GiB is more than the counted total: stale, capacity
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(pod(limits(memory=7), cid="y"))
    assert info.value.reason == "capacity"
    assert svc.decisions.refusals == {"fragmentation": 1, "capacity": 1}


def test_fragmentation_is_a_reason_of_its_own_in_the_metrics():
    assert "fragmentation" in REFUSAL_REASONS
    assert refusal_reason("fragmentation") == "fragmentation"
    doc = {
        "version": "t",
        "kmod": {"mode": "off", "loaded": False, "problem": ""},
        "nri": {"connected": True, "sessions": 1},
        "gpus": [],
        "allocations": [],
    }
    samples = by_name(
        scrape(Snapshot(doc, {}, {"fragmentation": 3}, {})), "gpushare_refusals_total"
    )
    assert samples[lab(reason="fragmentation")] == 3
    assert samples[lab(reason="capacity")] == 0


# -- the daemon: the pod event ---------------------------------------------------------------


def nri_views(uid="0f0e-11"):
    request = lite.decode_create_container_request(
        bytes(
            nri.CreateContainerRequest(
                pod=nri.PodSandbox(id="p", name="train", namespace="ml", uid=uid),
                container=nri.Container(id="big", name="main", annotations=limits(memory=12)),
            )
        )
    )
    return request.pod, request.container


async def handler_on_two_gpus(tmp_path, events: PodEvents | None) -> GpuShareHandler:
    inventory = [
        {"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "memory": "16Gi"}
        for i in range(2)
    ]
    config = parse_config(
        {
            "kmod": "off",
            "use_nvml": False,
            "inventory": inventory,
            "state_dir": str(tmp_path / "state"),
            "interposer": {"missing": "warn"},
        }
    )
    handler = GpuShareHandler(await build_service(config, None), events=events)
    for i in range(2):
        await handler.service.lifecycle.create_container(
            pod(
                cid=f"fill{i}", pod_annotations={P + "gpu-memory": "6Gi", P + "gpu-devices": str(i)}
            )
        )
    return handler


async def test_a_fragmented_pod_gets_an_event_the_handler_does_not_wait_for(tmp_path):
    posted: list[tuple[PodRef, str, str]] = []
    release = asyncio.Event()

    async def post(pod_ref: PodRef, reason: str, message: str) -> None:
        await release.wait()  # an API server that does not answer yet
        posted.append((pod_ref, reason, message))

    events = PodEvents(post)
    handler = await handler_on_two_gpus(tmp_path, events)
    with pytest.raises(PluginError) as info:
        await asyncio.wait_for(handler.create_container(*nri_views()), 5)
    assert "no GPU has 12288Mi free" in str(info.value)
    assert posted == [] and len(events.tasks) == 1  # answered while the event waits
    release.set()
    await asyncio.wait_for(asyncio.gather(*events.tasks), 5)
    [(ref, reason, message)] = posted
    assert ref == PodRef("ml", "train", "0f0e-11")
    assert reason == FRAGMENTED == "GPUShareFragmented"
    assert message == str(info.value)
    assert not events.tasks


async def test_a_failed_event_is_only_logged_and_off_means_none(tmp_path, caplog):
    async def post(pod_ref: PodRef, reason: str, message: str) -> None:
        raise RuntimeError("API server says no")

    events = PodEvents(post)
    handler = await handler_on_two_gpus(tmp_path, events)
    with pytest.raises(PluginError):
        await handler.create_container(*nri_views())
    await asyncio.wait_for(asyncio.gather(*events.tasks), 5)
    assert "the GPUShareFragmented event was not posted: API server says no" in caplog.text
    # kubernetes.events off: no PodEvents at all, the refusal is the same
    handler = await handler_on_two_gpus(tmp_path / "off", None)
    with pytest.raises(PluginError, match="fragmentation"):
        await handler.create_container(*nri_views())


async def test_events_in_flight_are_bounded_and_closed(caplog):
    async def never(pod_ref: PodRef, reason: str, message: str) -> None:
        await asyncio.Event().wait()

    events = PodEvents(never)
    for i in range(PodEvents.MAX_IN_FLIGHT + 3):
        events.fragmented(pod(cid=f"c{i}", uid=f"u-{i}"), "m")
    assert len(events.tasks) == PodEvents.MAX_IN_FLIGHT
    assert caplog.text.count("event is dropped") == 3
    events.fragmented(by_hand(), "m")  # no pod: nothing to post on
    assert len(events.tasks) == PodEvents.MAX_IN_FLIGHT
    await asyncio.wait_for(events.close(), 5)
    assert not events.tasks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_container_the_kubelet_retries_gets_one_event_per_interval():
    # the kubelet retries a refused container every few seconds; each post is a
    # new Event object, so a stuck pod must not post one per retry
    posted: list[PodRef] = []

    async def post(pod_ref: PodRef, reason: str, message: str) -> None:
        posted.append(pod_ref)

    clock = Clock()
    events = PodEvents(post, clock)
    stuck, other = pod(cid="c", uid="u-1"), pod(cid="d", uid="u-2")
    for _ in range(200):  # 1000 s of retries, one every 5 s
        events.fragmented(stuck, "m")
        clock.now += 5
    events.fragmented(other, "m")  # another pod is not held back by the first
    await asyncio.wait_for(asyncio.gather(*events.tasks), 5)
    assert [p.uid for p in posted] == ["u-1", "u-1", "u-2"]  # at 0 s and 600 s
    # a new pod of the same name (a new uid) is a new pod
    events.fragmented(pod(cid="c", uid="u-3"), "m")
    await asyncio.wait_for(asyncio.gather(*events.tasks), 5)
    assert posted[-1].uid == "u-3"


async def test_the_containers_remembered_are_bounded(monkeypatch):
    async def post(pod_ref: PodRef, reason: str, message: str) -> None:
        pass

    monkeypatch.setattr(PodEvents, "MAX_REMEMBERED", 8)
    events = PodEvents(post, Clock())
    for i in range(50):
        events.fragmented(pod(cid=f"c{i}", uid=f"u-{i}", name="x" * 10_000), "m")
        await asyncio.wait_for(asyncio.gather(*events.tasks), 5)
    assert len(events.posted) == 8
    assert ("ns", "pod-c49", "u-49", "x" * 256) in events.posted  # the newest stay
    assert ("ns", "pod-c0", "u-0", "x" * 256) not in events.posted
