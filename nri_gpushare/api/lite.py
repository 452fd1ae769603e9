"""A fast, strict protobuf codec for the NRI messages on the plugin's hot path.

betterproto spends milliseconds on one CreateContainerRequest, while the
runtime calls plugins under a node-wide lock. This module decodes requests
into slotted *views* holding only the fields a plugin usually reads, plus the
raw bytes; ``view.message()`` checks and parses the full betterproto object on
first use. It also encodes the few responses a plugin sends, byte for byte as
betterproto serializes the equivalent message.

Decoding checks the wire structure of every message it walks (requests, pods,
containers, map entries, the container's Linux part) and the lengths of the
fields it skips; anything malformed raises ``DecodeError``. Nested messages
it skips (mounts, hooks, resources...) are checked in full by ``.message()``.
Repeated occurrences of a singular message field are merged, as protobuf says.

Field numbers follow nri.proto next to this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import betterproto

from . import nri

__all__ = [
    "EMPTY",
    "Adjustment",
    "ConfigureRequestView",
    "ContainerRequestView",
    "ContainerView",
    "DecodeError",
    "Device",
    "MountSpec",
    "PodContainerRequestView",
    "PodSandboxView",
    "StateChangeView",
    "SynchronizeRequestView",
    "UpdateContainerRequestView",
    "decode_configure_request",
    "decode_container",
    "decode_create_container_request",
    "decode_pod_container_request",
    "decode_pod_request",
    "decode_pod_sandbox",
    "decode_state_change",
    "decode_stop_container_request",
    "decode_synchronize_request",
    "decode_update_container_request",
    "encode_configure_response",
    "encode_container_adjustment",
    "encode_create_container_response",
    "encode_stop_container_response",
    "encode_synchronize_response",
    "encode_update_container_response",
]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1
_MAX_FIELD = (1 << 29) - 1

M = TypeVar("M", bound=betterproto.Message)


class DecodeError(ValueError):
    """A request payload is not a well-formed message of the expected type."""


# ---------------------------------------------------------------------------
# Wire walking
# ---------------------------------------------------------------------------


def _varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """Decode the varint at `pos` (slow path); return (value, next position)."""
    value = shift = 0
    end = min(len(data), pos + 10)
    start = pos
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _MASK64, pos
        shift += 7
    if pos - start == 10:
        raise DecodeError(f"malformed {what}: varint longer than 10 bytes at offset {start}")
    raise DecodeError(f"malformed {what}: truncated varint at offset {start}")


def _fields(data: bytes, what: str, wire_types: dict[int, int]) -> Iterator[tuple[int, Any]]:
    """Yield (field number, value) for each field of a serialized message.

    Varints come as ints, length-delimited and fixed fields as bytes. A field
    listed in `wire_types` must have that wire type; groups and invalid wire
    types are refused.
    """
    pos, end = 0, len(data)
    while pos < end:
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos, what)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD:
            raise DecodeError(f"malformed {what}: invalid field number {number}")
        want = wire_types.get(number, wire_type)
        if want != wire_type:
            raise DecodeError(
                f"malformed {what}: field {number} has wire type {wire_type}, expected {want}"
            )
        if wire_type == VARINT:
            if pos < end and data[pos] < 0x80:
                value: Any = data[pos]
                pos += 1
            else:
                value, pos = _varint(data, pos, what)
            yield number, value
            continue
        if wire_type == LEN:
            if pos < end and data[pos] < 0x80:
                size = data[pos]
                pos += 1
            else:
                size, pos = _varint(data, pos, what)
        elif wire_type == FIXED64:
            size = 8
        elif wire_type == FIXED32:
            size = 4
        else:
            raise DecodeError(f"malformed {what}: field {number} has wire type {wire_type}")
        stop = pos + size
        if stop > end:
            raise DecodeError(
                f"malformed {what}: field {number} needs {size} bytes, {end - pos} left"
            )
        yield number, data[pos:stop]
        pos = stop


def _text(value: bytes, what: str, number: int) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise DecodeError(f"malformed {what}: field {number} is not valid UTF-8") from None


_ENTRY = {1: LEN, 2: LEN}


def _entry(data: bytes, what: str) -> tuple[str, str]:
    """A map<string, string> entry as (key, value)."""
    n = len(data)
    # Fast path: the usual `key, value` encoding with one-byte lengths.
    if n >= 2 and data[0] == 0x0A and data[1] < 0x80:
        p = 2 + data[1]
        if p + 2 <= n and data[p] == 0x12 and data[p + 1] < 0x80 and p + 2 + data[p + 1] == n:
            try:
                return data[2:p].decode(), data[p + 2 :].decode()
            except UnicodeDecodeError:
                pass  # the general path names the field
    key = value = b""
    for number, chunk in _fields(data, what, _ENTRY):
        if number == 1:
            key = chunk
        elif number == 2:
            value = chunk
    return _text(key, what, 1), _text(value, what, 2)


_WIRE_OF = (
    dict.fromkeys(betterproto.WIRE_VARINT_TYPES, VARINT)
    | dict.fromkeys(betterproto.WIRE_FIXED_64_TYPES, FIXED64)
    | dict.fromkeys(betterproto.WIRE_LEN_DELIM_TYPES, LEN)
    | dict.fromkeys(betterproto.WIRE_FIXED_32_TYPES, FIXED32)
)


@cache
def _schema(cls: type[betterproto.Message]) -> tuple[dict[int, int], dict[int, type]]:
    """(wire type, nested message class) by field number, from betterproto's metadata."""
    meta = cls._betterproto
    wire_types: dict[int, int] = {}
    nested: dict[int, type] = {}
    for name, info in meta.meta_by_field_name.items():
        packable = info.proto_type in betterproto.PACKED_TYPES
        if not (packable and meta.default_gen[name] is list):  # packed or not: both fine
            wire_types[info.number] = _WIRE_OF[info.proto_type]
        if info.proto_type in (betterproto.TYPE_MESSAGE, betterproto.TYPE_MAP):
            nested[info.number] = meta.cls_by_field[name]  # a map's entry class
    return wire_types, nested


