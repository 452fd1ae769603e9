"""Hostile review of `nri-gpushare resize` (issue 29 part 2): attacks that
the current code holds, kept as regressions.  Hostile values through the
local API's handler and protocol, container references, concurrent resizes
racing for the last room, a resize racing a Synchronize or a cancellation,
and the records after a restart (the resized share rebuilt, the container
still recognised, not unserved).  The attacks that found defects are in the
review's report."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.local import protocol
from nri_gpushare.local.protocol import ProtocolError, Request
from nri_gpushare.share.kernel import GpuQuota
from nri_gpushare.share.model import NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.resize_ask import ResizeAsk
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, Gated, GiB, Inline, done, make_gpus
from tests.unit.test_resize import P, books, create, live, pod, refused, resize, service


def within_capacity(svc, kmod) -> bool:
    for i, u in svc.ledger.usage.items():
        if u.memory_bytes > svc.ledger.capacity(i) or u.core_percent > 100:
            return False
        memory, core, _ = kmod.usage(i)
        if memory > kmod.gpus[i] or core > 100:
            return False
    return True


# -- hostile values ----------------------------------------------------------------------------

HOSTILE_MEMORY = [
    "-1Gi",
    "-0",
    "nan",
    "NaN",
    "inf",
    "1e9",
    "0x10",
    "\uff11Gi",  # fullwidth 1: int() would take it
    "\u00b2Gi",  # superscript 2: str.isdigit() would take it
    "1Gi\u200b",  # a zero-width space
    "1\u0660Gi",  # Arabic-Indic zero
    "1" * 70,
    "1.0000000001Ki",  # not a whole number of bytes
    "0",
    "0,0",
    ",",
    " ",
    "1Gi,,1Gi",
    ",".join(["1Gi"] * 65),
    "1Gi;rm -rf /",
    "1Gi\n2Gi",
]


@pytest.mark.parametrize("memory", HOSTILE_MEMORY)
def test_hostile_memory_values_are_refused_and_change_nothing(memory):
    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    before = books(svc, kmod)
    e = refused(svc, "c1", memory=memory)
    assert e.reason == "invalid", str(e)
    assert books(svc, kmod) == before
    assert not [m for m, _ in kmod.calls if m == "update_quota"]
    assert "\n" not in str(e) and "\x1b" not in str(e)


@pytest.mark.parametrize(
    "memory", ["999999999999999999Ei", "99999999999999999999Gi", "17Gi", "1,20Gi"]
)
def test_sizes_past_the_gpu_are_capacity_refusals_whatever_their_magnitude(memory):
    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi")
    before = books(svc, kmod)
    e = refused(svc, "c1", memory=memory)
    assert e.reason in ("capacity", "invalid"), str(e)
    assert books(svc, kmod) == before


@pytest.mark.parametrize(
    "core", ["-5", "0", "5.0", "1e2", "+50", "\uff15\uff10", "105", "50,55,60", "nan", "50 50"]
)
def test_hostile_core_values_are_refused(core):
    svc, kmod = service(gpus=2)
    create(svc, "c1", gpu_memory="1Gi", gpu_core="30", gpu_count="2")
    before = books(svc, kmod)
    assert refused(svc, "c1", core=core).reason == "invalid"
    assert books(svc, kmod) == before


@pytest.mark.parametrize("priority", ["urgent", "h\u0456gh", "hi gh", "highest", "1", "true"])
def test_hostile_priorities_are_refused(priority):
    svc, kmod = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi")
    before = books(svc, kmod)
    assert refused(svc, "c1", priority=priority).reason == "invalid"
    assert books(svc, kmod) == before


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ({"id": "\x1b]0;pwned\x07", "memory": "1Gi"}, "id: not a container ID"),
        ({"id": "c1\n", "memory": "1Gi"}, "id: not a container ID"),
        ({"id": "x" * 1025, "memory": "1Gi"}, "id: not a container ID"),
        ({"id": "", "memory": "1Gi"}, "id: missing"),
        ({"id": "c1", "memory": 1 << 40}, "memory: not a string"),
        ({"id": "c1", "memory": ["1Gi"]}, "memory: not a string"),
        ({"id": "c1", "core": 50}, "core: not a string"),
        ({"id": "c1", "priority": None}, "priority: not a string"),
        ({"id": "c1", "memory": "1" * 1025}, "at most 1024 characters"),
        ({"id": "c1"}, "give memory, core or priority"),
        ({"id": "c1", "memory": "1Gi", "v": 2}, "protocol version"),
        ({"id": "c1", "memory": "1Gi", "v": True}, "protocol version"),
    ],
)
def test_hostile_resize_messages_are_protocol_errors(obj, says):
    with pytest.raises(ProtocolError, match=says):
        protocol.decode_request(json.dumps({"v": 1, "op": "resize", **obj}).encode())


async def test_the_handler_answers_every_hostile_value_without_an_internal_error():
    kmod = FakeKernelModule()
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), Inline(kmod), FakeDevices())
    await svc.start()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi"}))
    handler = LocalApiHandler(svc, None)
    for memory in HOSTILE_MEMORY:
        reply = await handler(Request("resize", "", "c1", memory=memory))
        assert not reply.ok and reply.reason == "invalid", (memory, reply)
        protocol.encode_reply(reply)  # a reply that can be sent
    assert svc.allocations["c1"].shares[0].memory_bytes == GiB


# -- which container -----------------------------------------------------------------------------


def test_references_that_name_no_container_or_several_change_nothing():
    svc, kmod = service(gpus=1)
    create(svc, "abc111", gpu_memory="1Gi")
    create(svc, "abc222", gpu_memory="1Gi")
    before = books(svc, kmod)
    for ref in ("abc", "a", "ns", "ns/", "/main", "main", "ns/pod-abc111", "../abc111", "*", " "):
        e = refused(svc, ref, memory="2Gi")
        assert e.reason == "invalid", (ref, str(e))
    assert books(svc, kmod) == before


def test_an_exact_id_wins_over_a_longer_id_it_prefixes():
    svc, _ = service(gpus=1)
    create(svc, "abc", gpu_memory="1Gi")
    create(svc, "abcdef", gpu_memory="1Gi")
    assert resize(svc, "abc", memory="2Gi")[0].container_id == "abc"
    assert svc.allocations["abcdef"].shares[0].memory_bytes == GiB


# -- races ----------------------------------------------------------------------------------------


async def test_two_containers_growing_into_the_last_room_at_once_never_over_commit():
    kmod = FakeKernelModule()
    gated = Gated(kmod)
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), gated, FakeDevices())
    await svc.start()
    for cid in ("c1", "c2"):
        await svc.lifecycle.create_container(
            pod(cid, {P + "gpu-memory": "4Gi", P + "gpu-core": "30"})
        )
    # 8Gi and 40% left: each asks for all of it.
    first = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="12Gi", core="70")))
    await asyncio.sleep(0)
    with pytest.raises(ShareRefused) as info:
        await svc.resizer.resize("c2", ResizeAsk(memory="12Gi"))
    assert info.value.reason == "capacity"
    with pytest.raises(ShareRefused, match="core 70% exceeds"):
        await svc.resizer.resize("c2", ResizeAsk(core="70"))
    gated.gate.set()
    assert (await first)[1]
    assert within_capacity(svc, kmod)
    assert svc.ledger.usage[0].memory_bytes == 16 * GiB


async def test_a_grow_refused_by_the_module_frees_its_room_for_the_next():
    kmod = FakeKernelModule()
    gated = Gated(kmod)
    svc = ShareService(make_gpus(1, 16 * GiB), NodePolicy(), gated, FakeDevices())
    await svc.start()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "4Gi"}))
    kmod.fail_next["update_quota"] = __import__(
        "nri_gpushare.share.kernel", fromlist=["OverCommitted"]
    ).OverCommitted("orphaned memory")
    grow = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="16Gi")))
    await asyncio.sleep(0)
    with pytest.raises(ShareRefused, match="capacity|exceeds"):
        await svc.lifecycle.create_container(pod("c2", {P + "gpu-memory": "1Gi"}))
    gated.gate.set()
    with pytest.raises(ShareRefused, match="no room"):
        await grow
    await svc.lifecycle.create_container(pod("c2", {P + "gpu-memory": "12Gi"}))
    assert within_capacity(svc, kmod)


async def test_a_cancelled_resize_changes_the_module_back():
    kmod = FakeKernelModule()
    gated = Gated(kmod)
    svc = ShareService(make_gpus(2, 16 * GiB), NodePolicy(), gated, FakeDevices())
    await svc.start()
    await svc.lifecycle.create_container(pod("c1", {P + "gpu-memory": "1Gi", P + "gpu-count": "2"}))
    before = {q.gpu_index: q for q in kmod.regs["c1"].quotas}
    task = asyncio.create_task(svc.resizer.resize("c1", ResizeAsk(memory="4Gi")))
    await asyncio.sleep(0)
    task.cancel()
    gated.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert {q.gpu_index: q for q in kmod.regs["c1"].quotas} == before
    assert svc.allocations["c1"].shares[0].memory_bytes == GiB
    assert sum(u.memory_bytes for u in svc.ledger.usage.values()) == 2 * GiB


# -- restarts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("module_kept", [True, False])
def test_resized_twice_and_back_a_restart_still_recognises_the_container(module_kept):
    store = MemoryStore()
    svc, kmod = service(store=store, gpus=1)
    c, plan = create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    resize(svc, "c1", memory="3Gi", core="50")
    resize(svc, "c1", memory="2Gi", priority="high")
    for last in ({"memory": "2Gi"}, {"memory": "1Gi", "core": "30", "priority": "normal"}):
        resize(svc, "c1", **last)
        want = svc.allocations["c1"]
        kmod2 = kmod if module_kept else FakeKernelModule()
        svc2, _ = service(kmod=kmod2, store=store, gpus=1)
        done(svc2.recovery.synchronize([live(c, plan)]))
        got = svc2.allocations.get("c1")
        assert got is not None and (got.shares, got.priority) == (want.shares, want.priority)
        assert svc2.unserved == {}
        assert [m for m, a in kmod2.calls if m == "unregister"] == []


def test_a_kill_after_the_module_write_of_a_single_gpu_share_is_recovered_from_the_module():
    store = MemoryStore()
    svc, kmod = service(store=store, gpus=1)
    c, plan = create(svc, "c1", gpu_memory="1Gi", gpu_core="30")
    kmod.update_quota("c1", GpuQuota(0, 3 * GiB, 50, True))  # written; journal not: killed
    kmod.calls.clear()
    svc2, _ = service(kmod=kmod, store=store, gpus=1)
    done(svc2.recovery.synchronize([live(c, plan)]))
    got = svc2.allocations["c1"]
    assert (got.shares[0].memory_bytes, got.shares[0].core_percent, got.priority) == (
        3 * GiB,
        50,
        "high",
    )
    assert svc2.ledger.usage[0].memory_bytes == 3 * GiB
    assert [m for m, _ in kmod.calls if m in ("register", "unregister")] == []
    # It can be resized again, from what it now holds.
    assert resize(svc2, "c1", memory="1Gi")[1]


def test_a_refused_resize_leaves_the_records_as_they_were():
    store = MemoryStore()
    svc, kmod = service(store=store, gpus=1)
    create(svc, "c1", gpu_memory="2Gi")
    kmod.held["c1", 0] = 2 * GiB
    text = store.load()
    refused(svc, "c1", memory="1Gi")
    refused(svc, "c1", memory="99Gi")
    refused(svc, "c1", memory="nan")
    assert store.load() == text


def test_a_reference_cannot_forge_fields_of_the_decision_line(caplog):
    import logging

    svc, _ = service(gpus=1)
    create(svc, "c1", gpu_memory="1Gi")
    ref = 'x reason=forbidden container=c1 decision=resized "'
    with caplog.at_level(logging.INFO, logger="nri_gpushare.decisions"):
        refused(svc, ref, memory="2Gi")
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith('decision=refused container="x reason=forbidden container=c1 ')
    assert line.count(" reason=invalid_request ") == 1 and "operation=resize" in line
