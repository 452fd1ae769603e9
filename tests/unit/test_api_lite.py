"""The hot-path codec (nri_gpushare.nri.api.lite) against betterproto: views decode
what betterproto decodes, encoders emit exactly betterproto's bytes, and
malformed input only ever raises DecodeError."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_gpushare.nri.api import lite, nri
from nri_gpushare.nri.api.lite import Adjustment, DecodeError, Device, MountSpec
from nri_gpushare.nri.wire import pb as lite_pb
from tests.unit.test_fuzz_common import allocates_at_most

PAYLOAD = (Path(__file__).parent / "data" / "create_container_request.bin").read_bytes()
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- helpers -----------------------------------------------------------------


def assert_pod(view: lite.PodSandboxView, pod: nri.PodSandbox) -> None:
    assert (view.id, view.name, view.uid, view.namespace) == (
        pod.id,
        pod.name,
        pod.uid,
        pod.namespace,
    )
    assert view.labels == pod.labels
    assert view.annotations == pod.annotations
    assert view.message() == pod


def assert_container(view: lite.ContainerView, ctr: nri.Container) -> None:
    assert (view.id, view.pod_sandbox_id, view.name) == (ctr.id, ctr.pod_sandbox_id, ctr.name)
    assert view.state == int(ctr.state)
    assert view.labels == ctr.labels
    assert view.annotations == ctr.annotations
    assert view.env == ctr.env
    assert view.cgroups_path == ctr.linux.cgroups_path
    assert view.pid == ctr.pid
    assert view.message() == ctr


def read(view: object) -> object:
    """Read every field of a request view and of its pod and container (the
    views decode lazily: a malformed part raises at its first read)."""
    for name in ("pod", "container"):
        part = getattr(view, name, None)
        if part is not None:
            read(part)
    for name in getattr(view, "_fields", ()):
        getattr(view, name)
    return view


def decode_read(decode: Callable[[bytes], object], data: bytes) -> object:
    return read(decode(data))


def bp_device(d: Device) -> nri.LinuxDevice:
    def opt(cls, value):
        return None if value is None else cls(value=value)

    return nri.LinuxDevice(
        path=d.path,
        type=d.type,
        major=d.major,
        minor=d.minor,
        file_mode=opt(nri.OptionalFileMode, d.file_mode),
        uid=opt(nri.OptionalUInt32, d.uid),
        gid=opt(nri.OptionalUInt32, d.gid),
    )


def bp_adjustment(a: Adjustment) -> nri.ContainerAdjustment:
    """The betterproto message lite.encode_container_adjustment stands for."""
    return nri.ContainerAdjustment(
        annotations=dict(a.annotations),
        mounts=[
            nri.Mount(
                destination=m.destination, type=m.type, source=m.source, options=list(m.options)
            )
            for m in a.mounts
        ],
        env=[nri.KeyValue(key=k, value=v) for k, v in a.env],
        linux=(
            nri.LinuxContainerAdjustment(devices=[bp_device(d) for d in a.devices])
            if a.devices
            else None
        ),
    )


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field with a one-byte key and length."""
    assert field < 16 and len(payload) < 128
    return bytes((field << 3 | 2, len(payload))) + payload


# -- strategies ----------------------------------------------------------------

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT32 = st.integers(0, (1 << 32) - 1)
words = st.text(max_size=12)
long_words = st.text(max_size=150)  # lengths past one varint byte
str_maps = st.dictionaries(st.one_of(words, long_words), words, max_size=4)
str_lists = st.lists(words, max_size=4)

opt_int64 = st.one_of(st.none(), st.builds(nri.OptionalInt64, value=INT64))
resources = st.builds(
    nri.LinuxResources,
    memory=st.one_of(st.none(), st.builds(nri.LinuxMemory, limit=opt_int64, swap=opt_int64)),
    unified=str_maps,
    pids=st.one_of(st.none(), st.builds(nri.LinuxPids, limit=INT64)),
)
mounts = st.builds(nri.Mount, destination=words, type=words, source=words, options=str_lists)
devices = st.builds(
    nri.LinuxDevice,
    path=words,
    type=st.sampled_from(["c", "b", ""]),
    major=INT64,
    minor=INT64,
    file_mode=st.one_of(st.none(), st.builds(nri.OptionalFileMode, value=UINT32)),
)
linux_container = st.builds(
    nri.LinuxContainer,
    namespaces=st.lists(st.builds(nri.LinuxNamespace, type=words, path=words), max_size=2),
    devices=st.lists(devices, max_size=2),
    resources=st.one_of(st.none(), resources),
    cgroups_path=st.one_of(words, long_words),
    sysctl=str_maps,
)
pods = st.builds(
    nri.PodSandbox,
    id=words,
    name=words,
    uid=words,
    namespace=long_words,
    labels=str_maps,
    annotations=str_maps,
    runtime_handler=words,
    linux=st.one_of(
        st.none(), st.builds(nri.LinuxPodSandbox, cgroup_parent=words, resources=resources)
    ),
    pid=UINT32,
    ips=str_lists,
)
containers = st.builds(
    nri.Container,
    id=words,
    pod_sandbox_id=words,
    name=long_words,
    state=st.sampled_from(list(nri.ContainerState)),
    labels=str_maps,
    annotations=str_maps,
    args=str_lists,
    env=st.lists(st.one_of(words, long_words), max_size=6),
    mounts=st.lists(mounts, max_size=3),
    hooks=st.one_of(
        st.none(),
        st.builds(
            nri.Hooks,
            prestart=st.lists(st.builds(nri.Hook, path=words, args=str_lists), max_size=2),
        ),
    ),
    linux=st.one_of(st.none(), linux_container),
    pid=UINT32,
    rlimits=st.lists(
        st.builds(nri.PosixRlimit, type=words, hard=st.integers(0, (1 << 64) - 1)), max_size=2
    ),
    created_at=INT64,
    exit_code=st.integers(-(1 << 31), (1 << 31) - 1),
    status_message=words,
    cdi_devices=st.lists(st.builds(nri.CdiDevice, name=words), max_size=2),
)

