"""Driver-native memory limits: the NVML adapter against a fake pynvml (with
the real nvidia-ml-py structures), and the share service setting and
clearing them over a container's life."""

import asyncio
import threading

import pynvml
import pytest

from nri_gpushare.host.driver_limits import LIMIT_MAX, NvmlMemoryLimits
from nri_gpushare.share.limits import LimitError
from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, NodePolicy
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, done, make_gpus

P = "gpushare.io/"
GPUS = make_gpus(2, 16 * GiB)


def test_installed_nvidia_ml_py_has_the_calls_and_fields_we_use():
    for name in ("nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"):
        assert callable(getattr(pynvml, name))
    fields = [f[0] for f in pynvml.c_nvmlSetMemoryLimits_v1_t._fields_]
    assert fields == ["nameSpace", "softLimit", "hardLimit"]
    fields = [f[0] for f in pynvml.c_nvmlGetMemoryLimits_v1_t._fields_]
    assert fields == ["nameSpace", "softLimit", "hardLimit", "currentUsed"]
    assert pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX == LIMIT_MAX
    assert (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) == (6, 13)


class FakeNvml:
    """The pynvml calls the limits make, with nvidia-ml-py's own structures.

    `answers`: GPU UUID -> NVML return code of its calls (0: works); `limits`:
    (uuid, cgroup path) -> (soft, hard) as set."""

    c_nvmlSetMemoryLimits_v1_t = pynvml.c_nvmlSetMemoryLimits_v1_t
    c_nvmlGetMemoryLimits_v1_t = pynvml.c_nvmlGetMemoryLimits_v1_t
    __version__ = "13.615.71"

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, answers=None, fail_init=False, uuids=None):
        self.answers = answers or {}
        self.uuids = uuids or {g.uuid for g in GPUS}
        self.fail_init = fail_init
        self.limits: dict[tuple[str, str], tuple[int, int]] = {}
        self.calls: list[str] = []
        self.block: threading.Event | None = None
        self.entered = threading.Event()  # a call reached `block`
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError(12)  # LIBRARY_NOT_FOUND
        self.calls.append("init")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise self.NVMLError(6)
        return {"uuid": uuid}

    def _answer(self, handle):
        if code := self.answers.get(handle["uuid"], 0):
            raise self.NVMLError(code)

    def nvmlDeviceGetMemoryLimits_v1(self, handle, limits):
        self.calls.append(f"get {handle['uuid']} {str(limits.nameSpace)}")
        self._answer(handle)
        raise self.NVMLError(6)  # NOT_FOUND: no limits on that group

    def nvmlDeviceSetMemoryLimits_v1(self, handle, limits):
        if self.block is not None:
            self.entered.set()
            self.block.wait(10)
        self._answer(handle)
        key = (handle["uuid"], str(limits.nameSpace))
        self.limits[key] = (limits.softLimit, limits.hardLimit)


def started(nvml, tmp_path, gpus=GPUS, timeout=0.5):
    limits = NvmlMemoryLimits(
        nvml, cgroup_root=str(tmp_path), self_cgroup=str(tmp_path / "daemon"), timeout=timeout
    )
    limits.start(gpus)
    return limits


SYSTEMD = "kubepods-besteffort-podab.slice:cri-containerd:c1"
LEAF = (
    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab.slice/"
    "cri-containerd-c1.scope"
)


async def test_sets_and_clears_the_hard_limit_of_the_containers_cgroup(tmp_path):
    (tmp_path / LEAF).mkdir(parents=True)
    nvml = FakeNvml()
    limits = started(nvml, tmp_path)
    assert limits.problem(0) == limits.problem(1) == ""
    assert f"get {GPUS[0].uuid} {tmp_path}/daemon" in nvml.calls  # probed with our own cgroup
    await limits.set_limit(1, SYSTEMD, 3 * GiB)
    assert nvml.limits == {(GPUS[1].uuid, f"{tmp_path}/{LEAF}"): (0, 3 * GiB)}
    await limits.clear_limit(1, SYSTEMD)
    assert nvml.limits == {(GPUS[1].uuid, f"{tmp_path}/{LEAF}"): (0, LIMIT_MAX)}
    limits.close()
    assert nvml.shutdowns == 1


async def test_cgroupfs_paths_and_a_cgroup_already_gone(tmp_path):
    nvml = FakeNvml()
    limits = started(nvml, tmp_path)
    with pytest.raises(LimitError, match="does not exist"):
        await limits.set_limit(0, "/k8s.io/c1", GiB)
    await limits.clear_limit(0, "/k8s.io/c1")  # gone, and its limits with it
    assert nvml.limits == {}
    (tmp_path / "k8s.io/c1").mkdir(parents=True)
    await limits.set_limit(0, "/k8s.io/c1", GiB)
    assert nvml.limits == {(GPUS[0].uuid, f"{tmp_path}/k8s.io/c1"): (0, GiB)}
    limits.close()


