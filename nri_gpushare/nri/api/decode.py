"""Decoders of the NRI requests a plugin receives, into the views of `views`.

A request decoder only splits the request's top level: it checks the wire
structure of that level (keys, wire types, lengths) and finds the pod and
container, which become lazy views over the request's own buffer (nothing is
copied). What a pod or container holds is decoded, and checked, when a handler
first reads it (see `views`): a handler that reads nothing costs nothing, and a
malformed pod or container raises `DecodeError` at that read. Repeated
occurrences of a singular message field are merged, as protobuf says.
"""

from __future__ import annotations

from typing import Any, Final

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api.request_views import (
    ConfigureRequestView,
    ContainerRequestView,
    PodContainerRequestView,
    StateChangeView,
    SynchronizeRequestView,
    UpdateContainerRequestView,
    UpdatePodSandboxRequestView,
    ValidateAdjustmentRequestView,
)
from nri_gpushare.nri.api.views import ContainerView, PodSandboxView
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import DecodeError

LEN, VARINT = pb.LEN, pb.VARINT


def decode_pod_sandbox(raw: bytes) -> PodSandboxView:
    """A serialized PodSandbox, as a lazy view."""
    return PodSandboxView(raw)


def decode_container(raw: bytes) -> ContainerView:
    """A serialized Container, as a lazy view."""
    return ContainerView(raw)


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------

Span = tuple[bytes, int, int]
"""A field's payload: (buffer, start, end)."""


def _top(data: bytes, what: str, wire_types: pb.WireTypes) -> dict[int, int | Span]:
    """The request's fields listed in `wire_types`: a varint's value (the last
    occurrence wins), a message's span in `data`; repeated occurrences of a
    message are merged (their payloads joined once, at the end: joining as they
    come would copy the merged value once per repetition, quadratic in a
    hostile request). Every field's structure is checked, unknown ones too."""
    found: dict[int, int | Span] = {}
    pieces: dict[int, list[bytes]] = {}
    for number, wire_type, a, b in pb.spans(data, what, wire_types):
        if number not in wire_types:
            continue
        if wire_type != LEN:
            found[number] = a
        elif number in found:  # again: merge
            first = found[number]
            assert isinstance(first, tuple)
            if number not in pieces:
                pieces[number] = [first[0][first[1] : first[2]]]
            pieces[number].append(data[a:b])
        else:
            found[number] = (data, a, b)
    for number, chunks in pieces.items():
        merged = b"".join(chunks)
        found[number] = (merged, 0, len(merged))
    return found


def _span(found: dict[int, int | Span], number: int, what: str, name: str) -> Span:
    span = found.get(number)
    if span is None:
        raise DecodeError(f"malformed {what}: no {name} (field {number})")
    assert isinstance(span, tuple)
    return span


def _bytes(found: dict[int, int | Span], number: int) -> bytes | None:
    span = found.get(number)
    if span is None:
        return None
    assert isinstance(span, tuple)
    buf, a, b = span
    return buf[a:b]


def _pod(span: Span) -> PodSandboxView:
    return PodSandboxView(*span)


def _container(span: Span) -> ContainerView:
    return ContainerView(*span)


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
    """A ConfigureRequest, decoded at once (one per connection)."""
    what = "ConfigureRequest"
    found: dict[int, Any] = {}
    for number, value in pb.fields(data, what, _CONFIGURE):
        found[number] = value  # scalars: the last occurrence wins
    config, name, version, nri_version = (
        pb.text(found.get(n, b""), what, n) for n in _CONFIGURE_STRINGS
    )
    registration = pb.signed(found.get(F.ConfigureRequest.REGISTRATION_TIMEOUT, 0), 64)
    request = pb.signed(found.get(F.ConfigureRequest.REQUEST_TIMEOUT, 0), 64)
    return ConfigureRequestView(config, name, version, registration, request, nri_version, data)


_SYNC_PODS: Final = F.SynchronizeRequest.PODS
_SYNC_CONTAINERS: Final = F.SynchronizeRequest.CONTAINERS
_SYNC_MORE: Final = F.SynchronizeRequest.MORE
_SYNCHRONIZE: pb.WireTypes = {_SYNC_PODS: LEN, _SYNC_CONTAINERS: LEN, _SYNC_MORE: VARINT}