lite_devices = st.builds(
    Device,
    path=words,
    type=st.sampled_from(["c", "b", "u", "p", ""]),
    major=INT64,
    minor=INT64,
    file_mode=st.one_of(st.none(), UINT32),
    uid=st.one_of(st.none(), UINT32),
    gid=st.one_of(st.none(), UINT32),
)
lite_mounts = st.builds(
    MountSpec,
    destination=words,
    type=words,
    source=words,
    options=st.lists(words, max_size=4).map(tuple),
)
adjustments = st.builds(
    Adjustment,
    annotations=str_maps,
    env=st.lists(st.tuples(words, words), max_size=6),
    devices=st.lists(lite_devices, max_size=5),
    mounts=st.lists(lite_mounts, max_size=3),
)
updates = st.lists(
    st.builds(
        nri.ContainerUpdate,
        container_id=words,
        ignore_failure=st.booleans(),
        linux=st.one_of(st.none(), st.builds(nri.LinuxContainerUpdate, resources=resources)),
    ).map(bytes),
    max_size=3,
)
evictions = st.lists(
    st.builds(nri.ContainerEviction, container_id=words, reason=words).map(bytes), max_size=2
)


# -- the captured CreateContainerRequest ---------------------------------------


def test_real_create_container_request() -> None:
    want = nri.CreateContainerRequest().parse(PAYLOAD)
    got = lite.decode_create_container_request(PAYLOAD)
    assert_pod(got.pod, want.pod)
    assert_container(got.container, want.container)
    # Spot checks, so that a betterproto regression cannot hide a lite one.
    assert got.pod.name == "p" and got.container.name == "c2"
    assert got.pod.annotations["gpushare.io/gpu-memory"] == "1Gi"
    assert got.container.cgroups_path == f"/k8s.io/{got.container.id}"
    assert "HOSTNAME=vm" in got.container.env
    # The raw bytes are exactly the pod and container fields' payloads.
    assert bytes(want.pod) == got.pod.raw and bytes(want.container) == got.container.raw


def test_real_payload_through_the_other_container_decoders() -> None:
    want = lite.decode_create_container_request(PAYLOAD)
    assert lite.decode_stop_container_request(PAYLOAD) == want
    generic = lite.decode_pod_container_request(PAYLOAD, "StartContainerRequest")
    assert (generic.pod, generic.container) == (want.pod, want.container)
    assert lite.decode_pod_request(PAYLOAD) == want.pod


def test_message_is_parsed_once() -> None:
    view = lite.decode_create_container_request(PAYLOAD).container
    assert view.message() is view.message()


def test_every_truncation_is_refused() -> None:
    for cut in range(len(PAYLOAD)):
        with pytest.raises(DecodeError):
            decode_read(lite.decode_create_container_request, PAYLOAD[:cut])


# -- round trips against betterproto ----------------------------------------------


@FEW
@given(pods, containers)
def test_create_container_request_matches_betterproto(
    pod: nri.PodSandbox, ctr: nri.Container
) -> None:
    data = bytes(nri.CreateContainerRequest(pod=pod, container=ctr))
    want = nri.CreateContainerRequest().parse(data)
    got = lite.decode_create_container_request(data)
    assert_pod(got.pod, want.pod)
    assert_container(got.container, want.container)


@settings(max_examples=25, deadline=None)
@given(st.lists(pods, max_size=3), st.lists(containers, max_size=3), st.booleans())
def test_synchronize_request_matches_betterproto(
    pod_list: list[nri.PodSandbox], ctr_list: list[nri.Container], more: bool
) -> None:
    data = bytes(nri.SynchronizeRequest(pods=pod_list, containers=ctr_list, more=more))
    want = nri.SynchronizeRequest().parse(data)
    got_pods, got_containers, got_more = lite.decode_synchronize_request(data)
    assert got_more == want.more
    assert len(got_pods) == len(want.pods) and len(got_containers) == len(want.containers)
    for view, pod in zip(got_pods, want.pods, strict=True):
        assert_pod(view, pod)
    for view, ctr in zip(got_containers, want.containers, strict=True):
        assert_container(view, ctr)