@pytest.mark.parametrize(
    "hostile",
    [
        "/",  # the cgroup root: every process of the node
        "/k8s.io/../..",  # climbs out of the cgroup tree
        "/k8s.io/c1/../../daemon",  # this daemon's own cgroup
        "../k8s.io/c2",
        "/k8s.io/./c1",
        "kubepods.slice:cri-containerd:../../c1",  # systemd form, climbing
        "/daemon",  # the daemon's cgroup
    ],
)
async def test_a_hostile_cgroup_path_is_refused_not_limited(tmp_path, hostile):
    # The runtime gives the path (kubelet's cgroup_parent and the container's
    # ID, or whatever a containerd client set): the driver limit must land on
    # the container's own cgroup below the root, never on the root, an
    # ancestor, the daemon's cgroup or a path outside the tree.
    (tmp_path / "k8s.io/c1").mkdir(parents=True)
    (tmp_path / "k8s.io/c2").mkdir(parents=True)
    (tmp_path / "daemon").mkdir()
    nvml = FakeNvml()
    limits = started(nvml, tmp_path)
    with pytest.raises(LimitError, match="cgroup"):
        await limits.set_limit(0, hostile, GiB)
    with pytest.raises(LimitError, match="cgroup"):
        await limits.clear_limit(0, hostile)
    assert nvml.limits == {}
    limits.close()


@pytest.mark.parametrize(
    ("code", "fragment"),
    [
        (13, "no per-cgroup memory limits (R615 or later has them)"),
        (3, "MIG mode"),
        (4, "needs root"),
        (999, "NVML error"),
    ],
)
def test_a_gpu_whose_driver_cannot_limit_says_why(tmp_path, code, fragment):
    nvml = FakeNvml({GPUS[1].uuid: code})
    limits = started(nvml, tmp_path)
    assert limits.problem(0) == ""
    assert fragment in limits.problem(1)
    assert limits.state() == {"mode": "auto", "gpus": {"0": "", "1": limits.problem(1)}}
    limits.close()


def test_no_driver_limits_without_nvml_or_the_functions(tmp_path):
    limits = started(FakeNvml(fail_init=True), tmp_path)
    assert "NVML is not available" in limits.problem(0)

    class Old(FakeNvml):
        __version__ = "12.535.133"

        @property
        def nvmlDeviceSetMemoryLimits_v1(self):
            raise AttributeError("not in this nvidia-ml-py")

    limits = started(Old(), tmp_path)
    assert limits.problem(1) == (
        "nvidia-ml-py 12.535.133 has no nvmlDeviceSetMemoryLimits_v1 (13.615 or later has it)"
    )
    static = make_gpus(1)  # a UUID NVML does not know
    static[0] = type(static[0])(0, "GPU-ffffffff-0000", "x", GiB, 0)
    assert "NVML does not know GPU-ffffffff-0000" in started(FakeNvml(), tmp_path, static).problem(
        0
    )


async def test_a_cgroup_without_the_memory_controller_is_explained(tmp_path):
    (tmp_path / "k8s.io/c1").mkdir(parents=True)
    nvml = FakeNvml()
    limits = started(nvml, tmp_path)
    nvml.answers[GPUS[0].uuid] = 6
    with pytest.raises(LimitError, match=r"\+dmem"):
        await limits.set_limit(0, "/k8s.io/c1", GiB)
    await limits.clear_limit(0, "/k8s.io/c1")  # NOT_FOUND on clear: nothing to clear
    limits.close()


async def test_a_hung_driver_costs_one_timeout(tmp_path):
    (tmp_path / "k8s.io/c1").mkdir(parents=True)
    nvml = FakeNvml()
    timeout = 0.3  # the worker thread must start the call within it, even under load
    limits = started(nvml, tmp_path, timeout=timeout)
    nvml.block = threading.Event()
    try:
        with pytest.raises(LimitError, match="did not answer"):
            await limits.set_limit(0, "/k8s.io/c1", GiB)
        # The worker is stuck once its call has run longer than the timeout
        # (under load the thread can start it late: wait for that, not a clock).
        assert await asyncio.to_thread(nvml.entered.wait, 10)
        await asyncio.sleep(timeout)
        with pytest.raises(LimitError, match="has not answered"):
            await limits.set_limit(1, "/k8s.io/c1", GiB)
    finally:
        nvml.block.set()
        limits.close()


# -- the share service drives them ------------------------------------------------------------


class FakeLimits:
    """A MemoryLimits in memory: `problems` per GPU, `set` (gpu, cgroup) -> bytes."""

    def __init__(self, problems=None):
        self.problems = problems or {}
        self.set: dict[tuple[int, str], int] = {}
        self.cleared: list[tuple[int, str]] = []
        self.fail = ""

    def problem(self, gpu):
        return self.problems.get(gpu, "")

    def state(self):
        return {"mode": "auto", "gpus": {str(i): self.problem(i) for i in range(2)}}

    async def set_limit(self, gpu, cgroups_path, hard_bytes):
        if self.fail:
            raise LimitError(self.fail)
        self.set[gpu, cgroups_path] = hard_bytes

    async def clear_limit(self, gpu, cgroups_path):
        self.set.pop((gpu, cgroups_path), None)
        self.cleared.append((gpu, cgroups_path))


