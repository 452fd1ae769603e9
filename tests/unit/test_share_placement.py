"""Placement: binpack/spread, capacity rules, and the refusal cases 4-7 of
docs/acceptance-cases.md."""

import copy

import pytest

from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, MiB, make_gpus

P = "gpushare.io/"


def pod(name, annotations, container="main", env=None):
    return ContainerInfo(
        id=f"{name}-{container}",
        name=container,
        pod_name=name,
        pod_namespace="default",
        pod_uid=f"uid-{name}",
        pod_annotations=annotations,
        env=env or {},
    )


def service(gpus=None, policy=None, kmod=None):
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        gpus or make_gpus(4),
        policy or NodePolicy(pod_sources=STANDALONE_SOURCES),
        Inline(kmod),
        FakeDevices(),
    )
    return svc, kmod


async def placed(svc, c):
    plan = await svc.lifecycle.create_container(c)
    assert plan is not None
    return [s.index for s in svc.allocations[c.id].shares]


def snapshot(svc, kmod):
    return copy.deepcopy(svc.status()), dict(kmod.regs)


async def refuse(svc, kmod, c) -> ShareRefused:
    before = snapshot(svc, kmod)
    with pytest.raises(ShareRefused) as info:
        await svc.lifecycle.create_container(c)
    assert snapshot(svc, kmod) == before, "a refusal must leave nothing reserved"
    assert c.id not in svc.allocations
    return info.value


# -- placement example: 2 cards of 15 GiB, pod1 2 GiB, pod2 3 GiB ------------------------------


@pytest.mark.parametrize(("placement", "expected"), [("binpack", [0, 0]), ("spread", [0, 1])])
async def test_binpack_and_spread_example(placement, expected):
    svc, _ = service(
        make_gpus(2, 15 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, default_placement=placement),
    )
    got = [(await placed(svc, pod("pod1", {P + "gpu-memory": "2"})))[0]]
    got.append((await placed(svc, pod("pod2", {P + "gpu-memory": "3"})))[0])
    assert got == expected


async def test_placement_key_beats_node_default():
    svc, _ = service(
        make_gpus(2, 15 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, default_placement="binpack"),
    )
    await placed(svc, pod("pod1", {P + "gpu-memory": "2"}))
    assert await placed(svc, pod("pod2", {P + "gpu-memory": "3", P + "placement": "spread"})) == [1]


async def test_binpack_fills_the_fullest_gpu_that_fits():
    svc, _ = service(make_gpus(3, 16 * GiB))
    await placed(svc, pod("a", {P + "gpu-devices": "1", P + "gpu-memory": "10Gi"}))
    await placed(svc, pod("b", {P + "gpu-devices": "2", P + "gpu-memory": "4Gi"}))
    assert await placed(svc, pod("c", {P + "gpu-memory": "4Gi"})) == [1]
    assert await placed(svc, pod("d", {P + "gpu-memory": "4Gi"})) == [2]  # GPU 1 has 2Gi left
    assert await placed(svc, pod("e", {P + "gpu-memory": "9Gi"})) == [0]


async def test_spread_prefers_fewest_containers():
    svc, _ = service(
        make_gpus(3, 16 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, default_placement="spread"),
    )
    assert [(await placed(svc, pod(f"p{i}", {P + "gpu-memory": "1Gi"})))[0] for i in range(4)] == [
        0,
        1,
        2,
        0,
    ]


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        ("22Gi", [(0, 8 * GiB), (1, 2 * GiB), (2, 2 * GiB)]),
        # GPU 0 cannot take the first (largest) value, so the lowest chosen GPU is 1
        ("30Gi", [(1, 8 * GiB), (2, 2 * GiB), (3, 2 * GiB)]),
    ],
)
async def test_multi_gpu_gets_ascending_gpus_in_list_order(used, expected):
    svc, _ = service()
    await placed(svc, pod("a", {P + "gpu-devices": "0", P + "gpu-memory": used}))
    c = pod("b", {P + "gpu-memory": "8Gi,2Gi", P + "gpu-count": "3"})
    await svc.lifecycle.create_container(c)
    assert [(s.index, s.memory_bytes) for s in svc.allocations[c.id].shares] == expected


async def test_list_order_refusal_explains_ascending_order():
    svc, kmod = service(make_gpus(2, 4 * GiB))
    await placed(svc, pod("a", {P + "gpu-devices": "0", P + "gpu-memory": "3Gi"}))
    e = await refuse(svc, kmod, pod("b", {P + "gpu-memory": "3Gi,1Gi"}))
    assert "GPU 0" in str(e) and "exceeds the free 1024Mi by 2048Mi" in str(e)
    assert "2 of 2 GPUs have room for a part, 2 needed; the values go to" in str(e)
    # the same request with explicit devices in the other order fits
    await placed(svc, pod("c", {P + "gpu-memory": "3Gi,1Gi", P + "gpu-devices": "1,0"}))


