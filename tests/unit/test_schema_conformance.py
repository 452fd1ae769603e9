"""Our hand-written nri.proto against the canonical NRI schema.

The references are pkg/api/api.proto of NRI v0.6.1 (containerd 1.7.24) from
Debian trixie's golang-github-containerd-nri-dev and of NRI v0.8.0 (containerd
2.1) from sid's, which scripts/install-prereqs.sh extracts under .cache/trixie
and .cache/sid. The files are compiled by protoc into descriptor sets and
compared: every message, field, enum value and RPC of a reference must be in
ours, identical in number, type and label. Later NRI additions, which the
references predate, are checked against a table of known numbers (and, for
v0.10-v0.12, byte for byte in test_nri_upstream.py).

A missing prerequisite fails the test unless GPUSHARE_ALLOW_SKIP=1 and CI is
not "true".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from betterproto.lib.google.protobuf import (
    DescriptorProto,
    FieldDescriptorProto,
    FieldDescriptorProtoLabel,
    FieldDescriptorProtoType,
    FileDescriptorProto,
    FileDescriptorSet,
)

from tests.prereqs import missing

TOP = Path(__file__).resolve().parents[2]
OURS = TOP / "nri_gpushare" / "nri" / "api" / "nri.proto"
NRI_PROTO = "usr/share/gocode/src/github.com/containerd/nri/pkg/api/api.proto"
CANONICAL = {
    "v0.6.1": TOP / ".cache/trixie/root" / NRI_PROTO,
    "v0.8.0": TOP / ".cache/sid/root" / NRI_PROTO,
}
PROTOC = os.environ.get("PROTOC", "/usr/bin/protoc")
PACKAGE = "nri.pkg.api.v1alpha1"

T = FieldDescriptorProtoType
REPEATED = FieldDescriptorProtoLabel.LABEL_REPEATED
OPTIONAL = FieldDescriptorProtoLabel.LABEL_OPTIONAL


def _require(ok: bool, msg: str) -> None:
    if not ok:
        missing(msg)


def _compile(proto: Path, tmp: Path) -> FileDescriptorProto:
    _require(shutil.which(PROTOC) is not None, f"protoc not found at {PROTOC}")
    out = tmp / (proto.stem + ".pb")
    subprocess.run(
        [PROTOC, f"-I{proto.parent}", f"--descriptor_set_out={out}", proto.name],
        check=True,
        capture_output=True,
    )
    (fd,) = FileDescriptorSet().parse(out.read_bytes()).file
    return fd


class Schema:
    """Messages, enums and services of one compiled .proto, by full name."""

    def __init__(self, fd: FileDescriptorProto) -> None:
        self.package = fd.package
        self.messages: dict[str, DescriptorProto] = {}
        self.enums: dict[str, dict[str, int]] = {}
        for enum in fd.enum_type:
            self.enums[enum.name] = {v.name: v.number for v in enum.value}
        for msg in fd.message_type:
            self._add(msg, "")
        self.rpcs: dict[str, tuple[str, str]] = {
            f"{svc.name}.{m.name}": (m.input_type, m.output_type)
            for svc in fd.service
            for m in svc.method
        }

    def _add(self, msg: DescriptorProto, prefix: str) -> None:
        name = prefix + msg.name
        self.messages[name] = msg
        for enum in msg.enum_type:
            self.enums[f"{name}.{enum.name}"] = {v.name: v.number for v in enum.value}
        for nested in msg.nested_type:
            self._add(nested, name + ".")

    def field(self, message: str, name: str) -> FieldDescriptorProto:
        for f in self.messages[message].field:
            if f.name == name:
                return f
        raise KeyError(f"{message}.{name}")


def _shape(f: FieldDescriptorProto) -> tuple[int, T, str, FieldDescriptorProtoLabel]:
    return f.number, f.type, f.type_name, f.label


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    return Schema(_compile(OURS, tmp_path_factory.mktemp("ours")))


@pytest.fixture(scope="module", params=sorted(CANONICAL))
def schemas(
    request: pytest.FixtureRequest, ours: Schema, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Schema, Schema]:
    canonical = CANONICAL[request.param]
    _require(canonical.is_file(), f"canonical NRI schema missing: {canonical}")
    return ours, Schema(_compile(canonical, tmp_path_factory.mktemp("canonical")))


def test_same_package(schemas: tuple[Schema, Schema]) -> None:
    ours, canon = schemas
    assert ours.package == canon.package == PACKAGE


def test_every_canonical_message_and_field_matches(schemas: tuple[Schema, Schema]) -> None:
    ours, canon = schemas
    problems = []
    for name, cmsg in canon.messages.items():
        if name not in ours.messages:
            problems.append(f"missing message {name}")
            continue
        mine = {f.number: f for f in ours.messages[name].field}
        for cf in cmsg.field:
            f = mine.get(cf.number)
            if f is None:
                problems.append(f"{name}: missing field {cf.name} = {cf.number}")
            elif (f.name, _shape(f)) != (cf.name, _shape(cf)):
                problems.append(
                    f"{name}: field {cf.number} is {f.name} {_shape(f)},"
                    f" canonical {cf.name} {_shape(cf)}"
                )
    assert not problems, "\n".join(problems)


def test_shared_field_names_have_the_same_numbers(schemas: tuple[Schema, Schema]) -> None:
    ours, canon = schemas
    for name in canon.messages.keys() & ours.messages.keys():
        cnum = {f.name: f.number for f in canon.messages[name].field}
        for f in ours.messages[name].field:
            assert cnum.get(f.name, f.number) == f.number, f"{name}.{f.name}"


def test_every_canonical_enum_value_matches(schemas: tuple[Schema, Schema]) -> None:
    ours, canon = schemas
    for enum, values in canon.enums.items():
        assert enum in ours.enums, enum
        for value, number in values.items():
            if (enum, value) == ("Event", "LAST"):
                continue  # a sentinel that moves up as events are added
            assert ours.enums[enum].get(value) == number, f"{enum}.{value}"


def test_every_canonical_rpc_matches(schemas: tuple[Schema, Schema]) -> None:
    ours, canon = schemas
    for rpc, types in canon.rpcs.items():
        assert ours.rpcs.get(rpc) == types, rpc


# Fields added after NRI v0.6.1 (field numbers from the NRI releases that
# introduced them): message, field, number, type, repeated.
LATER_FIELDS = [
    ("RegisterPluginRequest", "NRI_version", 3, T.TYPE_STRING, False),
    ("ConfigureRequest", "registration_timeout", 4, T.TYPE_INT64, False),
    ("ConfigureRequest", "request_timeout", 5, T.TYPE_INT64, False),
    ("ConfigureRequest", "NRI_version", 6, T.TYPE_STRING, False),
    ("SynchronizeRequest", "more", 3, T.TYPE_BOOL, False),
    ("SynchronizeResponse", "more", 2, T.TYPE_BOOL, False),
    ("PodSandbox", "ips", 10, T.TYPE_STRING, True),
    ("Container", "created_at", 14, T.TYPE_INT64, False),
    ("Container", "started_at", 15, T.TYPE_INT64, False),
    ("Container", "finished_at", 16, T.TYPE_INT64, False),
    ("Container", "exit_code", 17, T.TYPE_INT32, False),
    ("Container", "status_reason", 18, T.TYPE_STRING, False),
    ("Container", "status_message", 19, T.TYPE_STRING, False),
    ("Container", "CDI_devices", 20, T.TYPE_MESSAGE, True),
    ("Container", "user", 21, T.TYPE_MESSAGE, False),
    ("User", "uid", 1, T.TYPE_UINT32, False),
    ("User", "gid", 2, T.TYPE_UINT32, False),
    ("User", "additional_gids", 3, T.TYPE_UINT32, True),
    ("CDIDevice", "name", 1, T.TYPE_STRING, False),
    ("LinuxResources", "pids", 8, T.TYPE_MESSAGE, False),
    ("LinuxPids", "limit", 1, T.TYPE_INT64, False),
    ("ContainerAdjustment", "CDI_devices", 8, T.TYPE_MESSAGE, True),
    ("ContainerAdjustment", "args", 9, T.TYPE_STRING, True),
    ("LinuxContainerAdjustment", "oom_score_adj", 4, T.TYPE_MESSAGE, False),
    ("UpdatePodSandboxRequest", "pod", 1, T.TYPE_MESSAGE, False),
    ("UpdatePodSandboxRequest", "overhead_linux_resources", 2, T.TYPE_MESSAGE, False),
    ("UpdatePodSandboxRequest", "linux_resources", 3, T.TYPE_MESSAGE, False),
    ("ValidateContainerAdjustmentRequest", "adjust", 3, T.TYPE_MESSAGE, False),
    ("ValidateContainerAdjustmentRequest", "owners", 5, T.TYPE_MESSAGE, False),
    ("ValidateContainerAdjustmentRequest", "plugins", 6, T.TYPE_MESSAGE, True),
    ("ValidateContainerAdjustmentResponse", "reject", 1, T.TYPE_BOOL, False),
    ("ValidateContainerAdjustmentResponse", "reason", 2, T.TYPE_STRING, False),
]


@pytest.mark.parametrize(("message", "name", "number", "type_", "repeated"), LATER_FIELDS)
def test_later_nri_fields(
    ours: Schema, message: str, name: str, number: int, type_: T, repeated: bool
) -> None:
    f = ours.field(message, name)
    assert (f.number, f.type, f.label) == (number, type_, REPEATED if repeated else OPTIONAL)


def test_later_events(ours: Schema) -> None:
    event = ours.enums["Event"]
    assert event["UPDATE_POD_SANDBOX"] == 12
    assert event["POST_UPDATE_POD_SANDBOX"] == 13
    assert event["VALIDATE_CONTAINER_ADJUSTMENT"] == 14
    assert event["LAST"] == max(event.values())


def _rpc(request: str, response: str) -> tuple[str, str]:
    return f".{PACKAGE}.{request}", f".{PACKAGE}.{response}"


def test_per_event_rpcs(ours: Schema) -> None:
    for method in [
        "RunPodSandbox",
        "UpdatePodSandbox",
        "PostUpdatePodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "PostCreateContainer",
        "StartContainer",
        "PostStartContainer",
        "PostUpdateContainer",
        "RemoveContainer",
        "ValidateContainerAdjustment",
    ]:
        assert ours.rpcs[f"Plugin.{method}"] == _rpc(method + "Request", method + "Response")
    assert ours.rpcs["Plugin.StateChange"] == _rpc("StateChangeEvent", "Empty")
    assert ours.rpcs["Runtime.RegisterPlugin"] == _rpc("RegisterPluginRequest", "Empty")


# Everything the plugin and its stub build or read.
NEEDED = """
    RegisterPluginRequest Empty ConfigureRequest ConfigureResponse
    SynchronizeRequest SynchronizeResponse CreateContainerRequest
    CreateContainerResponse UpdateContainerRequest UpdateContainerResponse
    StopContainerRequest StopContainerResponse StateChangeEvent
    UpdateContainersRequest UpdateContainersResponse PodSandbox LinuxPodSandbox
    Container LinuxContainer ContainerAdjustment LinuxContainerAdjustment
    LinuxDevice LinuxDeviceCgroup LinuxResources LinuxMemory LinuxCPU LinuxPids
    HugepageLimit Mount Hooks Hook KeyValue ContainerUpdate LinuxContainerUpdate
    ContainerEviction POSIXRlimit CDIDevice LinuxNamespace OptionalString
    OptionalInt OptionalInt32 OptionalUInt32 OptionalInt64 OptionalUInt64
    OptionalBool OptionalFileMode
""".split()


def test_defines_every_message_the_plugin_needs(ours: Schema) -> None:
    assert not set(NEEDED) - ours.messages.keys()
    assert {"Event", "ContainerState"} <= ours.enums.keys()


def test_optional_wrappers_hold_one_value_field(ours: Schema) -> None:
    for name in NEEDED:
        if name.startswith("Optional"):
            (f,) = ours.messages[name].field
            assert (f.name, f.number) == ("value", 1), name
