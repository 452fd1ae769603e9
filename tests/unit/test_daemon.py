"""The daemon's translation between NRI messages and the share domain."""

from __future__ import annotations

import asyncio

import pytest

from nri_gpushare.config import ConfigError, parse_config
from nri_gpushare.daemon.main import build_service, kmod_worker
from nri_gpushare.daemon.nri_handler import GpuShareHandler, adjustment
from nri_gpushare.daemon.nri_views import container_info
from nri_gpushare.daemon.status import StatusServer
from nri_gpushare.host.kmod_worker import OffLoopKernelModule
from nri_gpushare.host.sockets import query_status
from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.api.lite import ContainerView, PodSandboxView
from nri_gpushare.nri.stub import PluginError
from nri_gpushare.share.model import DeviceNode, InjectionPlan, Mount
from tests.fakes import FakeKernelModule, Inline
from tests.unit.test_kmod_worker import Hangs, settled

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
INVENTORY = [{"index": 0, "uuid": UUID, "memory": "16Gi"}]


def pod_asking_1gi() -> PodSandboxView:
    return lite.decode_pod_sandbox(
        bytes(
            nri.PodSandbox(
                id="p",
                name="pod",
                namespace="ns",
                uid="u",
                annotations={"gpushare.io/gpu-memory": "1Gi"},
            )
        )
    )


def container_in_pod(cid: str, pid: int, state: nri.ContainerState) -> ContainerView:
    """Container `main` of pod_asking_1gi()'s pod, as Synchronize lists it."""
    return lite.decode_container(
        bytes(nri.Container(id=cid, pod_sandbox_id="p", name="main", pid=pid, state=state))
    )


def off_config(tmp_path, **settings):
    """kmod off, the one-GPU inventory, records in the test's directory."""
    return parse_config(
        {"kmod": "off", "use_nvml": False, "inventory": INVENTORY, **state(tmp_path), **settings}
    )


def state(tmp_path) -> dict[str, object]:
    """Config keys that keep the daemon's records in the test's directory, with
    an interposer library there (a stand-in file)."""
    library = tmp_path / "libgpushare.so"
    if not library.exists():
        library.write_bytes(b"\x7fELF stand-in")
        library.chmod(0o644)
    return {"state_dir": str(tmp_path / "state"), "interposer": {"library": str(library)}}


def views(pod: nri.PodSandbox, container: nri.Container):
    request = lite.decode_create_container_request(
        bytes(nri.CreateContainerRequest(pod=pod, container=container))
    )
    return request.pod, request.container


def test_container_info_reads_pod_and_container():
    pod, container = views(
        nri.PodSandbox(
            id="p",
            name="train",
            namespace="ml",
            uid="u1",
            annotations={"gpushare.io/gpu-memory": "2Gi"},
        ),
        nri.Container(
            id="c",
            name="main",
            labels={"a": "b"},
            annotations={"x": "y"},
            env=["A=1", "B=x=y", "EMPTY="],
            linux=nri.LinuxContainer(cgroups_path="/k8s.io/c"),
        ),
    )
    info = container_info(pod, container)
    assert (info.id, info.name, info.pod_name, info.pod_namespace, info.pod_uid) == (
        "c",
        "main",
        "train",
        "ml",
        "u1",
    )
    assert info.pod_annotations == {"gpushare.io/gpu-memory": "2Gi"}
    assert info.labels == {"a": "b"} and info.annotations == {"x": "y"}
    assert info.env == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert info.cgroups_path == "/k8s.io/c"


def test_adjustment_carries_the_plan():
    plan = InjectionPlan(
        devices=(DeviceNode("/dev/nvidia0", "c", 195, 0),),
        env={"GPUSHARE_MEMORY_LIMIT": "2147483648"},
        annotations={"gpushare.io/assigned": "{}"},
        mounts=(Mount("/host/lib", "/usr/lib/gpushare"),),
    )
    encoded = lite.encode_create_container_response(adjustment(plan))
    adjust = nri.CreateContainerResponse().parse(encoded).adjust
    [device] = adjust.linux.devices
    assert (device.path, device.type, device.major, device.minor) == ("/dev/nvidia0", "c", 195, 0)
    assert device.file_mode.value == 0o666
    assert [(kv.key, kv.value) for kv in adjust.env] == [("GPUSHARE_MEMORY_LIMIT", "2147483648")]
    assert adjust.annotations == {"gpushare.io/assigned": "{}"}
    [mount] = adjust.mounts
    assert (mount.source, mount.destination, mount.options) == (
        "/host/lib",
        "/usr/lib/gpushare",
        ["rbind", "ro"],
    )