async def test_explicit_devices_keep_their_order():
    svc, _ = service()
    c = pod("a", {P + "gpu-devices": "3,1", P + "gpu-memory": "4Gi,2Gi"})
    await svc.lifecycle.create_container(c)
    assert [(s.index, s.memory_bytes) for s in svc.allocations[c.id].shares] == [
        (3, 4 * GiB),
        (1, 2 * GiB),
    ]


# -- acceptance cases 4-7 on 4 x 32 GiB GPUs with MiB quotas --------------------------------


async def test_case4_too_big_for_the_third_gpu_rolls_back():
    svc, kmod = service()
    e = await refuse(svc, kmod, pod("big", {P + "gpu-memory": "20480Mi,20480Mi,40960Mi"}))
    msg = str(e)
    assert "cannot place container 'main' (pod default/big)" in msg
    assert "gpu-memory 20480Mi,20480Mi,40960Mi on 3 GPUs" in msg
    assert f"GPU 2 ({svc.gpus[2].uuid}) has 32768Mi total, 0Mi reserved" in msg
    assert "exceeds the free 32768Mi by 8192Mi" in msg
    assert "(no GPU has room for gpu-memory 40960Mi)" in msg
    assert "lower gpushare.io/gpu-memory" in msg
    assert (e.reason, e.key) == ("capacity", P + "gpu-memory")
    assert kmod.regs == {}


async def test_case4_with_explicit_devices():
    svc, kmod = service()
    e = await refuse(
        svc,
        kmod,
        pod("big", {P + "gpu-memory": "20480Mi,20480Mi,40960Mi", P + "gpu-devices": "0,1,2"}),
    )
    assert "GPU 2" in str(e) and "by 8192Mi" in str(e)
    assert "GPU 0" not in str(e)


async def test_case5_full_cards_refuse_a_fourth_container():
    svc, kmod = service()
    for i in range(3):
        assert await placed(svc, pod(f"fill{i}", {P + "gpu-memory": "32768Mi"})) == [i]
    assert [g["memory_free"] for g in svc.status()["gpus"]] == [0, 0, 0, 32 * GiB]
    # the three full cards must refuse 1024Mi each
    e = await refuse(svc, kmod, pod("fourth", {P + "gpu-memory": "1024Mi", P + "gpu-count": "3"}))
    for i in range(3):
        assert f"GPU {i} ({svc.gpus[i].uuid}) has 32768Mi total, 0Mi reserved, 32768Mi " in str(e)
    assert "gpu-memory 1024Mi exceeds the free 0Mi by 1024Mi" in str(e)
    assert "(1 of 4 GPUs have room for a part, 3 needed)" in str(e)
    assert "lower gpushare.io/gpu-memory or gpushare.io/gpu-count" in str(e)


async def test_case5_three_containers_on_three_cards():
    gpus = make_gpus(3)
    svc, kmod = service(gpus)
    for i in range(3):
        await placed(svc, pod(f"fill{i}", {P + "gpu-memory": "10240Mi", P + "gpu-count": "3"}))
    await placed(svc, pod("more", {P + "gpu-memory": "2048Mi", P + "gpu-count": "3"}))
    e = await refuse(svc, kmod, pod("fourth", {P + "gpu-memory": "1024Mi", P + "gpu-count": "3"}))
    assert "by 1024Mi" in str(e)


async def test_case6_weight_110_refused_before_anything_is_reserved():
    svc, kmod = service()
    e = await refuse(svc, kmod, pod("w", {P + "gpu-memory": "8192Mi", P + "gpu-core": "110"}))
    assert "gpushare.io/gpu-core=110: must be a multiple of 5 between 5 and 100" in str(e)
    assert e.reason == "invalid"
    assert [c for c in kmod.calls if c[0] == "register"] == []
    e = await refuse(svc, kmod, pod("w", {}, env={"EGPU": "PGPU=0,MEM=8192,WEIGHT=110"}))
    assert "WEIGHT=110" in str(e)


