"""The daemon's side of the local API: requests from the CDI hook and
gpushare-runc -> the share service (one table with the pods), and the
root-only server."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nri_gpushare.daemon.local_api import LocalApiHandler
from nri_gpushare.daemon.local_server import LocalApiServer
from nri_gpushare.host.containerd.client import ContainerdUnavailable, ContainerNotFound
from nri_gpushare.local import protocol
from nri_gpushare.local.protocol import Reply, Request
from nri_gpushare.share.kernel import KmodError
from nri_gpushare.share.model import STANDALONE_SOURCES, ContainerInfo, NodePolicy, ShareRefused
from nri_gpushare.share.records import MemoryStore
from nri_gpushare.share.service import ShareService
from tests.fakes import FakeDevices, FakeKernelModule, GiB, Inline, make_gpus

P = "gpushare.io/"


class Labels:
    """Containerd's labels, by (namespace, id); raises what it is told to."""

    def __init__(self, labels=None, error: Exception | None = None) -> None:
        self.by_id = labels or {}
        self.error = error
        self.asked: list[tuple[str, str]] = []

    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        self.asked.append((namespace, container_id))
        if self.error is not None:
            raise self.error
        if (namespace, container_id) not in self.by_id:
            raise ContainerNotFound(namespace, container_id)
        return dict(self.by_id[namespace, container_id])


async def make(kmod_mode="optional", kmod=None, store=None, gpus=2, memory=16 * GiB):
    kmod = kmod if kmod is not None else FakeKernelModule()
    svc = ShareService(
        make_gpus(gpus, memory),
        NodePolicy(kmod_mode=kmod_mode, pod_sources=STANDALONE_SOURCES),
        Inline(kmod) if kmod_mode != "off" else None,
        FakeDevices(),
        store if store is not None else MemoryStore(),
    )
    await svc.start()
    return svc, kmod


def create(cid="c1", namespace="default", *, via="runc", env=None, annotations=None, **kw):
    return Request(
        "create",
        namespace,
        cid,
        via=via,
        bundle=f"/run/containerd/io.containerd.runtime.v2.task/{namespace}/{cid}",
        cgroups_path=f"/{namespace}/{cid}",
        env=env or {},
        annotations=annotations or {},
        **kw,
    )


async def test_a_label_asks_for_a_share_and_the_plan_carries_it():
    svc, kmod = await make()
    labels = Labels({("default", "c1"): {P + "gpu-memory": "2Gi", "nerdctl/name": "web"}})
    reply = await LocalApiHandler(svc, labels)(create())
    assert reply.ok, reply.error
    assert labels.asked == [("default", "c1")]
    env = reply.plan["env"]
    assert env["GPUSHARE_MEMORY_LIMIT"] == str(2 * GiB)
    assert {d["path"] for d in reply.plan["devices"]} >= {"/dev/nvidia0", "/dev/nvidiactl"}
    assert P + "assigned" in reply.plan["annotations"]
    alloc = svc.allocations["c1"]
    assert (alloc.name, alloc.origin, alloc.namespace) == ("web", "runc", "default")
    assert "c1" in kmod.regs
    entry = svc.status()["allocations"][0]
    assert entry["origin"] == "runc:default"


async def test_cgpu_environment_asks_as_in_the_cgpu_documents():
    svc, _ = await make(gpus=1)
    env = {"ALIYUN_COM_GPU_MEM_CONTAINER": "6", "ALIYUN_COM_GPU_MEM_DEV": "16"}
    reply = await LocalApiHandler(svc, Labels({("moby", "d1"): {}}))(create("d1", "moby", env=env))
    assert reply.ok, reply.error
    assert reply.plan["env"]["GPUSHARE_MEMORY_LIMIT"] == str(6 * GiB)


async def test_no_request_no_plan_and_nothing_reserved():
    svc, _ = await make()
    reply = await LocalApiHandler(svc, Labels({("default", "c1"): {}}))(create())
    assert reply == Reply(True)
    assert svc.allocations == {}


async def test_a_container_containerd_does_not_know_is_refused_with_what_to_do():
    svc, _ = await make()
    reply = await LocalApiHandler(svc, Labels(), "/run/containerd/containerd.sock")(create())
    assert not reply.ok and reply.reason == "unavailable"
    assert "no container c1 in namespace default" in reply.error
    assert "containerd.socket" in reply.error
    assert svc.allocations == {}


async def test_containerd_down_refuses_instead_of_running_unguarded():
    svc, _ = await make()
    labels = Labels(error=ContainerdUnavailable("containerd socket /x does not exist"))
    reply = await LocalApiHandler(svc, labels)(create(env={"ALIYUN_COM_GPU_MEM_CONTAINER": "1"}))
    assert not reply.ok and "cannot read its labels from containerd" in reply.error
    assert svc.allocations == {}