async def test_kmod_required_without_module_refuses_to_start(tmp_path):
    config = parse_config(
        {
            "kmod": "required",
            "kmod_root": str(tmp_path / "none"),
            "use_nvml": False,
            "inventory": INVENTORY,
            **state(tmp_path),
        }
    )
    kmod = kmod_worker(config)
    with pytest.raises(ConfigError, match="kmod: required.*not loaded"):
        await build_service(config, kmod)


async def test_no_gpus_is_a_config_error():
    with pytest.raises(ConfigError, match="no GPUs"):
        await build_service(parse_config({"use_nvml": False, "kmod": "off"}), None)


async def test_handler_refusal_is_a_plugin_error_and_release_is_idempotent(tmp_path):
    config = parse_config(
        {"kmod": "optional", "use_nvml": False, "inventory": INVENTORY, **state(tmp_path)}
    )
    kmod = FakeKernelModule()
    handler = GpuShareHandler(await build_service(config, Inline(kmod)))
    pod, big = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "17Gi"}),
        nri.Container(id="big", name="main"),
    )
    with pytest.raises(PluginError, match="GPU 0"):
        await handler.create_container(pod, big)
    pod, ok = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "1Gi"}),
        nri.Container(id="ok", name="main"),
    )
    assert await handler.create_container(pod, ok) is not None
    assert [r.container_id for r in kmod.registrations()] == ["ok"]
    await handler.stop_container(pod, ok)
    await handler.remove_container(pod, ok)
    assert kmod.registrations() == [] and handler.service.allocations == {}


async def test_remove_without_stop_releases(tmp_path):
    config = parse_config(
        {"kmod": "optional", "use_nvml": False, "inventory": INVENTORY, **state(tmp_path)}
    )
    kmod = FakeKernelModule()
    handler = GpuShareHandler(await build_service(config, Inline(kmod)))
    pod, container = views(
        nri.PodSandbox(id="p", name="p", annotations={"gpushare.io/gpu-memory": "1Gi"}),
        nri.Container(id="c", name="main"),
    )
    await handler.create_container(pod, container)
    await handler.remove_container(pod, container)  # e.g. after a crash: no StopContainer
    assert handler.service.allocations == {} and kmod.registrations() == []


# -- a hung kernel module blocks nothing else ------------------------------------------------