async def test_case7_compute_full_refuses_ten_percent():
    svc, kmod = service()
    for name, core in (("a", 25), ("b", 25), ("c", 50)):
        await placed(
            svc,
            pod(
                name, {P + "gpu-memory": "1024Mi", P + "gpu-core": str(core), P + "gpu-count": "4"}
            ),
        )
    assert [g["core_free"] for g in svc.status()["gpus"]] == [0, 0, 0, 0]
    e = await refuse(svc, kmod, pod("d", {P + "gpu-memory": "1024Mi", P + "gpu-core": "10"}))
    for i in range(4):  # any GPU would do, so each one's shortfall is given
        assert f"GPU {i} ({svc.gpus[i].uuid}) has 100% compute allocated" in str(e)
    assert "gpu-core 10% exceeds the free 0% by 10%" in str(e)
    assert "lower gpushare.io/gpu-core" in str(e)
    assert e.key == P + "gpu-core"
    # a share without a compute limit still fits
    await placed(svc, pod("e", {P + "gpu-memory": "1024Mi"}))


async def test_case7_with_egpu_weights():
    svc, kmod = service(make_gpus(3))
    for name, weight in (("a", 25), ("b", 25), ("c", 50)):
        blocks = ":".join(f"PGPU={i},MEM=1024,WEIGHT={weight}" for i in range(3))
        await placed(svc, pod(name, {}, env={"EGPU": "POLICY=0,ONLINE=0,TYPE=DOCKER:" + blocks}))
    e = await refuse(svc, kmod, pod("d", {}, env={"EGPU": "PGPU=1,MEM=1024,WEIGHT=10"}))
    assert "GPU 1" in str(e) and "short" not in str(e) and "by 10%" in str(e)
    assert "lower EGPU" in str(e)


# -- other capacity rules -----------------------------------------------------------------


async def test_memory_reserve():
    svc, kmod = service(
        make_gpus(1, 16 * GiB), NodePolicy(pod_sources=STANDALONE_SOURCES, memory_reserve_bytes=GiB)
    )
    await placed(svc, pod("a", {P + "gpu-memory": "15Gi"}))
    e = await refuse(svc, kmod, pod("b", {P + "gpu-memory": "1Mi"}))
    assert "16384Mi total, 1024Mi reserved, 15360Mi allocated" in str(e)
    assert svc.status()["gpus"][0]["memory_free"] == 0


async def test_max_inst():
    svc, kmod = service(make_gpus(1), NodePolicy(pod_sources=STANDALONE_SOURCES, max_inst=2))
    await placed(svc, pod("a", {P + "gpu-memory": "1Gi"}))
    await placed(svc, pod("b", {P + "gpu-memory": "1Gi"}))
    e = await refuse(svc, kmod, pod("c", {P + "gpu-memory": "1Gi"}))
    assert "already holds 2 containers (max_inst 2)" in str(e)
    assert "raise max_inst" in str(e)


async def test_one_high_priority_per_gpu_by_default():
    svc, kmod = service(make_gpus(2))
    hi = {P + "gpu-memory": "1Gi", P + "priority": "high"}
    assert await placed(svc, pod("a", hi)) == [0]
    assert await placed(svc, pod("b", hi)) == [1]
    e = await refuse(svc, kmod, pod("c", hi))
    assert "already holds 1 high-priority container(s) (at most 1 per GPU)" in str(e)
    assert "set gpushare.io/priority to normal" in str(e)
    assert e.key == P + "priority"
    assert await placed(svc, pod("d", {P + "gpu-memory": "1Gi"})) == [0]


async def test_more_high_priority_when_configured():
    svc, kmod = service(
        make_gpus(1), NodePolicy(pod_sources=STANDALONE_SOURCES, max_high_priority_per_gpu=2)
    )
    hi = {P + "gpu-memory": "1Gi", P + "priority": "high"}
    assert await placed(svc, pod("a", hi)) == [0]
    assert await placed(svc, pod("b", hi)) == [0]
    e = await refuse(svc, kmod, pod("c", hi))  # the third one is one too many
    assert e.reason == "capacity" and e.key == P + "priority"
    assert "already holds 2 high-priority container(s) (at most 2 per GPU)" in str(e)
    assert "set gpushare.io/priority to normal" in str(e)
    assert await placed(svc, pod("d", {P + "gpu-memory": "1Gi"})) == [0]


async def test_release_frees_capacity():
    svc, kmod = service(make_gpus(1))
    c = pod("a", {P + "gpu-memory": "32Gi"})
    await placed(svc, c)
    await refuse(svc, kmod, pod("b", {P + "gpu-memory": "1Mi"}))
    assert await svc.lifecycle.release(c.id)
    await placed(svc, pod("b", {P + "gpu-memory": "1Mi"}))