@FEW
@given(words, words, long_words, INT64, INT64, words)
def test_configure_request_matches_betterproto(
    config: str, name: str, version: str, reg: int, req: int, nri_version: str
) -> None:
    msg = nri.ConfigureRequest(
        config=config,
        runtime_name=name,
        runtime_version=version,
        registration_timeout=reg,
        request_timeout=req,
        nri_version=nri_version,
    )
    got = lite.decode_configure_request(bytes(msg))
    assert (got.config, got.runtime_name, got.runtime_version) == (config, name, version)
    assert (got.registration_timeout, got.request_timeout) == (reg, req)
    assert got.nri_version == nri_version
    assert got.message() == msg


@settings(max_examples=30, deadline=None)
@given(pods, containers, st.one_of(st.none(), resources))
def test_update_container_request_matches_betterproto(
    pod: nri.PodSandbox, ctr: nri.Container, res: nri.LinuxResources | None
) -> None:
    data = bytes(nri.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=res))
    want = nri.UpdateContainerRequest().parse(data)
    got = lite.decode_update_container_request(data)
    assert_pod(got.pod, want.pod)
    assert_container(got.container, want.container)
    if got.linux_resources is None:
        assert res is None or bytes(res) == b""
        assert got.linux_resources_message() is None
    else:
        assert got.linux_resources_message() == want.linux_resources


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(list(nri.Event)), pods, st.one_of(st.none(), containers))
def test_state_change_matches_betterproto(
    event: nri.Event, pod: nri.PodSandbox, ctr: nri.Container | None
) -> None:
    data = bytes(nri.StateChangeEvent(event=event, pod=pod, container=ctr))
    want = nri.StateChangeEvent().parse(data)
    got = lite.decode_state_change(data)
    assert got.event == event
    assert_pod(got.pod, want.pod)
    if ctr is None:
        assert got.container is None
    else:
        assert got.container is not None
        assert_container(got.container, want.container)


@settings(max_examples=30, deadline=None)
@given(pods, st.one_of(st.none(), containers))
def test_pod_container_request_matches_betterproto(
    pod: nri.PodSandbox, ctr: nri.Container | None
) -> None:
    data = bytes(nri.StartContainerRequest(pod=pod, container=ctr))
    got = lite.decode_pod_container_request(data)
    assert_pod(got.pod, nri.PodSandbox().parse(bytes(pod)))
    if ctr is None:
        assert got.container is None
    else:
        assert got.container is not None
        assert_container(got.container, nri.Container().parse(bytes(ctr)))


@settings(max_examples=20, deadline=None)
@given(pods, resources)
def test_pod_request_skips_resources(pod: nri.PodSandbox, res: nri.LinuxResources) -> None:
    data = bytes(
        nri.UpdatePodSandboxRequest(pod=pod, overhead_linux_resources=res, linux_resources=res)
    )
    got = lite.decode_pod_request(data, "UpdatePodSandboxRequest")
    assert_pod(got, nri.PodSandbox().parse(bytes(pod)))


@settings(max_examples=30, deadline=None)
@given(pods, st.one_of(st.none(), resources), st.one_of(st.none(), resources))
def test_update_pod_sandbox_request_matches_betterproto(
    pod: nri.PodSandbox, overhead: nri.LinuxResources | None, res: nri.LinuxResources | None
) -> None:
    data = bytes(
        nri.UpdatePodSandboxRequest(pod=pod, overhead_linux_resources=overhead, linux_resources=res)
    )
    want = nri.UpdatePodSandboxRequest().parse(data)
    got = lite.decode_update_pod_sandbox_request(data)
    assert_pod(got.pod, want.pod)
    for raw, message, sent in (
        (got.overhead_linux_resources, got.overhead_message(), overhead),
        (got.linux_resources, got.resources_message(), res),
    ):
        if raw is None:
            assert message is None and (sent is None or bytes(sent) == b"")
        else:
            assert message == nri.LinuxResources().parse(bytes(sent))


@settings(max_examples=30, deadline=None)
@given(pods, containers, adjustments, updates)
def test_validate_adjustment_request_matches_betterproto(
    pod: nri.PodSandbox, ctr: nri.Container, adj: Adjustment, ups: list[bytes]
) -> None:
    request = nri.ValidateContainerAdjustmentRequest(
        pod=pod,
        container=ctr,
        adjust=bp_adjustment(adj),
        update=[nri.ContainerUpdate().parse(u) for u in ups],
        owners=nri.OwningPlugins(owners={"c": nri.FieldOwners(simple={1: "gpushare"})}),
        plugins=[nri.PluginInstance(name="gpushare", index="10")],
    )
    data = bytes(request)
    got = lite.decode_validate_adjustment_request(data)
    assert_pod(got.pod, nri.PodSandbox().parse(bytes(pod)))
    assert_container(got.container, nri.Container().parse(bytes(ctr)))
    assert got.raw == data
    assert got.message() == nri.ValidateContainerAdjustmentRequest().parse(data)