INVENTORY2 = [
    {"index": 0, "uuid": UUID, "memory": "16Gi"},
    {"index": 1, "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "memory": "16Gi"},
]


def share(cid: str, **keys: str):
    annotations = {f"gpushare.io/{k.replace('_', '-')}": v for k, v in keys.items()}
    return views(nri.PodSandbox(id="p", name=cid, annotations=annotations), nri.Container(id=cid))


@pytest.mark.parametrize("mode", ["required", "optional"])
async def test_a_hung_module_access_blocks_nothing_else(tmp_path, mode):
    """The module hangs for 2 s registering 'slow'; meanwhile the status socket
    answers and containers are created: those that need no module at once, those
    that need it as the kmod mode says, and 'slow' fails after its timeout."""
    kmod = Hangs("slow")
    worker = OffLoopKernelModule(kmod, timeout=0.5)
    config = parse_config(
        {"kmod": mode, "use_nvml": False, "inventory": INVENTORY2, **state(tmp_path)}
    )
    handler = GpuShareHandler(await build_service(config, worker))
    path = str(tmp_path / "status.sock")
    status = StatusServer(path, handler.service.status)
    await status.start()
    try:
        slow = asyncio.create_task(handler.create_container(*share("slow", gpu_memory="2Gi")))
        await asyncio.to_thread(kmod.hanging.wait, 5)

        doc = await asyncio.to_thread(query_status, path)  # the loop serves the socket
        assert kmod.in_register, "status was answered before the hung access finished"
        assert doc["gpus"][0]["containers"] == ["slow"]  # reserved while it is asked
        # No module access needed: no share, or a share that is never registered.
        assert await handler.create_container(*share("plain")) is None
        assert await handler.create_container(*share("free", gpu_memory="1Gi", isolation="none"))
        assert not slow.done() and kmod.in_register

        with pytest.raises(PluginError, match=r"did not answer within 0\.5 s .*errno 110"):
            await slow
        assert kmod.in_register  # refused while the kernel is still stuck
        # Needs the module, which is stuck: a fast, clear answer per the mode.
        needs = share("needs", gpu_memory="1Gi")
        if mode == "required":
            with pytest.raises(PluginError, match="kernel module is not answering"):
                await handler.create_container(*needs)
        else:
            assert await handler.create_container(*needs) is not None
        assert kmod.in_register
        doc = await asyncio.to_thread(query_status, path)
        placed = {a["container_id"]: a["registered"] for a in doc["allocations"]}
        assert placed == (
            {"free": False} if mode == "required" else {"free": False, "needs": False}
        )
        assert doc["kmod"]["loaded"] is False and "not answering" in doc["kmod"]["problem"]
    finally:
        kmod.release.set()
        await status.close()
    await settled(worker)
    assert kmod.regs == {}  # 'slow' landed late and was unregistered behind it
    worker.close()


async def test_state_dir_others_can_write_is_a_config_error(tmp_path):
    bad = tmp_path / "shared"
    bad.mkdir(mode=0o777)
    bad.chmod(0o777)
    config = parse_config(
        {"kmod": "off", "use_nvml": False, "inventory": INVENTORY, "state_dir": str(bad)}
    )
    with pytest.raises(ConfigError, match="writable by others"):
        await build_service(config, None)


async def test_synchronize_survives_odd_containers_and_denies_unserved(tmp_path, monkeypatch):
    config = off_config(tmp_path, unserved="deny")
    handler = GpuShareHandler(await build_service(config, None))
    killed = []
    monkeypatch.setattr(
        "nri_gpushare.daemon.unserved_policy.kill_container",
        lambda cid, pid: killed.append((cid, pid)) or f"killed (process {pid})",
    )
    pod = pod_asking_1gi()
    asked = container_in_pod("c1", 42, nri.ContainerState.CONTAINER_RUNNING)
    stopped = container_in_pod("c2", 0, nri.ContainerState.CONTAINER_STOPPED)
    orphan = lite.decode_container(bytes(nri.Container(id="c3", pod_sandbox_id="gone")))
    assert await handler.synchronize([pod], [asked, stopped, orphan]) == []
    assert killed == [("c1", 42)]
    [entry] = handler.service.status()["unserved"]
    assert entry["container_id"] == "c1" and entry["action"] == "denied: killed (process 42)"


async def test_a_split_synchronize_gathered_part_by_part_is_one_synchronize(tmp_path, caplog):
    """The stub hands the requests that more follow to synchronize_part, which
    keeps no view; a container whose pod comes in a later request still gets
    its pod's request; a new connection's Configure drops a broken one's parts."""
    handler = GpuShareHandler(await build_service(off_config(tmp_path, unserved="warn"), None))
    pod = pod_asking_1gi()
    plain = lite.decode_pod_sandbox(bytes(nri.PodSandbox(id="q", name="web", namespace="ns")))
    asked = container_in_pod("c1", 42, nri.ContainerState.CONTAINER_RUNNING)
    web = lite.decode_container(
        bytes(nri.Container(id="c2", pod_sandbox_id="q", name="web", pid=7))
    )
    await handler.configure("", "containerd", "1.7.24")
    assert handler.synchronize_part([plain], [asked, web]) is True  # c1's pod comes later
    assert handler._sync.waiting == [asked]  # web's pod came first in the same request
    await handler.configure("", "containerd", "1.7.24")  # the connection broke: start again
    assert handler.synchronize_part([plain], [web, asked]) is True
    caplog.set_level("INFO", logger="nri_gpushare.daemon.nri_handler")
    assert await handler.synchronize([pod], []) == []
    assert list(handler.service.unserved) == ["c1"]
    assert "synchronized: 2 pod(s), 2 container(s)" in caplog.text
    assert handler._sync.live == [] and handler._sync.pods == {}


async def test_a_create_the_runtime_gave_up_on_leaves_nothing_booked(tmp_path, monkeypatch):
    config = parse_config(
        {"kmod": "off", "use_nvml": False, "inventory": INVENTORY, **state(tmp_path)}
    )
    handler = GpuShareHandler(await build_service(config, None), request_timeout=lambda: 0.2)
    service = handler.service
    record = service.journal.append

    def slow_record(line: str) -> None:  # a disk so slow that the answer comes too late
        import time

        time.sleep(0.3)
        record(line)

    monkeypatch.setattr(service.journal, "append", slow_record)
    pod = pod_asking_1gi()
    ctr = lite.decode_container(bytes(nri.Container(id="c1", pod_sandbox_id="p", name="main")))
    with pytest.raises(PluginError, match="not placed within the runtime's request timeout"):
        await handler.create_container(pod, ctr)
    assert service.allocations == {}
    assert service.status()["gpus"][0]["memory_allocated"] == 0


async def test_deny_reaches_a_container_that_starts_after_synchronize(tmp_path, monkeypatch):
    config = off_config(tmp_path, unserved="deny")
    handler = GpuShareHandler(await build_service(config, None))
    killed = []

    def kill(cid, pid):
        killed.append(pid)
        return f"killed (process {pid})" if pid else "not running: nothing to kill"

    monkeypatch.setattr("nri_gpushare.daemon.unserved_policy.kill_container", kill)
    pod = pod_asking_1gi()
    created = nri.Container(
        id="c1", pod_sandbox_id="p", name="main", state=nri.ContainerState.CONTAINER_CREATED
    )
    await handler.synchronize([pod], [lite.decode_container(bytes(created))])
    assert handler.service.unserved["c1"].settled is False
    created.pid, created.state = 42, nri.ContainerState.CONTAINER_RUNNING
    await handler.post_start_container(pod, lite.decode_container(bytes(created)))
    assert killed == [0, 42]
    assert handler.service.status()["unserved"][0]["action"] == "denied: killed (process 42)"
    await handler.synchronize([pod], [lite.decode_container(bytes(created))])
    assert killed == [0, 42]  # settled: not killed again


# -- the interposer, driver limits and memory in use, wired ------------------------------------


async def test_the_interposer_reaches_the_adjustment_through_the_state_dirs_preload_file(tmp_path):
    config = off_config(tmp_path)
    handler = GpuShareHandler(await build_service(config, None))
    preload = tmp_path / "state" / "ld.so.preload"
    assert preload.read_text() == "/usr/lib/gpushare/libgpushare.so\n"
    assert preload.stat().st_mode & 0o777 == 0o644
    encoded = lite.encode_create_container_response(
        await handler.create_container(pod_asking_1gi(), container_in_pod("c1", 0, 0))
    )
    mounts = nri.CreateContainerResponse().parse(encoded).adjust.mounts
    assert [(m.source, m.destination, m.options) for m in mounts] == [
        (
            str(tmp_path / "libgpushare.so"),
            "/usr/lib/gpushare/libgpushare.so",
            ["rbind", "ro", "nosuid", "nodev"],
        ),
        (str(preload), "/etc/ld.so.preload", ["rbind", "ro", "nosuid", "nodev"]),
    ]


async def test_a_missing_library_is_refused_through_nri_and_books_nothing(tmp_path, caplog):
    config = off_config(tmp_path, interposer={"library": str(tmp_path / "none.so")})
    handler = GpuShareHandler(await build_service(config, None))
    assert "none.so does not exist: shares with isolation full|memory will be refused" in (
        caplog.text
    )
    with pytest.raises(PluginError, match=r"none\.so does not exist on this node"):
        await handler.create_container(pod_asking_1gi(), container_in_pod("c1", 0, 0))
    assert handler.service.allocations == {}
    assert handler.service.status()["gpus"][0]["memory_allocated"] == 0


async def test_driver_limits_probed_at_start_and_status_is_served_async(tmp_path):
    from nri_gpushare.host.driver_limits import NvmlMemoryLimits
    from tests.unit.test_nvml_limits import FakeNvml

    config = off_config(tmp_path)
    limits = NvmlMemoryLimits(
        FakeNvml({UUID: 3}, uuids={UUID}), cgroup_root=str(tmp_path), self_cgroup="/x"
    )
    service = await build_service(config, None, limits=limits)
    path = str(tmp_path / "status.sock")

    async def snapshot():
        return service.status(await service.read_usage())

    server = StatusServer(path, snapshot)
    await server.start()
    try:
        doc = await asyncio.to_thread(query_status, path)
    finally:
        await server.close()
        limits.close()
    assert "MIG mode" in doc["nvml_memory_limits"]["gpus"]["0"]
    assert doc["interposer"]["problem"] == ""


async def test_start_of_a_container_without_a_share_decodes_nothing(tmp_path):
    """StartContainer reads a container's labels, annotations and environment
    only when it holds a share (to bind its cgroup): for every other container
    nothing is decoded, so a field no handler needs cannot fail the event."""
    handler = GpuShareHandler(await build_service(off_config(tmp_path), None))
    pod = lite.decode_pod_sandbox(bytes(nri.PodSandbox(id="q", name="web", namespace="ns")))
    # A label whose key is not UTF-8: DecodeError on the first read of the labels.
    raw = bytes(nri.Container(id="c9", pod_sandbox_id="q", name="web", pid=7))
    bad = lite.decode_container(raw + b"\x2a\x06\x0a\x02\xff\xfe\x12\x00")
    with pytest.raises(lite.DecodeError):
        _ = bad.labels
    bad = lite.decode_container(raw + b"\x2a\x06\x0a\x02\xff\xfe\x12\x00")
    await handler.start_container(pod, bad)
    assert bad._labels is None and bad._env is None  # nothing read


async def test_a_container_started_without_its_share_is_unserved(tmp_path):
    """A container that asks for a share and starts holding none was created
    while the plugin was not serving (e.g. registering after Synchronize's
    snapshot: containerd failed open): it is unserved from its start, not
    only after the next Synchronize; one the plugin placed is not."""
    handler = GpuShareHandler(await build_service(off_config(tmp_path, unserved="warn"), None))
    pod = pod_asking_1gi()
    missed = container_in_pod("c5", 0, nri.ContainerState.CONTAINER_CREATED)
    await handler.start_container(pod, missed)
    assert list(handler.service.unserved) == ["c5"]
    assert handler.service.unserved["c5"].asked == "gpu-memory 1024Mi"
    await handler.post_start_container(pod, container_in_pod("c5", 42, 2))
    assert handler.service.unserved["c5"].container.pid == 42
    served = container_in_pod("c6", 0, nri.ContainerState.CONTAINER_CREATED)
    assert await handler.create_container(pod, served) is not None
    await handler.start_container(pod, served)
    plain = lite.decode_container(bytes(nri.Container(id="c7", pod_sandbox_id="q", name="x")))
    await handler.start_container(
        lite.decode_pod_sandbox(bytes(nri.PodSandbox(id="q", name="web"))), plain
    )
    assert list(handler.service.unserved) == ["c5"]
    await handler.remove_container(pod, missed)
    assert handler.service.unserved == {}


async def test_the_reconcile_owner_adopts_with_the_tasks_cgroup(monkeypatch, caplog):
    import nri_gpushare.daemon.adapters as daemon_module
    from nri_gpushare.daemon.adapters import ReconcileOwner

    adopted: list[tuple[str, str, int, str]] = []

    class Service:
        async def adopt_local(self, ns: str, cid: str, pid: int, path: str) -> bool:
            adopted.append((ns, cid, pid, path))
            return True

    def cgroup_of(cid: str, pid: int) -> str:
        if pid == 13:
            raise ValueError("process 13's cgroup '/x' is not the container's")
        return f"/default/{cid}"

    monkeypatch.setattr(daemon_module, "cgroup_of", cgroup_of)
    owner = ReconcileOwner(Service())  # type: ignore[arg-type]
    await owner.adopt_local("default", "c1", 12)
    await owner.adopt_local("default", "c2", 13)  # not its cgroup: nothing bound, a warning
    assert adopted == [("default", "c1", 12, "/default/c1")]
    assert "c2" in caplog.text and "not the container's" in caplog.text