def service(limits, store=None):
    svc = ShareService(
        GPUS,
        NodePolicy(pod_sources=STANDALONE_SOURCES),
        Inline(FakeKernelModule()),
        FakeDevices(),
        store,
        limits=limits,
    )
    done(svc.start())
    return svc


def ctr(cid, isolation="full", pid=0, annotations=None):
    asked = {P + "gpu-memory": "2Gi,1Gi", P + "gpu-count": "2", P + "isolation": isolation}
    return ContainerInfo(
        id=cid,
        name=cid,
        pod_name=cid,
        pod_namespace="ns",
        pod_uid=cid,
        pod_annotations=asked,
        annotations=annotations or {},
        cgroups_path=f"/k8s.io/{cid}",
        pid=pid,
    )


async def test_limits_are_set_at_start_and_cleared_at_release():
    limits = FakeLimits()
    svc = service(limits)
    await svc.lifecycle.create_container(ctr("c1"))
    assert limits.set == {}  # no cgroup yet
    assert svc.status()["allocations"][0]["unguarded"]["nvml-limit"] == (
        "set when the container starts"
    )
    await svc.lifecycle.start_container(ctr("c1"))
    assert limits.set == {(0, "/k8s.io/c1"): 2 * GiB, (1, "/k8s.io/c1"): GiB}
    [entry] = svc.status()["allocations"]
    assert entry["guards"] == ["nvml-limit"]  # no interposer here: the module only books it
    assert [g["nvml_limit"] for g in entry["gpus"]] == [True, True]
    assert "nvml-limit" not in entry["unguarded"]
    await svc.lifecycle.release("c1")
    assert limits.set == {} and sorted(limits.cleared) == [(0, "/k8s.io/c1"), (1, "/k8s.io/c1")]
    await svc.lifecycle.release("c1")  # idempotent: nothing cleared twice
    assert len(limits.cleared) == 2


async def test_isolation_none_gets_no_limit_and_unsupported_gpus_say_why():
    limits = FakeLimits({1: "the driver does not support it (MIG mode)"})
    svc = service(limits)
    await svc.lifecycle.create_container(ctr("none", "none"))
    await svc.lifecycle.start_container(ctr("none", "none"))
    await svc.lifecycle.create_container(ctr("mem", "memory"))
    await svc.lifecycle.start_container(ctr("mem", "memory"))
    assert limits.set == {(0, "/k8s.io/mem"): 2 * GiB}
    entries = {a["container_id"]: a for a in svc.status()["allocations"]}
    assert [g["nvml_limit"] for g in entries["mem"]["gpus"]] == [True, False]
    assert "nvml-limit" in entries["mem"]["guards"]
    assert (
        "GPU 1: the driver does not support it (MIG mode)"
        in (entries["mem"]["unguarded"]["nvml-limit"])
    )
    assert entries["none"]["guards"] == ["none"]


async def test_a_failed_set_is_logged_and_shown(caplog):
    limits = FakeLimits()
    limits.fail = "cgroup /sys/fs/cgroup/k8s.io/c1 does not exist"
    svc = service(limits)
    await svc.lifecycle.create_container(ctr("c1"))
    await svc.lifecycle.start_container(ctr("c1"))
    assert "driver memory limit on GPU 0 not set" in caplog.text
    [entry] = svc.status()["allocations"]
    assert "nvml-limit" not in entry["guards"]
    assert "does not exist" in entry["unguarded"]["nvml-limit"]


async def test_synchronize_sets_them_again_and_clears_dropped_ones():
    store = MemoryStore()
    first = service(FakeLimits(), store)
    kept = await first.lifecycle.create_container(ctr("kept"))
    await first.lifecycle.create_container(ctr("forged"))
    limits = FakeLimits()
    second = service(limits, store)
    live = [
        ctr("kept", pid=10, annotations=dict(kept.annotations)),
        ctr("forged", pid=11),  # does not carry its adjustment: holds no share
        ctr("created", pid=0, annotations=dict(kept.annotations)),
    ]
    await second.recovery.synchronize(live)
    assert set(second.allocations) == {"kept"}
    assert limits.set == {(0, "/k8s.io/kept"): 2 * GiB, (1, "/k8s.io/kept"): GiB}
    assert sorted(limits.cleared) == [(0, "/k8s.io/forged"), (1, "/k8s.io/forged")]


async def test_without_driver_limits_status_says_off():
    svc = service(None)
    await svc.lifecycle.create_container(ctr("c1"))
    await svc.lifecycle.start_container(ctr("c1"))
    doc = svc.status()
    assert doc["nvml_memory_limits"] == {"mode": "off", "gpus": {}}
    assert doc["allocations"][0]["unguarded"]["nvml-limit"] == "nvml_memory_limits: off"