def test_validate_adjustment_request_needs_pod_and_container() -> None:
    with pytest.raises(DecodeError, match="no container"):
        lite.decode_validate_adjustment_request(GOOD_POD + ld(3, b""))
    with pytest.raises(DecodeError, match="no pod"):
        lite.decode_validate_adjustment_request(GOOD_CTR)
    damaged = lite.decode_validate_adjustment_request(GOOD_POD + GOOD_CTR + ld(3, b"\x22\x05"))
    with pytest.raises(DecodeError):  # the adjustment is checked by message()
        damaged.message()


@pytest.mark.parametrize(
    ("reject", "reason", "wire"),
    [(False, "", b""), (True, "", b"\x08\x01"), (True, "no GPU", b"\x08\x01\x12\x06no GPU")],
)
def test_validate_adjustment_response_bytes(reject: bool, reason: str, wire: bytes) -> None:
    got = lite.encode_validate_adjustment_response(reject, reason)
    assert (
        got == wire == bytes(nri.ValidateContainerAdjustmentResponse(reject=reject, reason=reason))
    )


# -- encoders: exactly betterproto's bytes -----------------------------------------


@FEW
@given(adjustments)
def test_container_adjustment_bytes(adj: Adjustment) -> None:
    assert lite.encode_container_adjustment(adj) == bytes(bp_adjustment(adj))


@FEW
@given(st.one_of(st.none(), adjustments), updates, evictions)
def test_create_container_response_bytes(
    adj: Adjustment | None, ups: list[bytes], evs: list[bytes]
) -> None:
    want = nri.CreateContainerResponse(
        adjust=None if adj is None else bp_adjustment(adj),
        update=[nri.ContainerUpdate().parse(u) for u in ups],
        evict=[nri.ContainerEviction().parse(e) for e in evs],
    )
    assert lite.encode_create_container_response(adj, ups, evs) == bytes(want)


def test_typical_create_container_response() -> None:
    adj = Adjustment(
        annotations={"gpushare.io/allocation": "gpu0:1Gi"},
        env=[("GPUSHARE_MEM", "1073741824"), ("EMPTY", ""), ("", "")],
        devices=[
            Device("/dev/nvidia0", "c", 195, 0, file_mode=0o666, uid=0, gid=0),
            Device("/dev/nvidiactl", "c", 195, 255, file_mode=0),
            Device("/dev/weird", "b", -1, 0),
        ],
        mounts=[MountSpec("/run/gpushare", "bind", "/var/run/gpushare", ("ro", "rbind"))],
    )
    data = lite.encode_create_container_response(adj)
    assert data == bytes(nri.CreateContainerResponse(adjust=bp_adjustment(adj)))
    parsed = nri.CreateContainerResponse().parse(data).adjust.linux.devices
    assert parsed[1].file_mode.value == 0 and parsed[0].uid.value == 0
    assert lite.encode_create_container_response(None) == b""
    assert lite.encode_create_container_response(Adjustment()) == b"\x0a\x00"


@FEW
@given(st.integers(-(1 << 31), (1 << 31) - 1))
def test_configure_response_bytes(events: int) -> None:
    want = nri.ConfigureResponse(events=events)
    assert lite.encode_configure_response(events) == bytes(want)


def test_configure_response_uses_field_2() -> None:
    assert lite.encode_configure_response(1 << 3) == b"\x10\x08"


@FEW
@given(st.booleans(), updates, evictions)
def test_other_response_bytes(more: bool, ups: list[bytes], evs: list[bytes]) -> None:
    parsed = [nri.ContainerUpdate().parse(u) for u in ups]
    evict = [nri.ContainerEviction().parse(e) for e in evs]
    assert lite.encode_synchronize_response(more, ups) == bytes(
        nri.SynchronizeResponse(update=parsed, more=more)
    )
    assert lite.encode_stop_container_response(ups) == bytes(
        nri.StopContainerResponse(update=parsed)
    )
    assert lite.encode_update_container_response(ups, evs) == bytes(
        nri.UpdateContainerResponse(update=parsed, evict=evict)
    )
    assert lite.EMPTY == bytes(nri.Empty()) == bytes(nri.RunPodSandboxResponse())


@pytest.mark.parametrize(
    "adj",
    [
        Adjustment(devices=[Device("/dev/x", major=1 << 63)]),
        Adjustment(devices=[Device("/dev/x", file_mode=-1)]),
        Adjustment(devices=[Device("/dev/x", uid=1 << 32)]),
    ],
)
def test_out_of_range_values_are_refused(adj: Adjustment) -> None:
    with pytest.raises(ValueError):
        lite.encode_container_adjustment(adj)


def test_event_mask_must_fit_int32() -> None:
    with pytest.raises(ValueError):
        lite.encode_configure_response(1 << 31)


# -- decoding details ----------------------------------------------------------


