"""Decoders of the NRI requests a plugin receives, into the views of `views`.

Decoding checks the wire structure of every message it walks (requests, pods,
containers, map entries, the container's Linux part) and the lengths of the
fields it skips; anything malformed raises `DecodeError`. Nested messages it
skips (mounts, hooks, resources...) are checked in full by `.message()`.
Repeated occurrences of a singular message field are merged, as protobuf says.

The pod and container decoders are the hot path (tens of microseconds for a
real CreateContainerRequest): they compare field numbers against module
constants, which Python looks up faster than class attributes.
"""

from __future__ import annotations

from typing import Any, Final

from nri_gpushare.wire import pb
from nri_gpushare.wire.errors import DecodeError

from . import fields as F
from .views import (
    ConfigureRequestView,
    ContainerRequestView,
    ContainerView,
    PodContainerRequestView,
    PodSandboxView,
    StateChangeView,
    SynchronizeRequestView,
    UpdateContainerRequestView,
    UpdatePodSandboxRequestView,
    ValidateAdjustmentRequestView,
)

LEN, VARINT = pb.LEN, pb.VARINT
_fields, _text = pb.fields, pb.text

# ---------------------------------------------------------------------------
# Map entries, pods, containers
# ---------------------------------------------------------------------------

_ENTRY: pb.WireTypes = {F.MapEntry.KEY: LEN, F.MapEntry.VALUE: LEN}
_KEY_TAG: Final = F.MapEntry.KEY << 3 | LEN
_VALUE_TAG: Final = F.MapEntry.VALUE << 3 | LEN


def _entry(data: bytes, what: str) -> tuple[str, str]:
    """A map<string, string> entry as (key, value)."""
    n = len(data)
    # Fast path: the usual `key, value` encoding with one-byte lengths.
    if n >= 2 and data[0] == _KEY_TAG and data[1] < 0x80:
        p = 2 + data[1]
        if p + 2 <= n and data[p] == _VALUE_TAG and data[p + 1] < 0x80 and p + 2 + data[p + 1] == n:
            try:
                return data[2:p].decode(), data[p + 2 :].decode()
            except UnicodeDecodeError:
                pass  # the general path names the field
    key = value = b""
    for number, chunk in _fields(data, what, _ENTRY):
        if number == F.MapEntry.KEY:
            key = chunk
        elif number == F.MapEntry.VALUE:
            value = chunk
    return _text(key, what, F.MapEntry.KEY), _text(value, what, F.MapEntry.VALUE)


_POD_NAMESPACE: Final = F.PodSandbox.NAMESPACE  # fields 1..4 are the id strings
_POD_LABELS: Final = F.PodSandbox.LABELS
_POD_ANNOTATIONS: Final = F.PodSandbox.ANNOTATIONS
_POD: pb.WireTypes = {n: LEN for n in range(1, F.PodSandbox.IPS + 1)} | {F.PodSandbox.PID: VARINT}


def decode_pod_sandbox(raw: bytes) -> PodSandboxView:
    """Decode a serialized PodSandbox."""
    what = "PodSandbox"
    ids: dict[int, bytes] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for number, value in _fields(raw, what, _POD):
        if number <= _POD_NAMESPACE:
            ids[number] = value
        elif number == _POD_LABELS:
            k, v = _entry(value, "PodSandbox.labels")
            labels[k] = v
        elif number == _POD_ANNOTATIONS:
            k, v = _entry(value, "PodSandbox.annotations")
            annotations[k] = v
    s = [_text(ids.get(n, b""), what, n) for n in (1, 2, 3, 4)]
    return PodSandboxView(s[0], s[1], s[2], s[3], labels, annotations, raw)


_CTR_NAME: Final = F.Container.NAME  # fields 1..3 are the id strings
_CTR_STATE: Final = F.Container.STATE
_CTR_LABELS: Final = F.Container.LABELS
_CTR_ANNOTATIONS: Final = F.Container.ANNOTATIONS
_CTR_ENV: Final = F.Container.ENV
_CTR_LINUX: Final = F.Container.LINUX
_CTR_PID: Final = F.Container.PID
_CGROUPS_PATH: Final = F.LinuxContainer.CGROUPS_PATH
_CONTAINER_VARINTS = (
    F.Container.STATE,
    F.Container.PID,
    F.Container.CREATED_AT,
    F.Container.STARTED_AT,
    F.Container.FINISHED_AT,
    F.Container.EXIT_CODE,
)
_CONTAINER: pb.WireTypes = {n: LEN for n in range(1, F.Container.USER + 1)} | dict.fromkeys(
    _CONTAINER_VARINTS, VARINT
)
_LINUX_CONTAINER: pb.WireTypes = {n: LEN for n in range(1, F.LinuxContainer.LAST + 1)}


