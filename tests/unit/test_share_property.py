"""Property test: random create/stop/remove/restart sequences against the fake module.

Invariants after every step: no GPU over capacity in the domain or in the module,
the module's registrations are exactly the live enforced containers, the ledger
matches the allocations; a refusal changes nothing; a restart (new service,
Synchronize with the live containers) rebuilds the same table; releasing
everything leaves nothing allocated.
"""

import copy

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from nri_gpushare.share.model import ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"
GPUS = make_gpus(3, 4 * GiB)
POLICY = NodePolicy(memory_reserve_bytes=256 << 20, max_inst=3, max_high_priority_per_gpu=1)

memory = st.lists(
    st.sampled_from(["256Mi", "512Mi", "1Gi", "1536Mi", "3Gi"]), min_size=1, max_size=3
)
core = st.one_of(
    st.none(), st.lists(st.sampled_from(["5", "25", "50", "100"]), min_size=1, max_size=3)
)


class ShareMachine(RuleBasedStateMachine):
    containers = Bundle("containers")

    def __init__(self) -> None:
        super().__init__()
        self.kmod = FakeKernelModule(max_inst=POLICY.max_inst)
        self.svc = ShareService(GPUS, POLICY, Inline(self.kmod), FakeDevices())
        done(self.svc.start())
        self.live: dict[str, ContainerInfo] = {}
        self.enforced: set[str] = set()
        self.next_id = 0

    @rule(
        target=containers,
        mem=memory,
        cores=core,
        count=st.one_of(st.none(), st.integers(1, 3)),
        priority=st.sampled_from(["normal", "normal", "high"]),
        isolation=st.sampled_from(["full", "full", "memory", "none"]),
        placement=st.sampled_from(["binpack", "spread"]),
    )
    def create(self, mem, cores, count, priority, isolation, placement):
        self.next_id += 1
        cid = f"c{self.next_id}"
        ann = {
            P + "gpu-memory": ",".join(mem),
            P + "priority": priority,
            P + "isolation": isolation,
            P + "placement": placement,
        }
        if cores is not None and isolation != "memory":
            ann[P + "gpu-core"] = ",".join(cores)
        if count is not None:
            ann[P + "gpu-count"] = str(count)
        c = ContainerInfo(
            id=cid,
            name="main",
            pod_name=f"p{cid}",
            pod_namespace="ns",
            pod_annotations=ann,
            cgroups_path=f"/cg/{cid}",
        )
        before = (copy.deepcopy(self.svc.status()), dict(self.kmod.regs))
        try:
            plan = done(self.svc.lifecycle.create_container(c))
        except ShareRefused as refusal:
            # The plugin must refuse over-commit itself, never lean on the
            # module's backstop (with kmod: off there is none).
            assert refusal.reason != "kmod", refusal
            assert (self.svc.status(), dict(self.kmod.regs)) == before
            return cid
        assert plan is not None
        done(self.svc.lifecycle.start_container(c))
        self.live[cid] = ContainerInfo(
            id=cid,
            name=c.name,
            pod_name=c.pod_name,
            pod_namespace=c.pod_namespace,
            pod_annotations=ann,
            annotations=dict(plan.annotations),
            cgroups_path=c.cgroups_path,
        )
        if isolation != "none":
            self.enforced.add(cid)
        return cid

    @rule(cid=containers)
    def stop(self, cid):
        managed = cid in self.live
        assert done(self.svc.lifecycle.release(cid)) == managed
        self.live.pop(cid, None)  # a stopped container is not reported by Synchronize
        self.enforced.discard(cid)

    @rule(cid=consumes(containers))
    def remove(self, cid):
        self.stop(cid)
        assert done(self.svc.lifecycle.release(cid)) is False

    @rule(reload_module=st.booleans())
    def restart(self, reload_module):
        before = self.svc.status()
        if reload_module:
            self.kmod.unload()
            self.kmod.load()
        self.svc = ShareService(GPUS, POLICY, Inline(self.kmod), FakeDevices(), self.svc.store)
        done(self.svc.recovery.synchronize(list(self.live.values())))
        assert self.svc.status() == before

    @invariant()
    def within_capacity(self):
        for g in self.svc.status()["gpus"]:
            assert g["memory_allocated"] <= g["memory_total"] - POLICY.memory_reserve_bytes
            assert g["core_allocated"] <= 100
            assert len(g["containers"]) <= POLICY.max_inst
            assert len(g["high_priority"]) <= POLICY.max_high_priority_per_gpu
        for index, total in self.kmod.gpus.items():
            used, cores, count = self.kmod.usage(index)
            assert used <= total and cores <= 100 and count <= self.kmod.max_inst

    @invariant()
    def module_matches_live(self):
        assert set(self.kmod.regs) == self.enforced
        assert set(self.svc.registered) == self.enforced
        assert set(self.svc.allocations) == set(self.live)
        for cid in self.enforced:
            assert self.kmod.cgroups.get(cid) == f"/cg/{cid}"

    @invariant()
    def ledger_matches_allocations(self):
        status = self.svc.status()
        for g in status["gpus"]:
            shares = [
                s for a in status["allocations"] for s in a["gpus"] if s["index"] == g["index"]
            ]
            assert g["memory_allocated"] == sum(s["memory"] for s in shares)
            assert g["core_allocated"] == sum(s["core"] for s in shares)

    def teardown(self):
        for cid in list(self.live):
            assert done(self.svc.lifecycle.release(cid))
        status = self.svc.status()
        assert status["allocations"] == []
        assert all(
            g["memory_allocated"] == 0 and g["core_allocated"] == 0 and not g["containers"]
            for g in status["gpus"]
        )
        assert self.kmod.regs == {}


ShareMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_share_property = ShareMachine.TestCase