def test_map_entries_in_any_layout() -> None:
    entries = {
        b"\x0a\x01k\x12\x01v": ("k", "v"),  # usual
        b"\x12\x01v\x0a\x01k": ("k", "v"),  # value first
        b"\x0a\x01k": ("k", ""),  # no value
        b"\x12\x01v": ("", "v"),  # no key
        b"\x0a\x01k\x12\x02vv\x18\x07": ("k", "vv"),  # unknown field
        b"\x0a\x01x\x0a\x01k\x12\x01v": ("k", "v"),  # key twice: last wins
        b"": ("", ""),  # neither
    }
    for entry, want in entries.items():
        assert lite.decode_pod_sandbox(ld(5, entry)).labels == dict([want])
    long_key = "k" * 200
    raw = bytes(nri.PodSandbox(annotations={long_key: "v", "a": "1"}))
    assert lite.decode_pod_sandbox(raw).annotations == {long_key: "v", "a": "1"}


def test_a_map_value_cut_short_behind_a_long_length_is_refused() -> None:
    # The value's length is two bytes (133) and one byte short of it is there:
    # no reading of the first length byte alone (5) may make it fit.
    entry = b"\x0a\x01k\x12\x85\x01" + b"v" * 132
    with pytest.raises(DecodeError):
        _ = lite.decode_pod_sandbox(lite_pb.len_field(6, entry)).annotations


def test_repeated_singular_messages_are_merged() -> None:
    pod_a, pod_b = bytes(nri.PodSandbox(id="i")), bytes(nri.PodSandbox(name="n"))
    ctr = bytes(nri.Container(id="c", linux=nri.LinuxContainer(cgroups_path="/a")))
    linux_again = ld(11, bytes(nri.LinuxContainer(cgroups_path="/b")))
    data = ld(1, pod_a) + ld(2, ctr) + ld(1, pod_b) + ld(2, linux_again)
    got = lite.decode_create_container_request(data)
    assert (got.pod.id, got.pod.name) == ("i", "n")
    assert (got.container.id, got.container.cgroups_path) == ("c", "/b")


def test_unknown_fields_and_wire_types_are_skipped() -> None:
    unknown = b"\xf8\x07\x05" + b"\xf9\x07" + bytes(8) + b"\xfd\x07" + bytes(4) + ld(15, b"x")
    data = ld(1, bytes(nri.PodSandbox(id="p")) + unknown) + ld(2, b"\x0a\x01c") + unknown
    got = lite.decode_create_container_request(data)
    assert (got.pod.id, got.container.id) == ("p", "c")


def test_message_leaves_out_unknown_fields_at_any_depth() -> None:
    # Fields 100 (varint), 127 (fixed64, fixed32) and 200 (bytes): a newer NRI's.
    unknown = b"\xa0\x06\x01" + b"\xf9\x07" + bytes(8) + b"\xfd\x07" + bytes(4) + b"\xc2\x0c\x01x"
    raw = (
        b"\x0a\x01c"
        + unknown
        + ld(8, b"A=b")
        + ld(11, ld(5, b"/x") + unknown)  # linux.cgroups_path
        + ld(5, b"\x0a\x01k\x12\x01v" + unknown)  # a label's map entry
        + ld(9, ld(1, b"/d") + unknown)  # a mount
        + ld(9, ld(1, b"/e"))
        + unknown
    )
    want = nri.Container(
        id="c",
        env=["A=b"],
        linux=nri.LinuxContainer(cgroups_path="/x"),
        labels={"k": "v"},
        mounts=[nri.Mount(destination="/d"), nri.Mount(destination="/e")],
    )
    got = lite.decode_container(raw).message()
    assert got == want
    assert bytes(got) == bytes(want)  # nothing unknown kept to write back


def test_message_without_unknown_fields_parses_the_bytes_as_they_are(monkeypatch) -> None:
    from nri_gpushare.nri.api import views

    def copying(cls, raw):
        raise AssertionError("copied a message with no unknown field")

    monkeypatch.setattr(views, "_known_only", copying)
    view = lite.decode_create_container_request(PAYLOAD)
    assert view.container.message() == nri.CreateContainerRequest().parse(PAYLOAD).container


def test_negative_and_large_ints() -> None:
    got = lite.decode_container(bytes(nri.Container(state=3, pid=(1 << 32) - 1)))
    assert (got.state, got.pid) == (3, (1 << 32) - 1)
    minus_one = b"\xff" * 9 + b"\x01"  # enums are int32, sent sign-extended
    assert lite.decode_container(b"\x20" + minus_one + b"\x60" + minus_one).state == -1
    assert lite.decode_container(b"\x60" + minus_one).pid == (1 << 32) - 1  # uint32
    state_change = b"\x08" + minus_one + ld(2, b"")
    assert lite.decode_state_change(state_change).event == -1
    got_cfg = lite.decode_configure_request(bytes(nri.ConfigureRequest(request_timeout=-5)))
    assert got_cfg.request_timeout == -5 and got_cfg.registration_timeout == 0


GOOD_POD, GOOD_CTR = ld(1, b"\x0a\x01p"), ld(2, b"\x0a\x01c")


