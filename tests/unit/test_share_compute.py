"""Status: each container's compute target next to the share of the GPU it
got over the last minute, from the GPU time the kernel module charged it
(sampled with a fake clock from a fake procfs), and the procfs readers."""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.kmod.procfs import ProcfsKernelModule
from nri_gpushare.share.kernel import (
    GpuQuota,
    GpusNotDeclared,
    KmodError,
    ModuleNotLoaded,
    NotRegistered,
)
from nri_gpushare.share.model import (
    STANDALONE_SOURCES,
    Allocation,
    ContainerInfo,
    GpuShare,
    InterposerPolicy,
    NodePolicy,
)
from nri_gpushare.share.report import compute_rule
from nri_gpushare.share.service import ShareService
from nri_gpushare.share.usage import (
    ComputeMeter,
    ComputeUse,
    GpuTimeRead,
    ModuleGpuTime,
    SchedState,
)
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"
S = 1_000_000_000  # ns per second
NO_READ = GpuTimeRead({})


# -- the meter: rates from counter samples ---------------------------------------------


def feed(meter: ComputeMeter, owner: object, samples: list[tuple[float, int | str]]) -> None:
    for now, value in samples:
        meter.record(now, {(0, "a"): (owner, value)}, NO_READ)


def test_rate_over_the_time_since_the_first_sample_until_a_minute_is_there() -> None:
    meter, owner = ComputeMeter(), object()
    assert meter.use((0, "a")) == ComputeUse(None, None, "unknown: no sample yet")
    feed(meter, owner, [(100.0, 7 * S)])
    assert meter.use((0, "a")).used_pct is None
    assert "one sample" in str(meter.use((0, "a")).why)
    # 30 % of the GPU for 20 s: 6 s of GPU time.
    feed(meter, owner, [(105.0, 8_500_000_000), (120.0, 13 * S)])
    assert meter.use((0, "a")) == ComputeUse(30.0, 20.0)