async def test_cgpu_three_one_on_four_gpus():
    svc, kmod = service()
    c = pod("cgpu", {}, env={"ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"})
    plan = await svc.lifecycle.create_container(c)
    assert plan.env["GPUSHARE_MEMORY_LIMIT"] == ",".join(str(g * GiB) for g in (3, 1, 1, 1))
    assert [s.index for s in svc.allocations[c.id].shares] == [0, 1, 2, 3]
    assert [q.memory_bytes for q in kmod.regs[c.id].quotas] == [3 * GiB, GiB, GiB, GiB]


async def test_egpu_string_is_honoured():
    svc, kmod = service()
    env = {
        "EGPU": "POLICY=0,ONLINE=0,TYPE=DOCKER:PGPU=2,MEM=3276,WEIGHT=10:PGPU=1,MEM=3276,WEIGHT=10",
        "NVIDIA_VISIBLE_DEVICES": "2,1",
    }
    c = pod("egpu", {}, env=env)
    plan = await svc.lifecycle.create_container(c)
    assert [(s.index, s.memory_bytes, s.core_percent) for s in svc.allocations[c.id].shares] == [
        (2, 3276 * MiB, 10),
        (1, 3276 * MiB, 10),
    ]
    assert plan.env["GPUSHARE_CORE_LIMIT"] == "10,10"
    assert plan.env["NVIDIA_VISIBLE_DEVICES"] == f"{svc.gpus[2].uuid},{svc.gpus[1].uuid}"


# -- exact capacity boundaries with no kernel module to catch mistakes ----------------------


def unguarded(gpus=None, **policy):
    """A service with kmod: off: the domain alone stands between a GPU and over-commit."""
    return ShareService(
        gpus or make_gpus(1, 16 * GiB),
        NodePolicy(pod_sources=STANDALONE_SOURCES, kmod_mode="off", **policy),
        None,
        FakeDevices(),
    )


async def test_compute_boundary_without_module():
    svc = unguarded()
    await svc.lifecycle.create_container(pod("a", {P + "gpu-memory": "1Gi", P + "gpu-core": "95"}))
    with pytest.raises(ShareRefused, match="exceeds the free 5% by 5%"):
        await svc.lifecycle.create_container(
            pod("b", {P + "gpu-memory": "1Gi", P + "gpu-core": "10"})
        )
    await svc.lifecycle.create_container(pod("c", {P + "gpu-memory": "1Gi", P + "gpu-core": "5"}))
    with pytest.raises(ShareRefused, match="exceeds the free 0% by 5%"):
        await svc.lifecycle.create_container(
            pod("d", {P + "gpu-memory": "1Gi", P + "gpu-core": "5"})
        )
    assert svc.status()["gpus"][0]["core_allocated"] == 100


async def test_memory_boundary_without_module():
    svc = unguarded(memory_reserve_bytes=GiB)
    await svc.lifecycle.create_container(pod("a", {P + "gpu-memory": "14Gi"}))
    with pytest.raises(ShareRefused, match="by 1Mi"):
        await svc.lifecycle.create_container(pod("b", {P + "gpu-memory": "1025Mi"}))
    await svc.lifecycle.create_container(pod("c", {P + "gpu-memory": "1Gi"}))
    assert svc.status()["gpus"][0]["memory_free"] == 0


async def test_max_inst_boundary_without_module():
    svc = unguarded(max_inst=2)
    for name in ("a", "b"):
        await svc.lifecycle.create_container(pod(name, {P + "gpu-memory": "1Gi"}))
    with pytest.raises(ShareRefused, match="containers"):
        await svc.lifecycle.create_container(pod("c", {P + "gpu-memory": "1Gi"}))


def test_fits_is_shortfalls_empty() -> None:
    """The search's quick test (`_fits`) agrees with the refusal's reasons
    (`shortfalls`) on every GPU state around each limit."""
    import itertools
    import random

    from nri_gpushare.share.placement import Ledger

    rng = random.Random(7)
    policy = NodePolicy(pod_sources=STANDALONE_SOURCES, max_inst=3, max_high_priority_per_gpu=1)
    ledger = Ledger(make_gpus(1), policy)
    u = ledger.usage[0]
    cap = ledger.capacity(0)
    for _ in range(3000):
        u.memory_bytes = rng.choice([0, cap - 1, cap, cap + 1, rng.randrange(cap)])
        u.core_percent = rng.choice([0, 50, 99, 100, 101])
        u.containers = set(range(rng.randrange(5)))
        u.high_priority = set(itertools.islice(u.containers, rng.randrange(3)))
        memory = rng.choice([0, 1, cap - u.memory_bytes, cap - u.memory_bytes + 1, cap])
        core = rng.choice([0, 1, 100 - u.core_percent, 101 - u.core_percent])
        high = rng.random() < 0.5
        assert ledger._fits(0, memory, core, high) == (not ledger.shortfalls(0, memory, core, high))
