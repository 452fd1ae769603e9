"""What the device plugin advertises against what the allocator can place.

The advertised numbers are checked at the unit boundaries (GiB rounding,
memory_reserve, 1 to 8 GPUs), and a kubelet that admits only what is
advertised is driven against the real placement code: on a node with one GPU
nothing it admits is ever refused for capacity, and nothing that fits is kept
out.  On nodes with several GPUs the documented fragmentation case is shown
to exist (docs/kubernetes.md "Fragmentation")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpushare.k8s.capacity import GIB, Device, Grant, advertise, live_ids, memory_units
from nri_gpushare.names import CORE, COUNT, MEMORY
from nri_gpushare.share.ids import format_ids
from nri_gpushare.share.limits import LimitLink
from nri_gpushare.share.model import Allocation, Gpu, NodePolicy, ShareRefused
from nri_gpushare.share.placement import Ledger
from nri_gpushare.share.report import status_document
from nri_gpushare.share.request import ShareRequest

MI = 1 << 20


def gpus(n: int, memory: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", "test", memory, i) for i in range(n)]


class Node:
    """The allocator's books, the status document it gives, and a kubelet
    that admits by the advertised devices and picks the lowest free IDs."""

    def __init__(self, n: int, memory: int, reserve: int = 0, max_inst: int = 16) -> None:
        self.gpus = gpus(n, memory)
        self.policy = NodePolicy(memory_reserve_bytes=reserve, max_inst=max_inst)
        self.ledger = Ledger(self.gpus, self.policy)
        self.allocations: dict[str, Allocation] = {}
        self.ids: dict[str, dict[str, str]] = {}  # container -> its kubelet annotation values
        self.kubelet_held: dict[str, set[int]] = {short: set() for short in (MEMORY, CORE, COUNT)}
        self.pending: list[Grant] = []
        self.serial = 0

    def status(self) -> dict[str, Any]:
        doc = status_document(
            self.gpus,
            self.policy,
            self.ledger,
            self.allocations,
            (),
            {"mode": "off"},
            LimitLink(None),
            {},
        )
        return doc

    def advertised(self, unhealthy: tuple[int, ...] = ()) -> dict[str, tuple[Device, ...]]:
        return advertise(
            self.status(),
            self.gpus,
            self.policy.memory_reserve_bytes,
            self.policy.max_inst,
            self.pending,
            unhealthy,
        )

    def available(self) -> dict[str, list[int]]:
        """What the kubelet can still hand out: healthy and not held by it."""
        return {
            short: [
                int(d.id)
                for d in devices
                if d.healthy and int(d.id) not in self.kubelet_held[short]
            ]
            for short, devices in self.advertised().items()
        }

    def admit(self, memory_gib: int, core: int = 0) -> dict[str, frozenset[int]] | None:
        """The kubelet's admission and Allocate: None when it would not admit."""
        free = self.available()
        asked = {MEMORY: memory_gib, CORE: core}
        if any(len(free[s]) < n for s, n in asked.items()):
            return None
        grants = {s: frozenset(free[s][:n]) for s, n in asked.items() if n}
        for short, ids in grants.items():
            self.kubelet_held[short] |= ids
            self.pending.append(Grant(short, ids))
        return grants

    def create(self, grants: dict[str, frozenset[int]], placement: str = "binpack") -> Allocation:
        """CreateContainer: the NRI plugin places the request (may raise)."""
        memory = len(grants[MEMORY]) * GIB
        core = len(grants.get(CORE, ()))
        req = ShareRequest((memory,), (core,), None, "normal", placement, "full", {})
        self.serial += 1
        cid = f"c{self.serial}"
        shares = self.ledger.place(req, cid)
        kubelet = {s: format_ids(ids) for s, ids in grants.items()}
        alloc = Allocation(cid, cid, "ns/pod", shares, kubelet=kubelet)
        self.ledger.add(alloc)
        self.allocations[cid] = alloc
        self.ids[cid] = {s: format_ids(ids) for s, ids in grants.items()}
        self.pending = [g for g in self.pending if g.ids not in grants.values()]
        return alloc

    def outside(self, memory: int, core: int) -> None:
        """A share asked for without the kubelet (a container started by
        hand), when it fits."""
        self.serial += 1
        cid = f"o{self.serial}"
        req = ShareRequest((memory,), (core,), None, "normal", "binpack", "full", {})
        try:
            shares = self.ledger.place(req, cid)
        except ShareRefused:
            return
        alloc = Allocation(cid, cid, "", shares, origin="runc")
        self.ledger.add(alloc)
        self.allocations[cid] = alloc
        self.ids[cid] = {}

    def remove(self, cid: str) -> None:
        alloc = self.allocations.pop(cid)
        self.ledger.remove(alloc)
        for short, text in self.ids.pop(cid).items():
            self.kubelet_held[short] -= live_ids({"allocations": [{"kubelet": {short: text}}]})[
                short
            ]