async def test_without_a_namespace_labels_are_not_asked():
    svc, _ = await make()
    labels = Labels()
    reply = await LocalApiHandler(svc, labels)(
        create("p1", "", annotations={P + "gpu-memory": "1Gi"})
    )
    assert reply.ok, reply.error
    assert labels.asked == []


async def test_a_refusal_reaches_the_caller_and_reserves_nothing():
    svc, _ = await make(memory=4 * GiB)
    labels = Labels({("default", "big"): {P + "gpu-memory": "8Gi"}})
    reply = await LocalApiHandler(svc, labels)(create("big"))
    assert not reply.ok and reply.reason == "capacity"
    assert "8" in reply.error and "free" in reply.error
    assert svc.allocations == {} and all(u.memory_bytes == 0 for u in svc.ledger.usage.values())


async def test_a_cri_container_is_left_to_nri():
    svc, _ = await make()
    labels = Labels({("k8s.io", "c1"): {P + "gpu-memory": "2Gi"}})
    annotations = {"io.kubernetes.cri.container-type": "container", P + "gpu-memory": "2Gi"}
    reply = await LocalApiHandler(svc, labels)(create("c1", "k8s.io", annotations=annotations))
    assert reply == Reply(True)
    assert svc.allocations == {}


async def test_a_pod_and_a_local_container_compete_for_the_last_memory():
    svc, _ = await make(gpus=1, memory=4 * GiB)
    pod = ContainerInfo(
        id="pod-c",
        name="main",
        pod_name="p",
        pod_namespace="ns",
        pod_uid="u",
        pod_annotations={P + "gpu-memory": "3Gi"},
    )
    await svc.lifecycle.create_container(pod)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}})
    reply = await LocalApiHandler(svc, labels)(create())
    assert not reply.ok and reply.reason == "capacity"
    await svc.lifecycle.release("pod-c")
    assert (await LocalApiHandler(svc, labels)(create())).ok
    with pytest.raises(ShareRefused):
        await svc.lifecycle.create_container(pod)


async def test_an_id_held_in_another_namespace_or_by_a_pod_is_refused():
    svc, _ = await make()
    labels = Labels(
        {("a", "same"): {P + "gpu-memory": "1Gi"}, ("b", "same"): {P + "gpu-memory": "1Gi"}}
    )
    handler = LocalApiHandler(svc, labels)
    assert (await handler(create("same", "a"))).ok
    again = await handler(create("same", "a"))
    assert again.ok and again.plan is not None  # asked again: the same answer
    other = await handler(create("same", "b"))
    assert not other.ok and other.reason == "conflict" and "runc:a" in other.error
    pod = ContainerInfo(
        id="same",
        name="x",
        pod_name="p",
        pod_namespace="n",
        pod_uid="u",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    with pytest.raises(ShareRefused, match="runc:a"):
        await svc.lifecycle.create_container(pod)


async def test_release_frees_only_a_local_share_of_that_namespace():
    svc, kmod = await make()
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    handler = LocalApiHandler(svc, labels)
    await handler(create())
    pod = ContainerInfo(
        id="pod-c",
        name="m",
        pod_name="p",
        pod_namespace="n",
        pod_uid="u",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    await svc.lifecycle.create_container(pod)
    assert await handler(Request("release", "other", "c1")) == Reply(True, released=False)
    assert await handler(Request("release", "k8s.io", "pod-c")) == Reply(True, released=False)
    assert "pod-c" in svc.allocations
    assert await handler(Request("release", "default", "c1")) == Reply(True, released=True)
    assert "c1" not in svc.allocations and "c1" not in kmod.regs
    assert await handler(Request("release", "default", "c1")) == Reply(True, released=False)


async def test_start_binds_the_registration_to_the_cgroup_given_at_create():
    svc, kmod = await make()
    handler = LocalApiHandler(svc, Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}}))
    await handler(create())
    assert await handler(Request("start", "default", "c1", pid=4242)) == Reply(True)
    assert kmod.cgroups["c1"] == "/default/c1"
    assert svc.local_shares.local_allocations()[0].pid == 4242


async def test_the_cdi_hook_binds_at_once_and_is_held_to_its_devices():
    svc, kmod = await make(gpus=2)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    handler = LocalApiHandler(svc, labels)
    reply = await handler(create(via="cdi", pid=99, gpu_minors=(1,)))
    assert reply.ok, reply.error
    alloc = svc.allocations["c1"]
    assert [s.index for s in alloc.shares] == [1] and alloc.origin == "cdi"
    assert kmod.cgroups["c1"] == "/default/c1"