@pytest.mark.parametrize(
    "data",
    [
        b"",  # no pod
        GOOD_POD,  # no container
        GOOD_CTR,  # no pod
        b"\x0a" + b"\xff" * 10 + b"\x01",  # varint longer than 10 bytes
        b"\x0a\xff",  # truncated length varint
        b"\xff",  # truncated key varint
        b"\x0a\x05ab",  # length beyond the buffer
        b"\x08\x01" + GOOD_POD + GOOD_CTR,  # pod (field 1) as a varint
        GOOD_POD + GOOD_CTR + b"\x0b",  # group start
        GOOD_POD + GOOD_CTR + b"\x0e",  # wire type 6
        GOOD_POD + GOOD_CTR + b"\x02\x00",  # field number 0
        GOOD_POD + GOOD_CTR + b"\x09\x00",  # fixed64 cut short
        ld(1, b"\x08\x01") + GOOD_CTR,  # pod id as a varint
        ld(1, b"\x48\x01\x4a\x00") + GOOD_CTR,  # pod pid ok, then field 9 as bytes
        GOOD_POD + ld(2, b"\x22\x00"),  # container state as bytes
        GOOD_POD + ld(2, b"\x60\xff"),  # container pid varint truncated
        GOOD_POD + ld(2, ld(11, b"\x28\x01")),  # cgroups_path as a varint
        GOOD_POD + ld(2, ld(11, b"\x2a\x09/")),  # cgroups_path past its message
        ld(1, b"\x12\x02\xc3\x28") + GOOD_CTR,  # pod name not UTF-8
        ld(1, ld(5, b"\x0a\x01\xff\x12\x00")) + GOOD_CTR,  # label key not UTF-8
        ld(1, ld(6, b"\x0a\x01k\x12\x01\xff")) + GOOD_CTR,  # annotation value not UTF-8
        ld(1, ld(6, b"\x0a\x01k\x10\x01")) + GOOD_CTR,  # annotation value as varint
        GOOD_POD + ld(2, b"\x42\x01\xfe"),  # env not UTF-8
        GOOD_POD + ld(2, ld(11, b"\x2a\x01\xfe")),  # cgroups_path not UTF-8
    ],
)
def test_malformed_is_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_read(lite.decode_create_container_request, data)


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        (lite.decode_configure_request, b"\x22\x00"),  # registration_timeout as bytes
        (lite.decode_configure_request, b"\x0a\x01\xff"),  # config not UTF-8
        (lite.decode_synchronize_request, b"\x1a\x00"),  # more as bytes
        (lite.decode_synchronize_request, ld(1, b"\x08\x00")),  # bad pod
        (lite.decode_synchronize_request, ld(2, b"\x20")),  # bad container
        (lite.decode_state_change, b"\x08\x04"),  # no pod
        (lite.decode_state_change, b"\x0a\x00" + ld(2, b"")),  # event as bytes
        (lite.decode_update_container_request, GOOD_POD + GOOD_CTR + b"\x18\x01"),
        (lite.decode_pod_container_request, GOOD_CTR),  # no pod
        (lite.decode_pod_request, b"\x08\x01"),
        (lite.decode_update_pod_sandbox_request, GOOD_CTR),  # no pod
        (lite.decode_update_pod_sandbox_request, GOOD_POD + b"\x18\x01"),  # resources as varint
        (lite.decode_validate_adjustment_request, b"\x08\x01" + GOOD_CTR),  # pod as varint
    ],
)
def test_other_malformed_requests(decode, data: bytes) -> None:
    with pytest.raises(DecodeError):
        view = decode(data)
        for part in (view.pods + view.containers) if hasattr(view, "pods") else [view]:
            read(part)


def test_message_reports_deep_damage() -> None:
    # A mount is skipped by the view, but the full parse must notice it is cut.
    ctr = lite.decode_container(b"\x0a\x01c" + ld(9, b"\x0a\x09/"))
    assert ctr.id == "c"
    with pytest.raises(DecodeError):
        ctr.message()
    upd = lite.decode_update_container_request(GOOD_POD + GOOD_CTR + ld(3, b"\x0a\x09"))
    with pytest.raises(DecodeError):
        upd.linux_resources_message()
    # Deeper still: a Mount's destination (string) sent as a varint ...
    with pytest.raises(DecodeError, match="Mount"):
        lite.decode_container(ld(9, b"\x08\x01")).message()
    # ... a map entry's value cut short, and a packed repeated uint32 taken either way.
    with pytest.raises(DecodeError):
        lite.decode_container(ld(11, ld(9, b"\x0a\x01k\x12\x05v"))).message()
    user = b"\x1a\x02\x01\x02\x18\x03"  # additional_gids: packed [1, 2], then 3
    packed = lite.decode_container(b"\xaa\x01\x06" + user).message()  # field 21
    assert packed.user.additional_gids == [1, 2, 3]