def healthy(devices: tuple[Device, ...]) -> int:
    return sum(d.healthy for d in devices)


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize(
    ("memory", "reserve", "units"),
    [
        (16 * GIB, 0, 16),
        (16 * GIB, 1, 15),  # one byte kept back costs a whole GiB
        (16 * GIB, 512 * MI, 15),
        (16 * GIB - 1, 0, 15),
        (15109 * MI, 0, 14),  # a T4: 14.75 GiB is 14, not cGPU's rounded 15
        (80 * GIB, GIB, 79),
        (GIB, 0, 1),
        (GIB, 1, 0),  # nothing to share
    ],
)
def test_units_and_rounding_for_1_to_8_gpus(n: int, memory: int, reserve: int, units: int) -> None:
    assert memory_units(memory, reserve) == units
    node = Node(n, memory, reserve)
    ads = node.advertised()
    assert {s: len(d) for s, d in ads.items()} == {MEMORY: units * n, CORE: 100 * n, COUNT: n}
    room = units >= 1  # a GPU without a whole free GiB takes nobody
    assert {s: healthy(d) for s, d in ads.items()} == {
        MEMORY: units * n,
        CORE: 100 * n if room else 0,
        COUNT: n if room else 0,
    }
    assert [d.id for d in ads[MEMORY]] == [str(i) for i in range(units * n)]


@pytest.mark.parametrize("n", range(1, 9))
def test_a_node_filled_through_the_kubelet_is_exactly_full(n: int) -> None:
    """Every GPU takes 15 one-GiB containers (16Gi, 512Mi reserved); the
    kubelet admits exactly 15 * n and the allocator places every one."""
    node = Node(n, 16 * GIB, 512 * MI)
    placed = 0
    while (grants := node.admit(1, 5)) is not None:
        node.create(grants)
        placed += 1
    assert placed == 15 * n
    assert all(len(v) == 0 for s, v in node.available().items() if s != COUNT)


def test_the_daemon_unreachable_lists_everything_unhealthy() -> None:
    inventory = gpus(2, 16 * GIB)
    ads = advertise(None, inventory, 512 * MI, 16)
    assert {s: len(d) for s, d in ads.items()} == {MEMORY: 30, CORE: 200, COUNT: 2}
    assert not any(d.healthy for devices in ads.values() for d in devices)


def test_an_unhealthy_gpu_takes_its_room_away_but_not_the_ids_in_use() -> None:
    node = Node(2, 16 * GIB)
    grants = node.admit(4, 10)
    assert grants is not None
    node.create(grants)  # binpack: GPU 0
    ads = node.advertised(unhealthy=(1,))
    assert healthy(ads[MEMORY]) == 4 + 12  # held + GPU 0's free
    assert healthy(ads[CORE]) == 10 + 90
    assert healthy(ads[COUNT]) == 1
    assert all(d.healthy for d in ads[MEMORY] if int(d.id) in grants[MEMORY])


def test_shares_asked_another_way_and_max_inst_come_off() -> None:
    node = Node(1, 16 * GIB, max_inst=2)
    outside = Allocation(
        "o1",
        "o1",
        "",
        (
            node.ledger.place(
                ShareRequest((512 * MI,), (20,), None, "normal", "binpack", "full", {}), "o1"
            )
        ),
        origin="runc",
    )
    node.ledger.add(outside)
    node.allocations["o1"] = outside
    free = node.available()
    assert (len(free[MEMORY]), len(free[CORE])) == (15, 80)  # 15.5 GiB free is 15
    grants = node.admit(1)
    assert grants is not None
    assert len(node.available()[MEMORY]) == 0  # max_inst 2: the pending grant takes the last slot
    node.create(grants)
    assert len(node.available()[MEMORY]) == 0