def decode_container(raw: bytes) -> ContainerView:
    """Decode a serialized Container."""
    what = "Container"
    ids: dict[int, bytes] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    env: list[str] = []
    cgroups_path = b""
    state = pid = 0
    for number, value in _fields(raw, what, _CONTAINER):
        if number <= _CTR_NAME:
            ids[number] = value
        elif number == _CTR_ENV:
            env.append(_text(value, what, _CTR_ENV))
        elif number == _CTR_ANNOTATIONS:
            k, v = _entry(value, "Container.annotations")
            annotations[k] = v
        elif number == _CTR_LABELS:
            k, v = _entry(value, "Container.labels")
            labels[k] = v
        elif number == _CTR_LINUX:
            for sub, chunk in _fields(value, "LinuxContainer", _LINUX_CONTAINER):
                if sub == _CGROUPS_PATH:
                    cgroups_path = chunk
        elif number == _CTR_STATE:
            state = pb.signed(value, 32)
        elif number == _CTR_PID:
            pid = value & 0xFFFFFFFF
    s = [_text(ids.get(n, b""), what, n) for n in (1, 2, 3)]
    return ContainerView(
        s[0],
        s[1],
        s[2],
        state,
        labels,
        annotations,
        env,
        _text(cgroups_path, "LinuxContainer", _CGROUPS_PATH),
        pid,
        raw,
    )


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------


def _singular(data: bytes, what: str, wire_types: pb.WireTypes) -> dict[int, Any]:
    """Fields by number; repeated message fields are merged (concatenated).

    The pieces are joined once at the end: concatenating as they come would
    copy the merged value once per repetition (quadratic in a hostile request).
    """
    found: dict[int, Any] = {}
    pieces: dict[int, list[bytes]] = {}
    for number, value in _fields(data, what, wire_types):
        if number in wire_types:
            if wire_types[number] == LEN:
                pieces.setdefault(number, []).append(value)
            else:
                found[number] = value
    for number, chunks in pieces.items():
        found[number] = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return found


def _need(found: dict[int, Any], number: int, what: str, name: str) -> bytes:
    if number not in found:
        raise DecodeError(f"malformed {what}: no {name} (field {number})")
    value: bytes = found[number]
    return value


_CONFIGURE_STRINGS = (
    F.ConfigureRequest.CONFIG,
    F.ConfigureRequest.RUNTIME_NAME,
    F.ConfigureRequest.RUNTIME_VERSION,
    F.ConfigureRequest.NRI_VERSION,
)
_CONFIGURE: pb.WireTypes = dict.fromkeys(_CONFIGURE_STRINGS, LEN) | {
    F.ConfigureRequest.REGISTRATION_TIMEOUT: VARINT,
    F.ConfigureRequest.REQUEST_TIMEOUT: VARINT,
}


def decode_configure_request(data: bytes) -> ConfigureRequestView:
    what = "ConfigureRequest"
    found: dict[int, Any] = {}
    for number, value in _fields(data, what, _CONFIGURE):
        found[number] = value  # scalars: the last occurrence wins
    config, name, version, nri_version = (
        _text(found.get(n, b""), what, n) for n in _CONFIGURE_STRINGS
    )
    registration = pb.signed(found.get(F.ConfigureRequest.REGISTRATION_TIMEOUT, 0), 64)
    request = pb.signed(found.get(F.ConfigureRequest.REQUEST_TIMEOUT, 0), 64)
    return ConfigureRequestView(config, name, version, registration, request, nri_version, data)


_SYNCHRONIZE: pb.WireTypes = {
    F.SynchronizeRequest.PODS: LEN,
    F.SynchronizeRequest.CONTAINERS: LEN,
    F.SynchronizeRequest.MORE: VARINT,
}


def decode_synchronize_request(data: bytes) -> SynchronizeRequestView:
    pods: list[PodSandboxView] = []
    containers: list[ContainerView] = []
    more = False
    for number, value in _fields(data, "SynchronizeRequest", _SYNCHRONIZE):
        if number == F.SynchronizeRequest.PODS:
            pods.append(decode_pod_sandbox(value))
        elif number == F.SynchronizeRequest.CONTAINERS:
            containers.append(decode_container(value))
        elif number == F.SynchronizeRequest.MORE:
            more = value != 0
    return SynchronizeRequestView(pods, containers, more)


_POD_FIELD: Final = F.PodContainerRequest.POD
_CONTAINER_FIELD: Final = F.PodContainerRequest.CONTAINER
_POD_CONTAINER: pb.WireTypes = {_POD_FIELD: LEN, _CONTAINER_FIELD: LEN}


