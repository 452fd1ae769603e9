"""The containerd gRPC bindings (nri_gpushare/host/containerd/generated/): current
with scripts/gen-containerd.sh and the protos in trixie's
golang-github-containerd-containerd-dev, and encoding what the client sends and
decodes the way containerd's protos number it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from nri_gpushare.host.containerd.generated.containerd import events as ev
from nri_gpushare.host.containerd.generated.containerd.services.containers import v1 as containers
from nri_gpushare.host.containerd.generated.containerd.services.events import v1 as events
from nri_gpushare.host.containerd.generated.containerd.services.tasks import v1 as tasks
from nri_gpushare.host.containerd.generated.containerd.v1 import types as task_types
from tests.prereqs import missing

TOP = Path(__file__).resolve().parents[2]
GENERATED = TOP / "nri_gpushare" / "host" / "containerd" / "generated"
PLUGIN = TOP / ".venv" / "bin" / "protoc-gen-python_betterproto"
PROTOC = os.environ.get("PROTOC", "/usr/bin/protoc")
SRC = TOP / ".cache" / "trixie" / "root" / "usr" / "share" / "gocode" / "src"
PROTO = SRC / "github.com/containerd/containerd/api/services/containers/v1/containers.proto"
ANY = TOP / ".cache" / "trixie" / "root" / "usr" / "include" / "google" / "protobuf" / "any.proto"


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    if shutil.which(PROTOC) is None:
        missing(f"protoc not found at {PROTOC}")
    if not PLUGIN.is_file():
        missing(f"betterproto protoc plugin missing: {PLUGIN}")
    if not PROTO.is_file() or not ANY.is_file():
        missing("containerd protos (golang-github-containerd-containerd-dev, libprotobuf-dev)")
    out = tmp_path / "generated"
    done = subprocess.run(
        [TOP / "scripts" / "gen-containerd.sh", out], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    fresh, committed = _tree(out), _tree(GENERATED)
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run scripts/gen-containerd.sh; out of date: {stale}"


def test_get_container_request_is_field_1() -> None:
    assert bytes(containers.GetContainerRequest(id="c1")) == b"\x0a\x02c1"


def test_container_labels_and_runtime_numbers() -> None:
    # Container: id = 1, labels = 2 (map), runtime = 4 {name = 1}.
    data = b"\x0a\x01c" + b"\x12\x08\x0a\x01k\x12\x03v=1" + b"\x22\x11\x0a\x0fio.containerd.x"
    back = containers.Container().parse(data)
    assert (back.id, back.labels, back.runtime.name) == ("c", {"k": "v=1"}, "io.containerd.x")


def test_subscribe_filters_and_envelope_numbers() -> None:
    assert bytes(events.SubscribeRequest(filters=['topic=="/tasks/exit"'])) == (
        b'\x0a\x14topic=="/tasks/exit"'  # 20 bytes
    )
    # Envelope: namespace = 2, topic = 3, event = 4 (Any: type_url = 1, value = 2).
    payload = bytes(ev.TaskExit(container_id="c", id="c", pid=7, exit_status=137))
    any_ = b"\x0a\x1acontainerd.events.TaskExit" + b"\x12" + bytes([len(payload)]) + payload
    data = b"\x12\x02ns\x1a\x0b/tasks/exit\x22" + bytes([len(any_)]) + any_
    env = events.Envelope().parse(data)
    assert (env.namespace, env.topic, env.event.type_url) == (
        "ns",
        "/tasks/exit",
        "containerd.events.TaskExit",
    )
    exit_ = ev.TaskExit().parse(env.event.value)
    assert (exit_.container_id, exit_.pid, exit_.exit_status) == ("c", 7, 137)


def test_task_event_field_numbers() -> None:
    # TaskExit: container_id 1, id 2, pid 3, exit_status 4.
    assert bytes(ev.TaskExit(container_id="a", id="b", pid=1, exit_status=2)) == (
        b"\x0a\x01a\x12\x01b\x18\x01\x20\x02"
    )
    # TaskDelete: container_id 1, pid 2, exit_status 3, id 5.
    assert bytes(ev.TaskDelete(container_id="a", pid=1, exit_status=2, id="b")) == (
        b"\x0a\x01a\x10\x01\x18\x02\x2a\x01b"
    )
    assert bytes(ev.ContainerDelete(id="a")) == b"\x0a\x01a"


def test_list_tasks_numbers() -> None:
    # ListTasksRequest: filter = 1; ListTasksResponse: tasks = 1 (Process: container_id 1,
    # id 2, pid 3, status 4 = containerd.v1.types.Status, RUNNING = 2, STOPPED = 3).
    assert bytes(tasks.ListTasksRequest(filter="x")) == b"\x0a\x01x"
    data = b"\x0a\x07\x12\x01c\x18\x64\x20\x02" + b"\x0a\x05\x12\x01d\x20\x03"
    running, stopped = tasks.ListTasksResponse().parse(data).tasks
    assert (running.id, running.pid, running.status) == ("c", 100, task_types.Status.RUNNING)
    assert (stopped.id, stopped.status) == ("d", task_types.Status.STOPPED)
    assert [s.value for s in task_types.Status] == [0, 1, 2, 3, 4, 5]