def _check(cls: type[betterproto.Message], raw: bytes) -> None:
    """Check the wire structure of a whole message tree (betterproto does not:
    it accepts, for one, a nested field cut short)."""
    wire_types, nested = _schema(cls)
    for number, value in _fields(raw, cls.__name__, wire_types):
        sub = nested.get(number)
        if sub is not None:
            _check(sub, value)


def _parse(cls: type[M], raw: bytes) -> M:
    """Check, then parse with betterproto; any failure is a DecodeError."""
    _check(cls, raw)
    try:
        return cls().parse(raw)
    except Exception as exc:
        raise DecodeError(f"malformed {cls.__name__}: {exc}") from exc


def _cache() -> Any:
    """A dataclass field for a lazily parsed message: not an argument, not compared."""
    return field(default=None, init=False, repr=False, compare=False)


class _Lazy(Generic[M]):
    """Mixin for views: `message()` parses `raw` into `_type`, once."""

    __slots__ = ()
    _type: ClassVar[type[betterproto.Message]]
    raw: bytes
    _message: M | None

    def message(self) -> M:
        """The full betterproto message, parsed from `raw` on first use."""
        if self._message is None:
            self._message = _parse(self._type, self.raw)  # type: ignore[assignment]
        return self._message  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class PodSandboxView(_Lazy[nri.PodSandbox]):
    _type: ClassVar = nri.PodSandbox
    id: str
    name: str
    uid: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    raw: bytes = field(repr=False)
    _message: nri.PodSandbox | None = _cache()


@dataclass(slots=True)
class ContainerView(_Lazy[nri.Container]):
    _type: ClassVar = nri.Container
    id: str
    pod_sandbox_id: str
    name: str
    state: int  # nri.ContainerState value
    labels: dict[str, str]
    annotations: dict[str, str]
    env: list[str]  # "NAME=value"
    cgroups_path: str  # linux.cgroups_path
    pid: int
    raw: bytes = field(repr=False)
    _message: nri.Container | None = _cache()


@dataclass(slots=True)
class ConfigureRequestView(_Lazy[nri.ConfigureRequest]):
    _type: ClassVar = nri.ConfigureRequest
    config: str
    runtime_name: str
    runtime_version: str
    registration_timeout: int  # milliseconds
    request_timeout: int  # milliseconds
    nri_version: str
    raw: bytes = field(repr=False)
    _message: nri.ConfigureRequest | None = _cache()


