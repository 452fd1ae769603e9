"""Status: memory in use next to each quota (from the kernel module's
meminfo, through a fake), and the guards of each share."""

import threading
from dataclasses import dataclass, field

from nri_gpushare.host.meminfo import ModuleMemInfo
from nri_gpushare.host.worker import BlockingWorker
from nri_gpushare.share.kernel import NotRegistered
from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, InterposerPolicy, NodePolicy
from nri_gpushare.share.service import ShareService
from nri_gpushare.share.usage import MemoryUse
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, MiB, done, make_gpus

P = "gpushare.io/"


@dataclass
class MemInfo:
    """The shape nri_gpushare.kmod.procfs.meminfo returns."""

    free: int
    processes: dict[int, int] = field(default_factory=dict)


class FakeProcfs:
    """A kernel-module client with meminfo(gpu, container_id)."""

    def __init__(self, infos):
        self.infos = infos  # (gpu, cid) -> MemInfo
        self.block: threading.Event | None = None

    def meminfo(self, gpu, container_id):
        if self.block is not None:
            self.block.wait(10)
        try:
            return self.infos[gpu, container_id]
        except KeyError:
            raise NotRegistered(f"{container_id}: not registered") from None


def ctr(cid, **keys):
    annotations = {P + k.replace("_", "-"): v for k, v in keys.items()}
    return ContainerInfo(
        id=cid, name=cid, pod_name=cid, pod_namespace="ns", pod_uid=cid, pod_annotations=annotations
    )


def service(usage=None, kmod=None, kmod_mode="optional", interposer=True):
    policy = NodePolicy(
        pod_sources=STANDALONE_SOURCES,
        kmod_mode=kmod_mode,
        interposer=InterposerPolicy(preload_file="/state/ld.so.preload") if interposer else None,
    )
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        make_gpus(2, 16 * GiB),
        policy,
        Inline(kmod) if kmod_mode != "off" else None,
        FakeDevices(),
        usage=usage,
        library_check=lambda path: "",
    )
    done(svc.start())
    return svc


async def test_used_comes_from_the_modules_meminfo():
    procfs = FakeProcfs(
        {
            (0, "a"): MemInfo(free=GiB + 512 * MiB, processes={10: 300 * MiB, 11: 212 * MiB}),
            (1, "a"): MemInfo(free=GiB),
        }
    )
    usage = ModuleMemInfo(procfs, BlockingWorker("test-meminfo"))
    svc = service(usage)
    await svc.lifecycle.create_container(ctr("a", gpu_memory="2Gi,1Gi", gpu_count="2"))
    await svc.lifecycle.create_container(ctr("b", gpu_memory="1Gi", isolation="none"))
    doc = svc.status(await svc.read_usage())
    entries = {a["container_id"]: a for a in doc["allocations"]}
    a0, a1 = entries["a"]["gpus"]
    assert (a0["memory"], a0["memory_used"], a0["processes"]) == (2 * GiB, 512 * MiB, 2)
    assert (a1["memory_used"], a1["memory_used_why"]) == (0, "")
    assert entries["a"]["guards"] == ["interposer", "kernel-ledger"]
    [b] = entries["b"]["gpus"]
    assert b["memory_used"] is None and "isolation none" in b["memory_used_why"]
    usage.close()


async def test_used_is_unknown_without_the_module_and_says_why():
    svc = service(kmod=FakeKernelModule(loaded=False))
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    [share] = svc.status(await svc.read_usage())["allocations"][0]["gpus"]
    assert share["memory_used"] is None
    assert share["memory_used_why"] == "unknown: not registered (the kernel module is not loaded)"
    entry = svc.status()["allocations"][0]
    assert entry["guards"] == ["interposer"]
    assert "not loaded" in entry["unguarded"]["kernel-ledger"]
    assert "counts per process" in entry["unguarded"]["kernel-ledger"]

    off = service(kmod_mode="off")
    await off.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    [share] = off.status(await off.read_usage())["allocations"][0]["gpus"]
    assert share["memory_used_why"] == "unknown: kmod: off"
    assert service().status()["allocations"] == []


async def test_a_client_without_meminfo_or_a_stuck_module_is_unknown():
    svc = service(ModuleMemInfo(object(), BlockingWorker("test-meminfo")))
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    [share] = svc.status(await svc.read_usage())["allocations"][0]["gpus"]
    assert "cannot read meminfo" in share["memory_used_why"]

    procfs = FakeProcfs({})
    usage = ModuleMemInfo(procfs, BlockingWorker("test-meminfo", timeout=0.05))
    svc = service(usage)
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    [share] = svc.status(await svc.read_usage())["allocations"][0]["gpus"]
    assert "meminfo unreadable (a: not registered)" in share["memory_used_why"]
    procfs.block = threading.Event()
    try:
        [share] = svc.status(await svc.read_usage())["allocations"][0]["gpus"]
        assert "did not answer" in share["memory_used_why"]
    finally:
        procfs.block.set()
        usage.close()


async def test_usage_read_failure_still_answers():
    class Broken:
        async def usage(self, wanted):
            raise RuntimeError("bug")

    svc = service(Broken())
    await svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi"))
    [share] = svc.status(await svc.read_usage())["allocations"][0]["gpus"]
    assert share["memory_used_why"] == "unknown: RuntimeError"


def test_status_without_usage_says_not_read():
    svc = service()
    done(svc.lifecycle.create_container(ctr("a", gpu_memory="1Gi")))
    [share] = svc.status()["allocations"][0]["gpus"]
    assert (share["memory_used"], share["memory_used_why"]) == (None, "unknown: not read")
    assert MemoryUse(None).processes == {}
    assert svc.status()["interposer"]["problem"] == ""
    assert service(interposer=False).status()["interposer"] is None


async def test_used_through_the_real_procfs_client(tmp_path):
    """ModuleMemInfo over nri_gpushare.kmod.procfs (a /proc/gpushare tree in a
    directory): used is the module's memsize - free, processes its PID lines."""
    from nri_gpushare.kmod.procfs import ProcfsKernelModule

    (tmp_path / "inst_ctl").write_text("")
    d = tmp_path / "0" / "a"
    d.mkdir(parents=True)
    (d / "memsize").write_text(f"{GiB}\n")
    (d / "meminfo").write_text(f"Free: {768 * MiB}\nPID: 10 Mem: {256 * MiB}\n")
    usage = ModuleMemInfo(ProcfsKernelModule(tmp_path), BlockingWorker("test-meminfo"))
    try:
        found = await usage.usage([(0, "a", GiB), (1, "a", GiB)])
    finally:
        usage.close()
    assert found[0, "a"] == MemoryUse(256 * MiB, {10: 256 * MiB}, "")
    assert found[1, "a"].used is None and "not registered there" in found[1, "a"].why
