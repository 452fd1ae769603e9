"""Attack (fixed): the daemon killed (-9) in the middle of a resize, after
the module was written and before the journal line.

After the restart the module's registration wins over the record for the
numbers it holds (the module holds the new quotas), but it used to rebuild
the whole allocation from the registration alone:
- the priority became `any(highprio)` over the GPUs: a multi-GPU share
  killed after GPU 0's highprio write and before GPU 1's was recovered as
  high on both, which differed from the module's registration, so `resync`
  unregistered the running container (its processes' reservations
  orphaned) and registered it again;
- the isolation became "full" (and the interposer flag false): an
  isolation-memory share then accepted `resize --core`, which a new request
  of its kind would be refused.
Now the record keeps what the module does not hold, GPUs that disagree on
priority get the recorded one (written back in place), and a live
registration is never replaced for its numbers."""

from nri_gpushare.share.kernel import GpuQuota
from nri_gpushare.share.records import MemoryStore
from tests.fakes import GiB, done
from tests.unit.test_resize import create, live, refused, service


def test_a_kill_between_the_gpus_of_a_priority_change_unregisters_the_running_container():
    store = MemoryStore()
    svc, kmod = service(store=store)
    c, plan = create(svc, "c1", gpu_memory="2Gi", gpu_count="2")
    kmod.held["c1", 0] = kmod.held["c1", 1] = GiB  # its processes hold memory
    # `resize c1 --priority high`: GPU 0 written, then the daemon is killed.
    q0 = next(q for q in kmod.regs["c1"].quotas if q.gpu_index == 0)
    kmod.update_quota("c1", GpuQuota(0, q0.memory_bytes, q0.core_percent, True))
    kmod.calls.clear()
    svc2, _ = service(kmod=kmod, store=store)
    done(svc2.recovery.synchronize([live(c, plan)]))
    methods = [m for m, arg in kmod.calls if m in ("unregister", "register")]
    assert methods == [], f"a running container was re-registered: {kmod.calls}"
    # One coherent share: the recorded priority (the resize was never answered).
    assert svc2.allocations["c1"].priority == "normal"
    assert [q.high_priority for q in kmod.regs["c1"].quotas] == [False, False]


def test_a_kill_after_the_module_write_keeps_the_shares_isolation():
    store = MemoryStore()
    svc, kmod = service(store=store, gpus=1)
    c, plan = create(svc, "c1", gpu_memory="1Gi", isolation="memory")
    kmod.update_quota("c1", GpuQuota(0, 2 * GiB, 0, False))  # `resize --memory 2Gi`, killed
    svc2, _ = service(kmod=kmod, store=store, gpus=1)
    done(svc2.recovery.synchronize([live(c, plan)]))
    recovered = svc2.allocations["c1"]
    assert recovered.shares[0].memory_bytes == 2 * GiB  # the module's quota wins: right
    assert recovered.isolation == "memory", "isolation memory recovered as full"
    assert refused(svc2, "c1", core="50").reason == "invalid"


async def test_the_same_kill_unregisters_a_hand_started_container_at_recover_local():
    """The same for a container started by hand (gpushare-runc): recover_local
    registers the share again, the module answers EEXIST and the link
    replaces the registration (unregister, register)."""
    from nri_gpushare.daemon.local_api import LocalApiHandler
    from tests.unit.test_local_api import Labels, make
    from tests.unit.test_local_api import create as local_create

    store = MemoryStore()
    svc, kmod = await make(store=store)
    labels = Labels(
        {("default", "c1"): {"gpushare.io/gpu-memory": "2Gi", "gpushare.io/gpu-count": "2"}}
    )
    assert (await LocalApiHandler(svc, labels)(local_create())).ok
    q0 = next(q for q in kmod.regs["c1"].quotas if q.gpu_index == 0)
    kmod.update_quota("c1", GpuQuota(0, q0.memory_bytes, q0.core_percent, True))  # killed here
    kmod.calls.clear()
    again, _ = await make(kmod=kmod, store=store)
    await again.recovery.recover_local()
    methods = [m for m, _ in kmod.calls if m in ("unregister", "register")]
    assert methods == [], f"a running container was re-registered: {methods}"
    assert again.allocations["c1"].priority == "normal"
    assert [q.high_priority for q in kmod.regs["c1"].quotas] == [False, False]