def _container_request(data: bytes, what: str) -> ContainerRequestView:
    found = _singular(data, what, _POD_CONTAINER)
    return ContainerRequestView(
        decode_pod_sandbox(_need(found, _POD_FIELD, what, "pod")),
        decode_container(_need(found, _CONTAINER_FIELD, what, "container")),
    )


def decode_create_container_request(data: bytes) -> ContainerRequestView:
    return _container_request(data, "CreateContainerRequest")


def decode_stop_container_request(data: bytes) -> ContainerRequestView:
    return _container_request(data, "StopContainerRequest")


def decode_pod_container_request(data: bytes, what: str = "request") -> PodContainerRequestView:
    """A v0.12 per-event request: pod 1 (required), container 2 (if present).

    Not for UpdatePodSandboxRequest, whose field 2 is not a Container: use
    `decode_pod_request` or `decode_update_pod_sandbox_request` there.
    """
    found = _singular(data, what, _POD_CONTAINER)
    container = found.get(_CONTAINER_FIELD)
    return PodContainerRequestView(
        decode_pod_sandbox(_need(found, _POD_FIELD, what, "pod")),
        None if container is None else decode_container(container),
    )


def decode_pod_request(data: bytes, what: str = "request") -> PodSandboxView:
    """The pod (field 1, required) of any pod-event request; other fields skipped."""
    found = _singular(data, what, {_POD_FIELD: LEN})
    return decode_pod_sandbox(_need(found, _POD_FIELD, what, "pod"))


_UPDATE_POD: pb.WireTypes = dict.fromkeys(
    (
        F.UpdatePodSandboxRequest.POD,
        F.UpdatePodSandboxRequest.OVERHEAD_LINUX_RESOURCES,
        F.UpdatePodSandboxRequest.LINUX_RESOURCES,
    ),
    LEN,
)


def decode_update_pod_sandbox_request(data: bytes) -> UpdatePodSandboxRequestView:
    what = "UpdatePodSandboxRequest"
    found = _singular(data, what, _UPDATE_POD)
    return UpdatePodSandboxRequestView(
        decode_pod_sandbox(_need(found, F.UpdatePodSandboxRequest.POD, what, "pod")),
        found.get(F.UpdatePodSandboxRequest.OVERHEAD_LINUX_RESOURCES),
        found.get(F.UpdatePodSandboxRequest.LINUX_RESOURCES),
    )


_UPDATE: pb.WireTypes = dict.fromkeys(
    (
        F.UpdateContainerRequest.POD,
        F.UpdateContainerRequest.CONTAINER,
        F.UpdateContainerRequest.LINUX_RESOURCES,
    ),
    LEN,
)


def decode_update_container_request(data: bytes) -> UpdateContainerRequestView:
    what = "UpdateContainerRequest"
    found = _singular(data, what, _UPDATE)
    return UpdateContainerRequestView(
        decode_pod_sandbox(_need(found, F.UpdateContainerRequest.POD, what, "pod")),
        decode_container(_need(found, F.UpdateContainerRequest.CONTAINER, what, "container")),
        found.get(F.UpdateContainerRequest.LINUX_RESOURCES),
    )


def decode_validate_adjustment_request(data: bytes) -> ValidateAdjustmentRequestView:
    """A ValidateContainerAdjustmentRequest: pod and container decoded, the
    rest (adjustment, updates, owners, plugins) checked and parsed by `.message()`."""
    what = "ValidateContainerAdjustmentRequest"
    found = _singular(data, what, _POD_CONTAINER)
    return ValidateAdjustmentRequestView(
        decode_pod_sandbox(_need(found, _POD_FIELD, what, "pod")),
        decode_container(_need(found, _CONTAINER_FIELD, what, "container")),
        data,
    )


_STATE_CHANGE: pb.WireTypes = {
    F.StateChangeEvent.EVENT: VARINT,
    F.StateChangeEvent.POD: LEN,
    F.StateChangeEvent.CONTAINER: LEN,
}


def decode_state_change(data: bytes) -> StateChangeView:
    """A StateChangeEvent: event 1, pod 2 (required), container 3 (pod events: none)."""
    what = "StateChangeEvent"
    found = _singular(data, what, _STATE_CHANGE)
    container = found.get(F.StateChangeEvent.CONTAINER)
    return StateChangeView(
        pb.signed(found.get(F.StateChangeEvent.EVENT, 0), 32),
        decode_pod_sandbox(_need(found, F.StateChangeEvent.POD, what, "pod")),
        None if container is None else decode_container(container),
    )