class SynchronizeRequestView(NamedTuple):
    pods: list[PodSandboxView]
    containers: list[ContainerView]
    more: bool


@dataclass(slots=True)
class ContainerRequestView:
    """Create/Stop and the other container-event requests (pod 1, container 2)."""

    pod: PodSandboxView
    container: ContainerView


@dataclass(slots=True)
class PodContainerRequestView:
    """A v0.12 per-event request; `container` is None for pod events."""

    pod: PodSandboxView
    container: ContainerView | None


@dataclass(slots=True)
class UpdateContainerRequestView:
    pod: PodSandboxView
    container: ContainerView
    linux_resources: bytes | None = field(repr=False)  # None when absent
    _resources: nri.LinuxResources | None = _cache()

    def linux_resources_message(self) -> nri.LinuxResources | None:
        """The requested LinuxResources, parsed on first use; None if absent."""
        if self._resources is None and self.linux_resources is not None:
            self._resources = _parse(nri.LinuxResources, self.linux_resources)
        return self._resources


@dataclass(slots=True)
class StateChangeView:
    event: int  # nri.Event value
    pod: PodSandboxView
    container: ContainerView | None


# ---------------------------------------------------------------------------
# Decoders
# ---------------------------------------------------------------------------

_POD = {n: LEN for n in range(1, 11)} | {9: VARINT}


def decode_pod_sandbox(raw: bytes) -> PodSandboxView:
    """Decode a serialized PodSandbox."""
    what = "PodSandbox"
    ids: dict[int, bytes] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for number, value in _fields(raw, what, _POD):
        if number <= 4:
            ids[number] = value
        elif number == 5:
            k, v = _entry(value, "PodSandbox.labels")
            labels[k] = v
        elif number == 6:
            k, v = _entry(value, "PodSandbox.annotations")
            annotations[k] = v
    s = [_text(ids.get(n, b""), what, n) for n in (1, 2, 3, 4)]
    return PodSandboxView(s[0], s[1], s[2], s[3], labels, annotations, raw)


_CONTAINER = {n: LEN for n in range(1, 22)} | {n: VARINT for n in (4, 12, 14, 15, 16, 17)}
_LINUX_CONTAINER = {n: LEN for n in range(1, 13)}


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
        if number <= 3:
            ids[number] = value
        elif number == 8:
            env.append(_text(value, what, 8))
        elif number == 6:
            k, v = _entry(value, "Container.annotations")
            annotations[k] = v
        elif number == 5:
            k, v = _entry(value, "Container.labels")
            labels[k] = v
        elif number == 11:
            for sub, chunk in _fields(value, "LinuxContainer", _LINUX_CONTAINER):
                if sub == 5:
                    cgroups_path = chunk
        elif number == 4:
            state = value & 0xFFFFFFFF
            state -= (state >> 31) << 32  # int32
        elif number == 12:
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
        _text(cgroups_path, "LinuxContainer", 5),
        pid,
        raw,
    )


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


_CONFIGURE = {1: LEN, 2: LEN, 3: LEN, 4: VARINT, 5: VARINT, 6: LEN}


def decode_configure_request(data: bytes) -> ConfigureRequestView:
    what = "ConfigureRequest"
    s: dict[int, bytes] = {}
    ints = {4: 0, 5: 0}
    for number, value in _fields(data, what, _CONFIGURE):
        if number in ints:
            ints[number] = _signed64(value)
        elif number in _CONFIGURE:
            s[number] = value
    config, name, version, nri_version = (_text(s.get(n, b""), what, n) for n in (1, 2, 3, 6))
    return ConfigureRequestView(config, name, version, ints[4], ints[5], nri_version, data)


_SYNCHRONIZE = {1: LEN, 2: LEN, 3: VARINT}


def decode_synchronize_request(data: bytes) -> SynchronizeRequestView:
    pods: list[PodSandboxView] = []
    containers: list[ContainerView] = []
    more = False
    for number, value in _fields(data, "SynchronizeRequest", _SYNCHRONIZE):
        if number == 1:
            pods.append(decode_pod_sandbox(value))
        elif number == 2:
            containers.append(decode_container(value))
        elif number == 3:
            more = value != 0
    return SynchronizeRequestView(pods, containers, more)