def _only_decode_errors(data: bytes) -> None:
    for decode in (
        lite.decode_create_container_request,
        lite.decode_synchronize_request,
        lite.decode_configure_request,
        lite.decode_state_change,
        lite.decode_update_container_request,
    ):
        try:
            view = decode(data)
        except DecodeError:
            continue
        for part in (getattr(view, "pod", None), getattr(view, "container", None)):
            if part is not None:
                for read_part in (read, lambda part: part.message()):
                    try:
                        read_part(part)
                    except DecodeError:
                        pass


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    _only_decode_errors(data)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(PAYLOAD) - 1), st.integers(0, 255), st.integers(0, 40))
def test_damaged_payload_raises_only_decode_error(at: int, byte: int, cut: int) -> None:
    damaged = PAYLOAD[:at] + bytes((byte,)) + PAYLOAD[at + 1 : len(PAYLOAD) - cut]
    _only_decode_errors(damaged)


def test_repeated_singular_fields_merge_in_linear_time() -> None:
    # A runtime that repeats the pod field a million times (4 MiB) must not make
    # the decoder copy the merged pod once per repetition (terabytes): merging
    # 2000 pieces allocates about their size, not 2000 times it.
    n = 2000
    ctr = lite_pb.len_field(2, lite_pb.string_field(1, "c"))
    data = b"\x0a\x02\x0a\x00" * n + ctr
    with allocates_at_most(8 * len(data) + (256 << 10)):
        request = lite.decode_create_container_request(data)
    assert request.container.id == "c" and len(request.pod) == 2 * n


# -- decoding time grows linearly with repetition ---------------------------------

REPEATS = 800_000  # a 4 MiB request holds about a million one-byte fields


def _resources_with_unknown_fields(n: int) -> bytes:
    # An UpdateContainerRequest whose LinuxResources repeats a field this schema
    # does not know (a newer NRI's) n times; the stub parses it with betterproto.
    resources = b"\xa0\x06\x01" * n  # field 100, varint 1
    return GOOD_POD + GOOD_CTR + lite_pb.len_field(3, resources)


def _update_resources(data: bytes) -> object:
    return lite.decode_update_container_request(data).linux_resources_message()


def _container_with_unknown_fields(n: int) -> bytes:
    return b"\x0a\x01c" + b"\xa0\x06\x01" * n


def _container_message(data: bytes) -> object:
    return lite.decode_container(data).message()


def _container_with_env(n: int) -> bytes:
    return b"\x0a\x01c" + b"\x42\x03A=b" * n  # env (8), the hot path's own walk


def _create_request_with_env(n: int) -> bytes:
    return GOOD_POD + lite_pb.len_field(2, _container_with_env(n))


def _create_request_env(data: bytes) -> object:
    return lite.decode_create_container_request(data).container.env