async def test_the_cdi_devices_and_the_request_must_agree():
    svc, _ = await make(gpus=2)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    handler = LocalApiHandler(svc, labels)
    reply = await handler(create(via="cdi", pid=9, gpu_minors=(0, 1)))
    assert not reply.ok and reply.reason == "conflict"
    assert "gpu-count=2" in reply.error
    pinned = Labels({("default", "c1"): {P + "gpu-memory": "1Gi", P + "gpu-devices": "0"}})
    reply = await LocalApiHandler(svc, pinned)(create(via="cdi", pid=9, gpu_minors=(1,)))
    assert not reply.ok and reply.reason == "conflict"
    unknown = await handler(create(via="cdi", pid=9, gpu_minors=(7,)))
    assert not unknown.ok and "/dev/nvidia7" in unknown.error and "cdi generate" in unknown.error
    assert svc.allocations == {}


async def test_cdi_without_the_module_refuses_enforced_isolation():
    svc, _ = await make(kmod_mode="off")
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    reply = await LocalApiHandler(svc, labels)(create(via="cdi", pid=9, gpu_minors=(0,)))
    assert not reply.ok and reply.reason == "kmod"
    assert "gpushare-runc" in reply.error and "isolation=none" in reply.error
    none = Labels({("default", "c1"): {P + "gpu-memory": "1Gi", P + "isolation": "none"}})
    assert (await LocalApiHandler(svc, none)(create(via="cdi", pid=9, gpu_minors=(0,)))).ok


async def test_cdi_with_the_module_absent_refuses_and_reserves_nothing():
    kmod = FakeKernelModule()
    kmod.is_loaded = False
    svc, _ = await make(kmod_mode="optional", kmod=kmod)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    reply = await LocalApiHandler(svc, labels)(create(via="cdi", pid=9, gpu_minors=(0,)))
    assert not reply.ok and reply.reason == "kmod", reply
    assert svc.allocations == {}
    assert (await LocalApiHandler(svc, labels)(create(via="runc"))).ok


async def test_nri_synchronize_keeps_local_shares():
    svc, kmod = await make()
    labels = Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}})
    await LocalApiHandler(svc, labels)(create())
    await svc.recovery.synchronize([])  # the pods' runtime came back with no pods
    assert "c1" in svc.allocations and "c1" in kmod.regs
    assert svc.ledger.usage[0].memory_bytes + svc.ledger.usage[1].memory_bytes == 3 * GiB


async def test_a_restarted_daemon_recovers_local_shares_from_its_records():
    store = MemoryStore()
    svc, kmod = await make(store=store)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}})
    await LocalApiHandler(svc, labels)(create())
    again, _ = await make(kmod=kmod, store=store)
    await again.recovery.recover_local()
    alloc = again.allocations["c1"]
    assert (alloc.origin, alloc.namespace) == ("runc", "default")
    assert "c1" in again.registered
    refs = again.local_shares.local_allocations()
    assert [(r.namespace, r.container_id, r.pid, r.since) for r in refs] == [
        ("default", "c1", 0, 0.0)
    ]
    await again.recovery.synchronize([])
    assert "c1" in again.allocations


async def test_a_recovered_share_whose_start_was_missed_is_adopted_and_bound():
    # The daemon died between the wrapper's create and its start: recovered
    # with no pid, the share is bound once the reconciler gives the running
    # task's pid and cgroup; a share that knows its pid is not adopted again.
    store = MemoryStore()
    svc, kmod = await make(store=store)
    await LocalApiHandler(svc, Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}}))(create())
    again, _ = await make(kmod=kmod, store=store)
    await again.recovery.recover_local()
    assert "c1" not in kmod.cgroups
    assert not await again.local_shares.adopt_local("other-ns", "c1", 42, "/other-ns/c1")
    assert not await again.local_shares.adopt_local("default", "c2", 42, "/default/c2")
    assert await again.local_shares.adopt_local("default", "c1", 42, "/default/c1")
    assert kmod.cgroups["c1"] == "/default/c1"
    assert [r.pid for r in again.local_shares.local_allocations()] == [42]
    assert not await again.local_shares.adopt_local("default", "c1", 43, "/default/elsewhere")
    assert kmod.cgroups["c1"] == "/default/c1"