def _singular(data: bytes, what: str, wire_types: dict[int, int]) -> dict[int, Any]:
    """Fields by number; repeated message fields are merged (concatenated)."""
    found: dict[int, Any] = {}
    for number, value in _fields(data, what, wire_types):
        if number in wire_types:
            if wire_types[number] == LEN and number in found:
                value = found[number] + value
            found[number] = value
    return found


def _need(found: dict[int, Any], number: int, what: str, name: str) -> bytes:
    if number not in found:
        raise DecodeError(f"malformed {what}: no {name} (field {number})")
    return found[number]


_POD_CONTAINER = {1: LEN, 2: LEN}


def _container_request(data: bytes, what: str) -> ContainerRequestView:
    found = _singular(data, what, _POD_CONTAINER)
    return ContainerRequestView(
        decode_pod_sandbox(_need(found, 1, what, "pod")),
        decode_container(_need(found, 2, what, "container")),
    )


def decode_create_container_request(data: bytes) -> ContainerRequestView:
    return _container_request(data, "CreateContainerRequest")


def decode_stop_container_request(data: bytes) -> ContainerRequestView:
    return _container_request(data, "StopContainerRequest")


def decode_pod_container_request(data: bytes, what: str = "request") -> PodContainerRequestView:
    """A v0.12 per-event request: pod 1 (required), container 2 (if present).

    Not for UpdatePodSandboxRequest, whose field 2 is not a Container: use
    `decode_pod_request` there.
    """
    found = _singular(data, what, _POD_CONTAINER)
    container = found.get(2)
    return PodContainerRequestView(
        decode_pod_sandbox(_need(found, 1, what, "pod")),
        None if container is None else decode_container(container),
    )


def decode_pod_request(data: bytes, what: str = "request") -> PodSandboxView:
    """The pod (field 1, required) of any pod-event request; other fields skipped."""
    return decode_pod_sandbox(_need(_singular(data, what, {1: LEN}), 1, what, "pod"))


_UPDATE = {1: LEN, 2: LEN, 3: LEN}


def decode_update_container_request(data: bytes) -> UpdateContainerRequestView:
    what = "UpdateContainerRequest"
    found = _singular(data, what, _UPDATE)
    return UpdateContainerRequestView(
        decode_pod_sandbox(_need(found, 1, what, "pod")),
        decode_container(_need(found, 2, what, "container")),
        found.get(3),
    )


_STATE_CHANGE = {1: VARINT, 2: LEN, 3: LEN}


def decode_state_change(data: bytes) -> StateChangeView:
    """A StateChangeEvent: event 1, pod 2 (required), container 3 (pod events: none)."""
    what = "StateChangeEvent"
    found = _singular(data, what, _STATE_CHANGE)
    event = found.get(1, 0) & 0xFFFFFFFF
    container = found.get(3)
    return StateChangeView(
        event - ((event >> 31) << 32),
        decode_pod_sandbox(_need(found, 2, what, "pod")),
        None if container is None else decode_container(container),
    )


# ---------------------------------------------------------------------------
# Encoders
# ---------------------------------------------------------------------------

_BYTE = [bytes((i,)) for i in range(256)]


def _uvarint(value: int) -> bytes:
    if value < 0x80:
        return _BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _ld(key: int, payload: bytes) -> bytes:
    """A length-delimited field (one-byte key), emitted even when empty."""
    return _BYTE[key] + _uvarint(len(payload)) + payload


def _str(key: int, value: str) -> bytes:
    """A string field (one-byte key), omitted when empty (proto3 default)."""
    if not value:
        return b""
    data = value.encode()
    return _BYTE[key] + _uvarint(len(data)) + data


def _int64(key: int, value: int) -> bytes:
    """An int64 varint field, omitted when zero."""
    if not value:
        return b""
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{value} does not fit int64")
    return _BYTE[key] + _uvarint(value & _MASK64)


def _wrapped_uint32(key: int, value: int | None) -> bytes:
    """An Optional{FileMode,UInt32} wrapper: present (maybe empty) unless None."""
    if value is None:
        return b""
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{value} does not fit uint32")
    return _ld(key, _BYTE[0x08] + _uvarint(value) if value else b"")


