"""The generated device-plugin bindings (nri_gpushare/k8s/generated): up to
date with the proto, and on the wire with the kubelet API's published field
numbers (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto) and method
paths, encoded here by hand."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from nri_gpushare.k8s.generated import v1beta1 as pb
from tests.unit.test_schema_bindings import PLUGIN, PROTOC, TOP, _require, _tree

GENERATED = TOP / "nri_gpushare" / "k8s" / "generated"


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    _require(shutil.which(PROTOC) is not None, f"protoc not found at {PROTOC}")
    _require(PLUGIN.is_file(), f"betterproto protoc plugin missing: {PLUGIN}")
    out = tmp_path / "generated"
    subprocess.run([TOP / "scripts" / "gen-deviceplugin.sh", out], check=True, capture_output=True)
    fresh = _tree(out)
    # dra/ is scripts/gen-dra.sh's (tests/unit/test_dra_kubelet.py checks it).
    committed = {k: v for k, v in _tree(GENERATED).items() if not k.startswith("dra/")}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run scripts/gen-deviceplugin.sh; out of date: {stale}"


def test_register_request_fields_1_to_4() -> None:
    request = pb.RegisterRequest(
        version="v1beta1",
        endpoint="e.sock",
        resource_name="gpushare.io/gpu-core",
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    assert bytes(request) == (
        b"\x0a\x07v1beta1"  # version = 1
        b"\x12\x06e.sock"  # endpoint = 2
        b"\x1a\x14gpushare.io/gpu-core"  # resource_name = 3
        b"\x22\x02\x10\x01"  # options = 4 {get_preferred_allocation_available = 2}
    )
    assert bytes(pb.DevicePluginOptions(pre_start_required=True)) == b"\x08\x01"


def test_allocate_response_annotations_are_field_4() -> None:
    response = pb.ContainerAllocateResponse(annotations={"a": "b"})
    assert bytes(response) == b"\x22\x06\x0a\x01a\x12\x01b"  # annotations = 4 {key 1, value 2}
    assert bytes(pb.ContainerAllocateResponse(envs={"K": "V"})) == b"\x0a\x06\x0a\x01K\x12\x01V"
    outer = pb.AllocateResponse(container_responses=[response])
    assert bytes(outer) == b"\x0a\x08" + bytes(response)  # container_responses = 1
    back = pb.AllocateResponse().parse(bytes(outer))
    assert back.container_responses[0].annotations == {"a": "b"}


def test_requests_as_the_kubelet_encodes_them() -> None:
    allocate = b"\x0a\x06\x0a\x010\x0a\x017"  # container_requests = 1 {devices_ids = 1: 0, 7}
    parsed = pb.AllocateRequest().parse(allocate)
    assert [list(c.devices_ids) for c in parsed.container_requests] == [["0", "7"]]
    preferred = b"\x0a\x08\x0a\x011\x12\x012\x18\x02"  # available 1, must_include 2, size 3
    (container,) = pb.PreferredAllocationRequest().parse(preferred).container_requests
    assert list(container.available_device_i_ds) == ["1"]
    assert list(container.must_include_device_i_ds) == ["2"]
    assert container.allocation_size == 2
    reply = pb.ContainerPreferredAllocationResponse(device_i_ds=["3"])
    assert bytes(reply) == b"\x0a\x013"


def test_list_and_watch_response() -> None:
    response = pb.ListAndWatchResponse(devices=[pb.Device(id="0", health="Healthy")])
    device = b"\x0a\x010\x12\x07Healthy"  # ID = 1, health = 2
    assert bytes(response) == b"\x0a" + bytes([len(device)]) + device


def test_method_paths() -> None:
    assert set(pb.RegistrationBase().__mapping__()) == {"/v1beta1.Registration/Register"}
    assert set(pb.DevicePluginBase().__mapping__()) == {
        f"/v1beta1.DevicePlugin/{name}"
        for name in (
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        )
    }