async def test_a_failed_adoption_is_tried_again_and_a_start_after_recovery_leaves_it_to_adoption():
    store = MemoryStore()
    svc, kmod = await make(kmod_mode="required", store=store)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}})
    await LocalApiHandler(svc, labels)(create())
    again, _ = await make(kmod_mode="required", kmod=kmod, store=store)
    await again.recovery.recover_local()
    # The wrapper's start reaches the restarted daemon, which knows no cgroup
    # for it: nothing is bound and the pid stays unknown, for the reconciler.
    handler = LocalApiHandler(again, labels)
    assert (await handler(Request("start", "default", "c1", pid=42))).ok
    refs = again.local_shares.local_allocations()
    assert "c1" not in kmod.cgroups and [r.pid for r in refs] == [0]
    # The module refuses the bind: nothing is half done, the next pass retries.
    kmod.fail_next["bind_cgroup"] = KmodError("gpushare.ko has not answered", errno.ETIMEDOUT)
    with pytest.raises(ShareRefused):
        await again.local_shares.adopt_local("default", "c1", 42, "/default/c1")
    assert [r.pid for r in again.local_shares.local_allocations()] == [0]
    assert await again.local_shares.adopt_local("default", "c1", 42, "/default/c1")
    assert kmod.cgroups["c1"] == "/default/c1"


async def test_recovery_registers_a_share_the_module_lost():
    store = MemoryStore()
    svc, kmod = await make(store=store)
    await LocalApiHandler(svc, Labels({("default", "c1"): {P + "gpu-memory": "3Gi"}}))(create())
    fresh = FakeKernelModule()
    again, _ = await make(kmod=fresh, store=store)
    await again.recovery.recover_local()
    assert "c1" in fresh.regs and "c1" in again.registered


# -- the server ---------------------------------------------------------------------------


async def _ask_raw(path: str, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(data)
    writer.write_eof()
    reply = await reader.read()
    writer.close()
    return reply


async def test_the_server_answers_one_request_and_its_socket_is_root_only(tmp_path):
    seen = []

    async def handler(request: Request) -> Reply:
        seen.append(request)
        return Reply(True, released=True)

    server = LocalApiServer(str(tmp_path / "run" / "api.sock"), handler)
    await server.start()
    try:
        assert os.stat(server.path).st_mode & 0o777 == 0o600
        raw = await _ask_raw(server.path, protocol.encode_request(Request("release", "d", "c")))
        assert json.loads(raw) == {"ok": True, "released": True}
        assert seen == [Request("release", "d", "c")]
        garbage = json.loads(await _ask_raw(server.path, b"{not json"))
        assert garbage["ok"] is False and garbage["reason"] == "protocol"
    finally:
        await server.close()
    assert not os.path.exists(server.path)


async def test_a_bug_in_the_handler_still_answers(tmp_path):
    async def handler(request: Request) -> Reply:
        raise KeyError("boom")

    server = LocalApiServer(str(tmp_path / "api.sock"), handler)
    await server.start()
    try:
        raw = await _ask_raw(server.path, protocol.encode_request(Request("release", "d", "c")))
        reply = json.loads(raw)
        assert reply["ok"] is False and "internal error" in reply["error"]
    finally:
        await server.close()


async def test_a_stalled_client_gets_an_error_and_blocks_no_one(tmp_path, monkeypatch):
    monkeypatch.setattr("nri_gpushare.daemon.local_server.READ_WITHIN", 0.05)

    async def handler(request: Request) -> Reply:
        return Reply(True, released=False)

    server = LocalApiServer(str(tmp_path / "api.sock"), handler)
    await server.start()
    try:
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(b'{"v": 1')  # and nothing more
        raw = await _ask_raw(server.path, protocol.encode_request(Request("release", "d", "c")))
        assert json.loads(raw)["ok"] is True
        stalled = json.loads(await reader.read())
        assert stalled["ok"] is False and "no request within" in stalled["error"]
        writer.close()
    finally:
        await server.close()


async def test_another_uid_is_refused():
    if os.geteuid() != 0:
        pytest.fail("this test needs root (to connect as another uid)")

    async def handler(request: Request) -> Reply:
        raise AssertionError("must not be called")

    top = Path(tempfile.mkdtemp(prefix="gpushare-api-", dir="/tmp"))
    path = top / "run" / "api.sock"
    server = LocalApiServer(str(path), handler)
    await server.start()
    os.chmod(top, 0o755)
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o666)  # as if someone loosened it: the credentials still decide

    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(sys.stdin.buffer.read())\n"
        "s.shutdown(socket.SHUT_WR)\n"
        "sys.stdout.buffer.write(s.recv(65536))\n"
    )

    def as_nobody() -> bytes:
        done = subprocess.run(
            ["/usr/bin/python3", "-I", "-c", client, str(path)],
            input=protocol.encode_request(Request("release", "d", "c")),
            capture_output=True,
            user=65534,
            timeout=30,
            check=True,
        )
        return done.stdout

    try:
        reply = json.loads(await asyncio.to_thread(as_nobody))
        assert reply["ok"] is False and reply["reason"] == "forbidden"
        assert server.refused_peers == 1
    finally:
        await server.close()
        shutil.rmtree(top)