def test_rate_at_the_window_boundaries() -> None:
    meter, owner = ComputeMeter(window_s=60.0), object()
    # 10 % of the GPU, sampled every 5 s from t = 0 to 60: 0.5 s of GPU time each.
    feed(meter, owner, [(5.0 * i, i * S // 2) for i in range(13)])
    # The sample exactly a minute old starts the window: 6 s of 60.
    assert meter.use((0, "a")) == ComputeUse(10.0, 60.0)
    # Then 50 % for 5 s: t = 0 leaves, the window is 5..65: (8.5 - 0.5) s of 60.
    feed(meter, owner, [(65.0, 8_500_000_000)])
    assert meter.use((0, "a")) == ComputeUse(13.3, 60.0)
    # A late sample (jitter): the window starts at the newest sample at least a
    # minute old (t = 10, 1 s), so it is a little longer, and says so.
    feed(meter, owner, [(70.5, 11_250_000_000)])
    assert meter.use((0, "a")) == ComputeUse(round(10.25 / 60.5 * 100, 1), 60.5)


def test_a_counter_that_goes_down_restarts_the_window_never_a_negative_rate() -> None:
    meter, owner = ComputeMeter(), object()
    feed(meter, owner, [(0.0, 50 * S), (10.0, 55 * S), (20.0, S)])  # registered again
    assert meter.use((0, "a")).used_pct is None  # one sample since the restart
    feed(meter, owner, [(30.0, 3 * S)])
    assert meter.use((0, "a")) == ComputeUse(20.0, 10.0)
    # Wrapped (or any decrease): the same.
    feed(meter, owner, [(40.0, 2**64 - S), (50.0, 5)])
    assert meter.use((0, "a")).used_pct is None
    # A clock that went back (a fake or a reset one) is no negative window either.
    feed(meter, owner, [(60.0, 10), (55.0, 20)])
    assert meter.use((0, "a")).used_pct is None


def test_another_owner_starts_afresh_and_keys_left_out_are_forgotten() -> None:
    meter, first, second = ComputeMeter(), object(), object()
    feed(meter, first, [(0.0, 0), (10.0, 5 * S)])
    assert meter.use((0, "a")).used_pct == 50.0
    # Released and created again with the same ID, its counter already past the old one.
    feed(meter, second, [(15.0, 6 * S)])
    assert meter.use((0, "a")).used_pct is None
    meter.record(20.0, {(1, "b"): (second, 0)}, NO_READ)
    assert len(meter) == 1 and meter.use((0, "a")).why == "unknown: no sample yet"


def test_an_unreadable_counter_says_why_and_forgets_the_samples() -> None:
    meter, owner = ComputeMeter(), object()
    feed(meter, owner, [(0.0, 0), (10.0, 5 * S)])
    feed(meter, owner, [(15.0, "unknown: gpushare.ko is not loaded")])
    assert meter.use((0, "a")) == ComputeUse(None, None, "unknown: gpushare.ko is not loaded")
    feed(meter, owner, [(20.0, 0), (30.0, S)])  # reloaded: the counter starts at 0 again
    assert meter.use((0, "a")) == ComputeUse(10.0, 10.0)


def test_samples_stay_bounded_whatever_the_clock_does() -> None:
    meter, owner = ComputeMeter(), object()
    feed(meter, owner, [(1.0, i) for i in range(1000)])
    assert len(meter._windows[0, "a"].samples) <= 256


# -- the service: what is sampled, what status says ------------------------------------


@dataclass
class State:
    policy: int = 3
    prio_ratio: int = 80
    max_inst: int = 16


class FakeProcfs:
    """The procfs client's compute readers over a dict (ns per (gpu, cid))."""

    def __init__(self, policy: int = 3) -> None:
        self.gputimes: dict[tuple[int, str], int | None] = {}
        self.state = State(policy)
        self.loaded = True
        self.reads: list[tuple[int, str]] = []

    def gputime(self, gpu: int, container_id: str) -> int | None:
        self.reads.append((gpu, container_id))
        if not self.loaded:
            raise ModuleNotLoaded("gpushare.ko is not loaded")
        try:
            return self.gputimes[gpu, container_id]
        except KeyError:
            raise NotRegistered(f"{container_id}: not registered") from None

    def gpu_state(self, gpu: int) -> State:
        return self.state

    def slice_us(self, gpu: int) -> int:
        return 10_000

    def drain_us(self, gpu: int) -> int:
        return 100_000

    def forced_ends(self, gpu: int) -> int:
        return 2


def ctr(cid: str, env: dict[str, str] | None = None, **keys: str) -> ContainerInfo:
    annotations = {P + k.replace("_", "-"): v for k, v in keys.items()}
    return ContainerInfo(
        id=cid,
        name=cid,
        pod_name=cid,
        pod_namespace="ns",
        pod_uid=cid,
        pod_annotations=annotations,
        env=env or {},
    )


class Setup:
    def __init__(self, kmod: FakeKernelModule | None = None, kmod_mode: str = "optional"):
        self.procfs = FakeProcfs()
        self.source = ModuleGpuTime(self.procfs, BlockingWorker("test-gputime"))
        self.kmod = kmod if kmod is not None else FakeKernelModule()
        policy = NodePolicy(
            pod_sources=STANDALONE_SOURCES,
            kmod_mode=kmod_mode,
            interposer=InterposerPolicy(preload_file="/state/ld.so.preload"),
        )
        self.svc = ShareService(
            make_gpus(2, 16 * GiB),
            policy,
            Inline(self.kmod) if kmod_mode != "off" else None,
            FakeDevices(),
            library_check=lambda path: "",
            gputime=self.source,
        )
        done(self.svc.start())

    def shares(self, cid: str) -> list[dict[str, object]]:
        entry = next(a for a in self.svc.status()["allocations"] if a["container_id"] == cid)
        return list(entry["gpus"])

    def close(self) -> None:
        self.source.close()


@pytest.fixture
def setup():
    s = Setup()
    yield s
    s.close()


async def test_status_shows_target_and_used_over_the_last_minute(setup: Setup) -> None:
    svc, procfs = setup.svc, setup.procfs
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    [share] = setup.shares("a")
    assert (share["compute_target"], share["compute_used_pct"]) == (30, None)
    assert share["compute_used_why"] == "unknown: no sample yet"
    for t, used in ((0.0, 0), (30.0, 9 * S), (60.0, 17_760_000_000)):
        procfs.gputimes[0, "a"] = used
        await svc.sample_compute(now=t)
    [share] = setup.shares("a")
    assert share["compute_used_pct"] == 29.6 and share["compute_window_s"] == 60.0
    assert share["compute_used_why"] is None
    assert share["compute_policy"] == 3
    assert share["compute_rule"] == "policy 3 (fixed share): 30% of the GPU, never more"
    gpu0 = svc.status()["gpus"][0]
    assert (gpu0["policy"], gpu0["prio_ratio"], gpu0["slice_us"]) == (3, 80, 10_000)
    assert (gpu0["drain_us"], gpu0["forced_ends"]) == (100_000, 2)
    assert svc.status()["gpus"][1]["policy"] is None  # nothing registered there: not read
    # The existing keys are all still there.
    assert {"memory_used", "memory_used_why", "processes", "core", "nvml_limit"} <= set(share)


async def test_registered_shares_are_read_except_isolation_none(setup: Setup) -> None:
    """isolation memory is registered with weight 0 and scheduled as best effort
    (the interposer gates it in module mode), so its GPU time is measured too."""
    svc, procfs = setup.svc, setup.procfs
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    await svc.lifecycle.create_container(ctr("m", gpu_memory="1Gi", isolation="memory"))
    await svc.lifecycle.create_container(ctr("n", gpu_memory="1Gi", isolation="none"))
    await svc.lifecycle.create_container(ctr("b", gpu_memory="1Gi"))  # no gpu-core: best effort
    procfs.gputimes.update({(0, "a"): 0, (0, "b"): 0, (0, "m"): 0})
    await svc.sample_compute(now=0.0)
    assert sorted(procfs.reads) == [(0, "a"), (0, "b"), (0, "m")]
    [m] = setup.shares("m")
    assert m["compute_target"] is None and "best effort" in str(m["compute_rule"])
    assert m["compute_used_why"] == "unknown: one sample so far (a rate needs two)"
    [n] = setup.shares("n")
    assert n["compute_used_why"] == "unknown: isolation none does not schedule compute"
    [b] = setup.shares("b")
    assert b["compute_target"] is None and "best effort" in str(b["compute_rule"])
    assert b["compute_used_why"] == "unknown: one sample so far (a rate needs two)"


async def test_released_and_created_again_with_the_same_id_starts_afresh(setup: Setup) -> None:
    svc, procfs = setup.svc, setup.procfs
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    procfs.gputimes[0, "a"] = 0
    await svc.sample_compute(now=0.0)
    procfs.gputimes[0, "a"] = 3 * S
    await svc.sample_compute(now=10.0)
    assert setup.shares("a")[0]["compute_used_pct"] == 30.0
    await svc.lifecycle.release("a")
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    # Between two samples: the new registration's counter is already past the old one.
    procfs.gputimes[0, "a"] = 4 * S
    await svc.sample_compute(now=15.0)
    [share] = setup.shares("a")
    assert share["compute_used_pct"] is None and "one sample" in str(share["compute_used_why"])
    await svc.lifecycle.release("a")
    await svc.sample_compute(now=20.0)
    assert len(svc.compute) == 0  # a removed container's samples are forgotten


async def test_module_unloaded_then_reloaded(setup: Setup) -> None:
    svc, procfs = setup.svc, setup.procfs
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    procfs.gputimes[0, "a"] = 40 * S
    await svc.sample_compute(now=0.0)
    await svc.sample_compute(now=5.0)
    procfs.loaded = False
    await svc.sample_compute(now=10.0)
    [share] = setup.shares("a")
    assert share["compute_used_pct"] is None
    assert share["compute_used_why"] == "unknown: gputime unreadable (gpushare.ko is not loaded)"
    procfs.loaded = True
    procfs.gputimes[0, "a"] = 0  # registered again: its counter restarted
    await svc.sample_compute(now=15.0)
    procfs.gputimes[0, "a"] = S
    await svc.sample_compute(now=20.0)
    assert setup.shares("a")[0]["compute_used_pct"] == 20.0


async def test_an_older_module_without_gputime_is_unknown_not_an_error(setup: Setup) -> None:
    svc, procfs = setup.svc, setup.procfs
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
    procfs.gputimes[0, "a"] = None
    await svc.sample_compute(now=0.0)
    [share] = setup.shares("a")
    assert "does not measure GPU time (an older module)" in str(share["compute_used_why"])


async def test_standalone_and_unregistered_shares_say_why() -> None:
    setup = Setup(FakeKernelModule(loaded=False))
    try:
        await setup.svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
        await setup.svc.sample_compute(now=0.0)
        assert setup.procfs.reads == []
        [share] = setup.shares("a")
        assert share["compute_target"] == 30 and share["compute_policy"] is None
        assert share["compute_rule"].startswith("standalone: the interposer holds each process")
        assert share["compute_used_why"].startswith("unknown: standalone")
        await setup.svc.lifecycle.create_container(ctr("b", gpu_memory="1Gi"))
        [b] = setup.shares("b")
        assert b["compute_used_why"] == "unknown: not registered (the kernel module is not loaded)"
        assert b["compute_target"] is None
    finally:
        setup.close()


async def test_a_failing_reader_still_lets_status_answer() -> None:
    class Broken:
        async def read(self, wanted):
            raise RuntimeError("bug")

    setup = Setup()
    setup.svc.gputime = Broken()
    try:
        await setup.svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi", gpu_core="30"))
        await setup.svc.sample_compute(now=0.0)
        assert setup.shares("a")[0]["compute_used_why"] == "unknown: RuntimeError"
    finally:
        setup.close()


async def test_a_stuck_module_times_out_and_a_client_without_gputime_says_so() -> None:
    source = ModuleGpuTime(object(), BlockingWorker("test-gputime"))
    read = await source.read([(0, "a")])
    assert "cannot read gputime" in str(read.gputime[0, "a"])
    source.close()

    class Stuck(FakeProcfs):
        def gputime(self, gpu, container_id):
            import time

            time.sleep(0.3)
            return 0

    source = ModuleGpuTime(Stuck(), BlockingWorker("test-gputime", timeout=0.05))
    try:
        read = await source.read([(0, "a")])
        assert "did not answer" in str(read.gputime[0, "a"])
    finally:
        source.close()


def test_policy_rules() -> None:
    def rule(policy: int, core: int = 30, priority: str = "normal") -> str:
        alloc = Allocation("a", "a", "", (GpuShare(0, "GPU-0", GiB, core),), priority)
        got, text = compute_rule(alloc, core, True, SchedState(policy, 70))
        assert got == policy
        return text

    assert "1/max_inst of the GPU, used or not" in rule(0)
    assert "an equal share among the containers using the GPU" in rule(1)
    assert "weight 30 against the other containers using the GPU; alone, the whole" in rule(2)
    assert rule(3) == "policy 3 (fixed share): 30% of the GPU, never more"
    assert "goes to any container waiting" in rule(4)
    assert "not scheduled" in rule(5)
    assert "best effort" in rule(2, core=0) and "best effort" in rule(3, core=0)
    assert rule(2, priority="high").endswith("served first, at most 70% while others wait")
    alloc = Allocation("a", "a", "", (GpuShare(0, "GPU-0", GiB, 30),))
    assert compute_rule(alloc, 30, True, None) == (
        None,
        "scheduled by the kernel module; its policy is not read yet",
    )


# -- gpu-core, priority and cGPU's variables reach the module's registration ---------


@pytest.mark.parametrize(
    ("container", "quota"),
    [
        (
            ctr("a", gpu_memory="2Gi", gpu_core="30", priority="high"),
            GpuQuota(0, 2 * GiB, 30, True),
        ),
        (ctr("a", gpu_memory="2Gi", gpu_core="45"), GpuQuota(0, 2 * GiB, 45, False)),
        (
            ContainerInfo(
                id="a",
                name="a",
                env={
                    "ALIYUN_COM_GPU_MEM_CONTAINER": "2",
                    "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0",
                    "ALIYUN_COM_GPU_SCHD_WEIGHT": "4",
                    "ALIYUN_COM_GPU_HIGH_PRIO": "1",
                },
            ),
            GpuQuota(0, 2 * GiB, 25, True),  # weight 4 of max_inst 16
        ),
    ],
)
async def test_core_and_priority_reach_the_registration(container, quota) -> None:
    setup = Setup()
    try:
        await setup.svc.lifecycle.create_container(container)
        assert setup.kmod.regs["a"].quotas == (quota,)
    finally:
        setup.close()


def test_procfs_register_writes_weight_and_highprio(tmp_path: Path) -> None:
    from nri_gpushare.share.kernel import Registration

    (tmp_path / "inst_ctl").write_text("")
    ProcfsKernelModule(tmp_path).register(
        Registration("c1", (GpuQuota(0, GiB, 30, True), GpuQuota(2, GiB, 0, False)))
    )
    assert (tmp_path / "inst_ctl").read_text() == f"add c1 0:{GiB}:30:1,2:{GiB}:0:0\n"


# -- the procfs readers --------------------------------------------------------------


def tree(tmp_path: Path) -> ProcfsKernelModule:
    (tmp_path / "inst_ctl").write_text("")
    (tmp_path / "0" / "c1").mkdir(parents=True)
    (tmp_path / "0" / "c1" / "gputime").write_text("123456789\n")
    (tmp_path / "0" / "slice_us").write_text("10000\n")
    (tmp_path / "0" / "drain_us").write_text("100000\n")
    (tmp_path / "0" / "forced_ends").write_text("3\n")
    # An older module: no gputime, no slice_us, no drain_us nor forced_ends.
    (tmp_path / "1" / "c1").mkdir(parents=True)
    return ProcfsKernelModule(tmp_path)


def test_procfs_reads_gputime_and_slice(tmp_path: Path) -> None:
    kmod = tree(tmp_path)
    assert kmod.gputime(0, "c1") == 123456789
    assert kmod.slice_us(0) == 10_000
    assert kmod.gputime(1, "c1") is None and kmod.slice_us(1) is None
    assert (kmod.drain_us(0), kmod.forced_ends(0)) == (100_000, 3)
    assert kmod.drain_us(1) is None and kmod.forced_ends(1) is None
    with pytest.raises(NotRegistered):
        kmod.gputime(0, "c2")
    with pytest.raises(GpusNotDeclared):
        kmod.slice_us(3)
    with pytest.raises(GpusNotDeclared):
        kmod.drain_us(3)
    with pytest.raises(GpusNotDeclared):
        kmod.forced_ends(3)
    (tmp_path / "0" / "forced_ends").write_text("-1\n")
    with pytest.raises(KmodError) as e:
        kmod.forced_ends(0)
    assert e.value.errno == errno.EPROTO
    with pytest.raises(KmodError) as e:
        kmod.gputime(0, "../x")
    assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("bad", ["", "-1\n", "1.5\n", "12 ns\n", "007\n"])
def test_procfs_gputime_is_strict(tmp_path: Path, bad: str) -> None:
    kmod = tree(tmp_path)
    (tmp_path / "0" / "c1" / "gputime").write_text(bad)
    with pytest.raises(KmodError) as e:
        kmod.gputime(0, "c1")
    assert e.value.errno == errno.EPROTO


def test_procfs_readers_without_the_module(tmp_path: Path) -> None:
    kmod = ProcfsKernelModule(tmp_path / "missing")
    with pytest.raises(ModuleNotLoaded):
        kmod.gputime(0, "c1")
    with pytest.raises(ModuleNotLoaded):
        kmod.slice_us(0)
    with pytest.raises(ModuleNotLoaded):
        kmod.drain_us(0)


async def test_module_gputime_over_the_real_procfs_client(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    for name, value in (
        ("total_memsize", GiB),
        ("free_memsize", GiB),
        ("free_weight", 70),
        ("nr_inst", 1),
        ("max_inst", 16),
        ("policy", 2),
        ("prio_ratio", 80),
    ):
        (tmp_path / "0" / name).write_text(f"{value}\n")
    source = ModuleGpuTime(tree(tmp_path), BlockingWorker("test-gputime"))
    try:
        read = await source.read([(0, "c1"), (1, "c1")])
    finally:
        source.close()
    assert read.gputime[0, "c1"] == 123456789
    assert "older module" in str(read.gputime[1, "c1"])
    assert read.gpus[0] == SchedState(2, 80, 16, 10_000, 100_000, 3)
    assert read.gpus[1] == SchedState()  # its state is not readable: unknown


# -- the daemon's sampler and the text view ------------------------------------------


async def test_the_daemon_samples_periodically_and_survives_a_failing_pass() -> None:
    from nri_gpushare.daemon.main import sample_compute

    class Link:
        async def catch_up(self) -> None:
            raise RuntimeError("a failing catch-up does not stop the sampling")

    class Service:
        calls = 0
        link = Link()

        async def sample_compute(self) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("one bad pass")

    svc = Service()
    task = asyncio.create_task(sample_compute(svc, every=0.001))  # type: ignore[arg-type]
    async with asyncio.timeout(30):  # a broken loop fails here instead of hanging the suite
        while svc.calls < 3:
            await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


def test_gputime_reader_is_off_with_kmod_off() -> None:
    from nri_gpushare.config import Config
    from nri_gpushare.daemon.main import gputime_reader

    assert gputime_reader(Config(kmod="off")) is None
    reader = gputime_reader(Config(kmod="optional"))
    assert isinstance(reader, ModuleGpuTime)
    reader.close()


def test_status_text_shows_target_next_to_used(capsys) -> None:
    from nri_gpushare.cli.main import _print_status

    share = {"index": 0, "uuid": "GPU-a", "memory": GiB, "core": 30, "processes": 1}
    share |= {"memory_used": 0, "memory_used_why": ""}
    known = {
        "compute_target": 30,
        "compute_policy": 3,
        "compute_rule": "policy 3 (fixed share): 30% of the GPU, never more",
        "compute_used_pct": 29.6,
        "compute_window_s": 60.0,
        "compute_used_why": None,
    }
    standalone = {
        "compute_target": 30,
        "compute_policy": None,
        "compute_rule": "standalone: the interposer holds each process to 30% of the GPU",
        "compute_used_pct": None,
        "compute_window_s": None,
        "compute_used_why": "unknown: standalone (...)",
    }
    gpu = {
        "index": 0,
        "uuid": "GPU-a",
        "name": "H100",
        "memory_allocated": GiB,
        "memory_free": GiB,
        "memory_total": 2 * GiB,
        "core_allocated": 30,
        "containers": ["a"],
        "policy": 3,
        "slice_us": 10_000,
        "drain_us": 100_000,
        "prio_ratio": 80,
        "forced_ends": 1,
    }
    alloc = {"pod": "ns/x", "priority": "normal", "guards": [], "unguarded": {}}
    _print_status(
        {
            "kmod": {"mode": "optional", "loaded": True, "problem": ""},
            "gpus": [gpu],
            "allocations": [
                {**alloc, "container_id": "a", "gpus": [{**share, **known}]},
                {**alloc, "container_id": "b", "gpus": [{**share, **standalone}]},
                {**alloc, "container_id": "old", "gpus": [share]},  # an older plugin's status
            ],
        }
    )
    out = capsys.readouterr().out
    gpu_line = "policy 3 (fixed share), slice 10 ms, drain 100 ms, prio_ratio 80%, 1 forced end\n"
    assert gpu_line in out
    assert "a GPU 0: compute 30% target (policy 3 fixed share), 29.6% used (60 s)" in out
    assert "b GPU 0: compute 30% target (standalone), used unknown: standalone (...)" in out
    assert "old GPU 0: compute" not in out