def decode_synchronize_request(data: bytes) -> SynchronizeRequestView:
    """A SynchronizeRequest: a lazy view per pod and container, over `data`."""
    pods: list[PodSandboxView] = []
    containers: list[ContainerView] = []
    more = False
    for number, _, a, b in pb.spans(data, "SynchronizeRequest", _SYNCHRONIZE):
        if number == _SYNC_CONTAINERS:
            containers.append(ContainerView(data, a, b))
        elif number == _SYNC_PODS:
            pods.append(PodSandboxView(data, a, b))
        elif number == _SYNC_MORE:
            more = a != 0
    return SynchronizeRequestView(pods, containers, more)


_POD_FIELD: Final = F.PodContainerRequest.POD
_CONTAINER_FIELD: Final = F.PodContainerRequest.CONTAINER
_POD_CONTAINER: pb.WireTypes = {_POD_FIELD: LEN, _CONTAINER_FIELD: LEN}


def _split_pod_container(data: bytes) -> tuple[Span, Span] | None:
    """The usual request, pod 1 then container 2 and nothing else, split without
    the general walk; None for any other layout."""
    n = len(data)
    if n < 4 or data[0] != 0x0A:
        return None
    size, pos = pb.read_varint(data, 1, "request")
    stop = pos + size
    if stop >= n or data[stop] != 0x12:
        return None
    size, cpos = pb.read_varint(data, stop + 1, "request")
    if cpos + size != n:
        return None
    return (data, pos, stop), (data, cpos, n)


def _container_request(data: bytes, what: str) -> ContainerRequestView:
    try:
        fast = _split_pod_container(data)
    except DecodeError:
        fast = None
    if fast is not None:
        return ContainerRequestView(_pod(fast[0]), _container(fast[1]))
    found = _top(data, what, _POD_CONTAINER)
    return ContainerRequestView(
        _pod(_span(found, _POD_FIELD, what, "pod")),
        _container(_span(found, _CONTAINER_FIELD, what, "container")),
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
    found = _top(data, what, _POD_CONTAINER)
    container = found.get(_CONTAINER_FIELD)
    return PodContainerRequestView(
        _pod(_span(found, _POD_FIELD, what, "pod")),
        None if container is None else _container(_span(found, _CONTAINER_FIELD, what, "")),
    )


def decode_pod_request(data: bytes, what: str = "request") -> PodSandboxView:
    """The pod (field 1, required) of any pod-event request; other fields skipped."""
    found = _top(data, what, {_POD_FIELD: LEN})
    return _pod(_span(found, _POD_FIELD, what, "pod"))


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
    found = _top(data, what, _UPDATE_POD)
    return UpdatePodSandboxRequestView(
        _pod(_span(found, F.UpdatePodSandboxRequest.POD, what, "pod")),
        _bytes(found, F.UpdatePodSandboxRequest.OVERHEAD_LINUX_RESOURCES),
        _bytes(found, F.UpdatePodSandboxRequest.LINUX_RESOURCES),
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
    found = _top(data, what, _UPDATE)
    return UpdateContainerRequestView(
        _pod(_span(found, F.UpdateContainerRequest.POD, what, "pod")),
        _container(_span(found, F.UpdateContainerRequest.CONTAINER, what, "container")),
        _bytes(found, F.UpdateContainerRequest.LINUX_RESOURCES),
    )


def decode_validate_adjustment_request(data: bytes) -> ValidateAdjustmentRequestView:
    """A ValidateContainerAdjustmentRequest: lazy pod and container, the rest
    (adjustment, updates, owners, plugins) checked and parsed by `.message()`."""
    what = "ValidateContainerAdjustmentRequest"
    found = _top(data, what, _POD_CONTAINER)
    return ValidateAdjustmentRequestView(
        _pod(_span(found, _POD_FIELD, what, "pod")),
        _container(_span(found, _CONTAINER_FIELD, what, "container")),
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
    found = _top(data, what, _STATE_CHANGE)
    event = found.get(F.StateChangeEvent.EVENT, 0)
    assert isinstance(event, int)
    container = found.get(F.StateChangeEvent.CONTAINER)
    return StateChangeView(
        pb.signed(event, 32),
        _pod(_span(found, F.StateChangeEvent.POD, what, "pod")),
        None
        if container is None
        else _container(_span(found, F.StateChangeEvent.CONTAINER, what, "")),
    )