# -- what the hostile review found ----------------------------------------------------------


async def test_a_cdi_device_without_a_request_is_refused_not_left_unbooked():
    svc, _ = await make()
    reply = await LocalApiHandler(svc, Labels({("default", "c1"): {}}))(
        create(via="cdi", pid=9, gpu_minors=(0,))
    )
    assert not reply.ok and "nothing booked" in reply.error
    assert "gpushare.io/gpu-memory" in reply.error
    assert svc.allocations == {}


async def test_the_cri_annotation_outside_k8s_io_does_not_dodge_accounting():
    svc, _ = await make()
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    annotations = {"io.kubernetes.cri.container-type": "container"}
    reply = await LocalApiHandler(svc, labels)(create(annotations=annotations))
    assert reply.ok and reply.plan is not None
    assert svc.allocations["c1"].origin == "runc"


async def test_a_kubernetes_container_with_a_cdi_device_needs_its_nri_share():
    svc, _ = await make()
    annotations = {"io.kubernetes.cri.container-type": "container"}
    handler = LocalApiHandler(svc, Labels({("k8s.io", "k1"): {}}))
    refused = await handler(
        create("k1", "k8s.io", via="cdi", pid=9, gpu_minors=(0,), annotations=annotations)
    )
    assert not refused.ok and "NRI placed no share" in refused.error
    pod = ContainerInfo(
        id="k1",
        name="m",
        pod_name="p",
        pod_namespace="n",
        pod_uid="u",
        pod_annotations={P + "gpu-memory": "1Gi"},
    )
    await svc.lifecycle.create_container(pod)
    again = await handler(
        create("k1", "k8s.io", via="cdi", pid=9, gpu_minors=(0,), annotations=annotations)
    )
    assert again == Reply(True)


class SlowLabels(Labels):
    async def labels(self, namespace: str, container_id: str) -> dict[str, str]:
        await asyncio.sleep(3600)
        return {}


async def test_a_create_that_cannot_answer_in_time_is_refused_and_reserves_nothing(monkeypatch):
    monkeypatch.setattr("nri_gpushare.daemon.local_api.ANSWER_WITHIN", 0.05)
    svc, _ = await make()
    reply = await LocalApiHandler(svc, SlowLabels())(create())
    assert not reply.ok and "not placed within" in reply.error
    assert svc.allocations == {}


async def test_a_share_whose_creator_went_away_is_released():
    svc, _ = await make()
    handler = LocalApiHandler(svc, Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}}))
    request = create()
    reply = await handler(request)
    assert "c1" in svc.allocations
    await handler.undelivered(request, reply)
    assert svc.allocations == {}


async def test_a_bind_the_module_refuses_fails_the_cdi_create_and_frees_the_share():
    from nri_gpushare.share.kernel import KmodError

    kmod = FakeKernelModule()
    svc, _ = await make(kmod_mode="required", kmod=kmod)
    kmod.fail_next["bind_cgroup"] = KmodError("no such cgroup", 2)
    labels = Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}})
    reply = await LocalApiHandler(svc, labels)(create(via="cdi", pid=9, gpu_minors=(0,)))
    assert not reply.ok and reply.reason == "kmod" and "bind" in reply.error
    assert svc.allocations == {} and kmod.regs == {}


async def test_nri_events_for_the_same_id_leave_a_hand_started_share_alone():
    from nri_gpushare.daemon.nri_handler import GpuShareHandler
    from nri_gpushare.nri.api import lite, nri

    svc, kmod = await make()
    await LocalApiHandler(svc, Labels({("default", "c1"): {P + "gpu-memory": "1Gi"}}))(create())
    handler = GpuShareHandler(svc)
    pod = lite.decode_pod_sandbox(bytes(nri.PodSandbox(id="p", name="p", namespace="n", uid="u")))
    twin = lite.decode_container(
        bytes(
            nri.Container(
                id="c1",
                pod_sandbox_id="p",
                name="m",
                linux=nri.LinuxContainer(cgroups_path="/k8s.io/c1"),
            )
        )
    )
    await handler.start_container(pod, twin)
    await handler.stop_container(pod, twin)
    await handler.remove_container(pod, twin)
    assert "c1" in svc.allocations and "c1" in kmod.regs
    assert "c1" not in kmod.cgroups  # never bound to the twin's cgroup