@dataclass(slots=True, frozen=True)
class Device:
    """A device node to create in the container (LinuxDevice)."""

    path: str
    type: str = "c"  # "c", "b", "u" or "p"
    major: int = 0
    minor: int = 0
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(slots=True, frozen=True)
class MountSpec:
    """A mount to add to the container (Mount)."""

    destination: str
    type: str = ""
    source: str = ""
    options: tuple[str, ...] = ()


@dataclass(slots=True)
class Adjustment:
    """The parts of a ContainerAdjustment this plugin sets."""

    annotations: dict[str, str] = field(default_factory=dict)
    env: list[tuple[str, str]] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    mounts: list[MountSpec] = field(default_factory=list)


def _map_entry(key: int, k: str, v: str) -> bytes:
    # Like betterproto, an entry with empty key and value is left out.
    entry = _str(0x0A, k) + _str(0x12, v)
    return _ld(key, entry) if entry else b""


def _device(d: Device) -> bytes:
    return b"".join(
        (
            _str(0x0A, d.path),
            _str(0x12, d.type),
            _int64(0x18, d.major),
            _int64(0x20, d.minor),
            _wrapped_uint32(0x2A, d.file_mode),
            _wrapped_uint32(0x32, d.uid),
            _wrapped_uint32(0x3A, d.gid),
        )
    )


def _mount(m: MountSpec) -> bytes:
    parts = [_str(0x0A, m.destination), _str(0x12, m.type), _str(0x1A, m.source)]
    parts += [_ld(0x22, option.encode()) for option in m.options]
    return b"".join(parts)


def encode_container_adjustment(adj: Adjustment) -> bytes:
    """Serialize `adj` as a ContainerAdjustment (annotations 2, mounts 3, env 4,
    linux 6 with devices 1); the linux part is left out when there are no devices."""
    parts = [_map_entry(0x12, k, v) for k, v in adj.annotations.items()]
    parts += [_ld(0x1A, _mount(m)) for m in adj.mounts]
    parts += [_ld(0x22, _str(0x0A, k) + _str(0x12, v)) for k, v in adj.env]
    if adj.devices:
        parts.append(_ld(0x32, b"".join(_ld(0x0A, _device(d)) for d in adj.devices)))
    return b"".join(parts)


def _repeated(key: int, items: Sequence[bytes]) -> bytes:
    return b"".join(_ld(key, item) for item in items)


def encode_create_container_response(
    adjust: Adjustment | None = None,
    updates: Sequence[bytes] = (),
    evictions: Sequence[bytes] = (),
) -> bytes:
    """A CreateContainerResponse: adjust 1 (present, maybe empty, unless None),
    then serialized ContainerUpdate (2) and ContainerEviction (3) messages."""
    head = b"" if adjust is None else _ld(0x0A, encode_container_adjustment(adjust))
    return head + _repeated(0x12, updates) + _repeated(0x1A, evictions)


def encode_configure_response(events: int, request_timeout: int = 0) -> bytes:
    """A ConfigureResponse: events mask (int32 field 2), request_timeout (3, ms)."""
    if not -(1 << 31) <= events < 1 << 31:
        raise ValueError(f"event mask {events:#x} does not fit int32")
    return _int64(0x10, events) + _int64(0x18, request_timeout)


def encode_synchronize_response(more: bool = False, updates: Sequence[bytes] = ()) -> bytes:
    """A SynchronizeResponse: serialized ContainerUpdates (1), more (2)."""
    return _repeated(0x0A, updates) + (b"\x10\x01" if more else b"")


def encode_stop_container_response(updates: Sequence[bytes] = ()) -> bytes:
    """A StopContainerResponse: serialized ContainerUpdates (1)."""
    return _repeated(0x0A, updates)


def encode_update_container_response(
    updates: Sequence[bytes] = (), evictions: Sequence[bytes] = ()
) -> bytes:
    """An UpdateContainerResponse: ContainerUpdates (1), ContainerEvictions (2)."""
    return _repeated(0x0A, updates) + _repeated(0x12, evictions)


EMPTY = b""
"""Any message with no fields set (Empty, RunPodSandboxResponse, ...)."""