def _seconds(decode: Callable[[bytes], object], data: bytes) -> float:
    """The CPU time of the best of three decodes: this process's own, so that
    other work on a loaded machine does not count (wall time put the ratio
    at 9.1 beside make test's other lanes)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        decode(data)
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize(
    ("build", "decode"),
    [
        (_resources_with_unknown_fields, _update_resources),
        (_container_with_unknown_fields, _container_message),
        (_create_request_with_env, _create_request_env),
    ],
    ids=["update-resources-unknown", "container-message-unknown", "create-env"],
)
def test_decoding_a_repeated_field_takes_linear_time(build, decode) -> None:
    # Timings are compared within the test only: 4N repetitions take about 4x
    # as long as N, and well under 8x (a quadratic decoder takes about 16x).
    small, large = build(REPEATS // 4), build(REPEATS)
    gc.collect()
    gc.disable()
    try:
        decode(small)  # warm up
        ratio = _seconds(decode, large) / _seconds(decode, small)
    finally:
        gc.enable()
    assert ratio < 8, f"{REPEATS} repetitions took {ratio:.1f}x as long as {REPEATS // 4}"


# -- laziness ------------------------------------------------------------------

POD_FIELDS = lite.PodSandboxView._fields
CONTAINER_FIELDS = lite.ContainerView._fields


@settings(max_examples=40, deadline=None)
@given(
    pods,
    containers,
    st.permutations(POD_FIELDS),
    st.permutations(CONTAINER_FIELDS),
    st.sampled_from(["create", "stop", "synchronize", "state", "update", "validate"]),
)
def test_fields_read_in_any_order_match_betterproto(
    pod: nri.PodSandbox,
    ctr: nri.Container,
    pod_order: list[str],
    ctr_order: list[str],
    kind: str,
) -> None:
    # Each request kind that carries a pod and a container, each field read
    # first or last: what a lazy view gives is betterproto's parse.
    if kind == "create":
        got = lite.decode_create_container_request(
            bytes(nri.CreateContainerRequest(pod=pod, container=ctr))
        )
    elif kind == "stop":
        got = lite.decode_stop_container_request(
            bytes(nri.StopContainerRequest(pod=pod, container=ctr))
        )
    elif kind == "synchronize":
        sync = lite.decode_synchronize_request(
            bytes(nri.SynchronizeRequest(pods=[pod], containers=[ctr]))
        )
        got = lite.ContainerRequestView(sync.pods[0], sync.containers[0])
    elif kind == "state":
        state = lite.decode_state_change(bytes(nri.StateChangeEvent(pod=pod, container=ctr)))
        assert state.container is not None
        got = lite.ContainerRequestView(state.pod, state.container)
    elif kind == "update":
        got = lite.decode_update_container_request(
            bytes(nri.UpdateContainerRequest(pod=pod, container=ctr))
        )
    else:
        got = lite.decode_validate_adjustment_request(
            bytes(nri.ValidateContainerAdjustmentRequest(pod=pod, container=ctr))
        )
    want_pod = nri.PodSandbox().parse(bytes(pod))
    want_ctr = nri.Container().parse(bytes(ctr))
    expect = {
        "id": want_ctr.id,
        "pod_sandbox_id": want_ctr.pod_sandbox_id,
        "name": want_ctr.name,
        "state": int(want_ctr.state),
        "labels": want_ctr.labels,
        "annotations": want_ctr.annotations,
        "env": want_ctr.env,
        "cgroups_path": want_ctr.linux.cgroups_path,
        "pid": want_ctr.pid,
    }
    for name in ctr_order:
        assert getattr(got.container, name) == expect[name], name
    for name in pod_order:
        assert getattr(got.pod, name) == getattr(want_pod, name), name


@settings(max_examples=40, deadline=None)
@given(pods, containers)
def test_contains_finds_every_string(pod: nri.PodSandbox, ctr: nri.Container) -> None:
    # The raw-bytes prefilter is sound: every label, annotation and env entry
    # is found in its view's bytes, and a text found nowhere is in none.
    data = bytes(nri.SynchronizeRequest(pods=[pod], containers=[ctr]))
    sync = lite.decode_synchronize_request(data)
    got_pod, got_ctr = sync.pods[0], sync.containers[0]
    for view in (got_pod, got_ctr):
        for mapping in (view.labels, view.annotations):
            for key, value in mapping.items():
                assert view.contains(key.encode()) and view.contains(value.encode())
        absent = b"\x00never-in-a-generated-message\x00"
        assert not view.contains(absent)
        assert view.contains_any([absent, b""])
    for entry in got_ctr.env:
        assert got_ctr.contains_any([b"\x00absent", entry.encode()])
    assert got_pod.buf is data and got_ctr.buf is data  # views, not copies


def test_a_view_decodes_nothing_until_read() -> None:
    damaged_pod = ld(1, b"\x08\x01")  # PodSandbox.id as a varint
    damaged_ctr = ld(2, ld(5, b"\x0a\x01\xff\x12\x00"))  # a label key not UTF-8
    got = lite.decode_create_container_request(damaged_pod + damaged_ctr)
    assert len(got.pod) == 2 and len(got.container) == 7
    with pytest.raises(DecodeError, match="PodSandbox"):
        _ = got.pod.name
    assert got.container.id == ""  # its top level is sound
    with pytest.raises(DecodeError, match="Container.labels"):
        _ = got.container.labels
    with pytest.raises(DecodeError):  # again: nothing half-decoded was kept
        _ = got.container.labels
    assert "malformed" in repr(got.pod)


def test_views_compare_by_bytes() -> None:
    a = lite.decode_container(bytes(nri.Container(id="x")))
    b = lite.decode_synchronize_request(
        bytes(nri.SynchronizeRequest(containers=[nri.Container(id="x")]))
    ).containers[0]
    assert a == b and a != lite.decode_container(bytes(nri.Container(id="y")))
    assert a != lite.decode_pod_sandbox(a.raw)  # another message type
    assert repr(a) == "ContainerView(id='x', pod_sandbox_id='', name='', 3 bytes)"


def test_runs_of_two_byte_keys_are_walked_whole() -> None:
    # Field 20's key is two bytes (0xa2 0x01): its first byte must not be taken
    # for a one-byte key when the index walks a run of repeated entries.
    ctr = nri.Container(id="c", cdi_devices=[nri.CdiDevice(name=""), nri.CdiDevice(name="0")])
    view = lite.decode_container(bytes(ctr))
    assert (view.id, view.name, view.pid) == ("c", "", 0)
    assert view.message() == ctr


def test_cached_parts_encode_like_fresh_ones() -> None:
    # Devices, mounts and env entries are cached encoded; a list of options
    # where a tuple belongs cannot be a key and is encoded fresh, the same.
    from nri_gpushare.nri.api import encode

    mount = MountSpec("/d", "bind", "/s", ("ro",))
    listed = MountSpec("/d", "bind", "/s", ["ro"])  # type: ignore[arg-type]
    adj = Adjustment(env=[("A", "1")], devices=[Device("/dev/x", major=1)], mounts=[mount])
    first = lite.encode_container_adjustment(adj)
    assert lite.encode_container_adjustment(adj) == first == bytes(bp_adjustment(adj))
    assert lite.encode_container_adjustment(Adjustment(mounts=[listed])) == bytes(
        bp_adjustment(Adjustment(mounts=[mount]))
    )
    for i in range(encode._CACHE_LIMIT + 1):  # the cache stays bounded
        lite.encode_container_adjustment(Adjustment(env=[("K", str(i))]))
    assert len(encode._encoded_parts) <= encode._CACHE_LIMIT