def test_pending_grants_count_until_their_container_is_live() -> None:
    node = Node(1, 16 * GIB)
    grants = node.admit(10)
    assert grants is not None
    assert len(node.available()[MEMORY]) == 6
    node.create(grants)
    assert len(node.available()[MEMORY]) == 6
    # A grant the plugin still keeps after its container showed up counts once.
    node.pending.append(Grant(MEMORY, grants[MEMORY]))
    assert len(node.available()[MEMORY]) == 6


def test_waiting_grants_come_off_the_room_other_shares_left() -> None:
    """8000Mi taken by hand leaves 8 GiB; a grant of 4 waiting for its
    container leaves 4 to admit, not 8."""
    node = Node(1, 16 * GIB)
    node.outside(8000 * MI, 0)
    assert len(node.available()[MEMORY]) == 8
    first = node.admit(4)
    assert first is not None
    assert len(node.available()[MEMORY]) == 4
    assert node.admit(8) is None
    second = node.admit(4)
    assert second is not None
    node.create(second)
    node.create(first)


def test_fragmentation_on_two_gpus_is_possible_and_documented() -> None:
    """16 GiB free in total, 8 on each GPU: the kubelet admits 12 GiB and no
    GPU can take it.  docs/kubernetes.md names this case."""
    node = Node(2, 16 * GIB)
    for _ in range(2):
        grants = node.admit(8)
        assert grants is not None
        node.create(grants, "spread")  # one on each GPU
    assert len(node.available()[MEMORY]) == 16
    grants = node.admit(12)
    assert grants is not None
    with pytest.raises(ShareRefused):
        node.create(grants)


def test_live_ids_skips_what_does_not_parse() -> None:
    doc = {
        "allocations": [
            {"kubelet": {MEMORY: "0-3", CORE: "x", "other": "1"}},
            {"kubelet": "0-3"},
            "junk",
            {"kubelet": {MEMORY: 7}},
            {"kubelet": {COUNT: "0"}},
        ]
    }
    assert live_ids(doc) == {MEMORY: frozenset(range(4)), CORE: frozenset(), COUNT: frozenset({0})}


@settings(max_examples=200, deadline=None)
@given(
    memory_gib=st.integers(1, 24),
    reserve_mi=st.sampled_from([0, 1, 300, 512, 1024, 1500]),
    max_inst=st.integers(1, 6),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("admit"), st.integers(1, 8), st.sampled_from([0, 5, 30, 50, 100])),
            st.tuples(st.just("create"), st.integers(0, 10), st.just(0)),
            st.tuples(st.just("remove"), st.integers(0, 10), st.just(0)),
            st.tuples(st.just("outside"), st.integers(1, 4000), st.sampled_from([0, 10, 25])),
        ),
        max_size=30,
    ),
)
def test_one_gpu_admitted_is_always_placed_and_what_fits_is_admitted(
    memory_gib: int, reserve_mi: int, max_inst: int, steps: list[tuple[str, int, int]]
) -> None:
    """Admission (Allocate) and creation are separate steps, as they are in
    the kubelet (an image pull lies between): whatever was admitted is placed
    when it is created, and with nothing waiting, what fits is admitted.
    Shares asked for another way (MiB sizes, no kubelet IDs) come and go
    while nothing waits (one that comes while a kubelet grant waits can take
    its room: the documented race)."""
    node = Node(1, memory_gib * GIB, reserve_mi * MI, max_inst)
    waiting: list[dict[str, frozenset[int]]] = []
    for op, a, b in steps:
        if op == "remove":
            if node.allocations:
                node.remove(sorted(node.allocations)[a % len(node.allocations)])
        elif op == "outside":
            if not waiting:
                node.outside(a * MI, b)
        elif op == "create":
            if waiting:
                node.create(waiting.pop(a % len(waiting)))  # never refused for capacity
        else:
            req = ShareRequest((a * GIB,), (b,), None, "normal", "binpack", "full", {})
            try:
                node.ledger.place(req, "probe")
                fits = True
            except ShareRefused:
                fits = False
            grants = node.admit(a, b)
            if not waiting:
                assert (grants is not None) == fits, (op, a, b, node.available())
            if grants is not None:
                waiting.append(grants)
    for grants in waiting:
        node.create(grants)
