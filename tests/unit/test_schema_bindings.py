"""The generated betterproto bindings: up to date, named as documented, and
encoding the NRI messages the plugin sends the way the protocol says."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import betterproto

from nri_gpushare.nri.api import nri
from tests.prereqs import missing

TOP = Path(__file__).resolve().parents[2]
GENERATED = TOP / "nri_gpushare" / "nri" / "api" / "generated"
PLUGIN = TOP / ".venv" / "bin" / "protoc-gen-python_betterproto"
PROTOC = os.environ.get("PROTOC", "/usr/bin/protoc")


def _require(ok: bool, msg: str) -> None:
    if not ok:
        missing(msg)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    _require(shutil.which(PROTOC) is not None, f"protoc not found at {PROTOC}")
    _require(PLUGIN.is_file(), f"betterproto protoc plugin missing: {PLUGIN}")
    out = tmp_path / "generated"
    subprocess.run([TOP / "scripts" / "gen-protos.sh", out], check=True, capture_output=True)
    fresh, committed = _tree(out), _tree(GENERATED)
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run scripts/gen-protos.sh; out of date: {stale}"


def test_generated_names() -> None:
    assert "cdi_devices" in nri.Container.__dataclass_fields__
    assert "cdi_devices" in nri.ContainerAdjustment.__dataclass_fields__
    assert "nri_version" in nri.RegisterPluginRequest.__dataclass_fields__
    assert "nri_version" in nri.ConfigureRequest.__dataclass_fields__
    assert "class_" in nri.LinuxIoPriority.__dataclass_fields__
    for name in ["LinuxCpu", "CdiDevice", "PosixRlimit", "IoPrioClass", "OptionalFileMode"]:
        assert hasattr(nri, name), name
    assert nri.Event.VALIDATE_CONTAINER_ADJUSTMENT == 14
    assert nri.ContainerState.CONTAINER_RUNNING == 3


def test_configure_response_events_is_field_2() -> None:
    mask = 1 << (nri.Event.CREATE_CONTAINER - 1) | 1 << (nri.Event.STOP_CONTAINER - 1)
    data = bytes(nri.ConfigureResponse(events=mask))
    assert data == b"\x10\x88\x04"  # field 2, varint 0x208
    assert nri.ConfigureResponse().parse(data).events == mask


def _adjustment() -> nri.ContainerAdjustment:
    device = nri.LinuxDevice(
        path="/dev/nvidia0",
        type="c",
        major=195,
        minor=0,
        file_mode=nri.OptionalFileMode(value=0o666),
    )
    return nri.ContainerAdjustment(
        annotations={"a": "b"},
        env=[nri.KeyValue(key="K", value="V")],
        linux=nri.LinuxContainerAdjustment(devices=[device]),
    )


# The same adjustment, encoded by hand from the field numbers.
_DEVICE = (
    b"\x0a\x0c/dev/nvidia0"  # path = 1
    b"\x12\x01c"  # type = 2
    b"\x18\xc3\x01"  # major = 3: 195 (minor 0 is the default, left out)
    b"\x2a\x03\x08\xb6\x03"  # file_mode = 5 {value = 1: 0o666}
)
_LINUX = b"\x0a" + bytes([len(_DEVICE)]) + _DEVICE  # devices = 1
_ADJUST = (
    b"\x12\x06\x0a\x01a\x12\x01b"  # annotations = 2 {"a": "b"}
    b"\x22\x06\x0a\x01K\x12\x01V"  # env = 4 [{key "K", value "V"}]
    + b"\x32"
    + bytes([len(_LINUX)])
    + _LINUX  # linux = 6
)


def test_create_container_response_with_adjustment() -> None:
    data = bytes(nri.CreateContainerResponse(adjust=_adjustment()))
    assert data == b"\x0a" + bytes([len(_ADJUST)]) + _ADJUST  # adjust = 1

    back = nri.CreateContainerResponse().parse(data)
    assert back.adjust.annotations == {"a": "b"}
    assert [(kv.key, kv.value) for kv in back.adjust.env] == [("K", "V")]
    (dev,) = back.adjust.linux.devices
    assert (dev.path, dev.type, dev.major, dev.minor) == ("/dev/nvidia0", "c", 195, 0)
    assert dev.file_mode.value == 0o666
    assert back.update == [] and back.evict == []


def test_optional_wrapper_presence() -> None:
    dev = nri.LinuxDevice().parse(bytes(_adjustment().linux.devices[0]))
    assert betterproto.serialized_on_wire(dev.file_mode)
    assert not betterproto.serialized_on_wire(dev.uid)
    # An explicit zero is sent and seen; an empty wrapper is not sent at all.
    rule = nri.LinuxDeviceCgroup(allow=True, major=nri.OptionalInt64(value=0))
    back = nri.LinuxDeviceCgroup().parse(bytes(rule))
    assert betterproto.serialized_on_wire(back.major) and back.major.value == 0
    assert not betterproto.serialized_on_wire(back.minor)
    assert bytes(nri.LinuxDeviceCgroup(major=nri.OptionalInt64())) == b""


def test_unknown_fields_are_skipped() -> None:
    known = bytes(nri.Container(id="c1", pod_sandbox_id="p1"))
    newer = known + b"\xb8\x06\x01" + b"\xc2\x06\x02hi"  # fields 103 (varint), 104 (bytes)
    back = nri.Container().parse(newer)
    assert (back.id, back.pod_sandbox_id) == ("c1", "p1")


def test_container_and_pod_round_trip() -> None:
    pod = nri.PodSandbox(id="p", namespace="ns", annotations={"gpushare/request": "0.5"})
    ctr = nri.Container(
        id="c",
        pod_sandbox_id="p",
        state=nri.ContainerState.CONTAINER_CREATED,
        env=["A=1"],
        user=nri.User(uid=1000, additional_gids=[4, 5]),
        cdi_devices=[nri.CdiDevice(name="vendor.example/gpu=0")],
    )
    req = nri.CreateContainerRequest().parse(bytes(nri.CreateContainerRequest(pod, ctr)))
    assert req.pod.annotations == {"gpushare/request": "0.5"}
    assert req.container.state == nri.ContainerState.CONTAINER_CREATED
    assert req.container.user.additional_gids == [4, 5]
    assert req.container.cdi_devices[0].name == "vendor.example/gpu=0"
