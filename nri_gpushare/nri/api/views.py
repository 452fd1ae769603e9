"""Views of NRI requests: the fields a plugin usually reads, decoded lazily
from the request's bytes, and `message()`, which parses the full betterproto
message on first use.

`parse` checks the wire structure of the whole message tree before handing it
to betterproto (which accepts, for one, a nested field cut short), so a view's
`message()` raises only `DecodeError` on malformed input.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple, TypeVar, cast

import betterproto

from nri_gpushare.nri.api import nri
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire.errors import DecodeError

M = TypeVar("M", bound=betterproto.Message)

_WIRE_OF = (
    dict.fromkeys(betterproto.WIRE_VARINT_TYPES, pb.VARINT)
    | dict.fromkeys(betterproto.WIRE_FIXED_64_TYPES, pb.FIXED64)
    | dict.fromkeys(betterproto.WIRE_LEN_DELIM_TYPES, pb.LEN)
    | dict.fromkeys(betterproto.WIRE_FIXED_32_TYPES, pb.FIXED32)
)


class _Schema(NamedTuple):
    wire_types: dict[int, int]  # by field number (packable repeated fields: either)
    nested: dict[int, type[betterproto.Message]]  # message class by field number
    known: frozenset[int]  # every field number of the message


@cache
def _schema(cls: type[betterproto.Message]) -> _Schema:
    """A message's fields from betterproto's metadata."""
    meta = cast(Any, cls)._betterproto
    wire_types: dict[int, int] = {}
    nested: dict[int, type[betterproto.Message]] = {}
    for name, info in meta.meta_by_field_name.items():
        packable = info.proto_type in betterproto.PACKED_TYPES
        if not (packable and meta.default_gen[name] is list):  # packed or not: both fine
            wire_types[info.number] = _WIRE_OF[info.proto_type]
        if info.proto_type in (betterproto.TYPE_MESSAGE, betterproto.TYPE_MAP):
            nested[info.number] = meta.cls_by_field[name]  # a map's entry class
    return _Schema(wire_types, nested, frozenset(meta.field_name_by_number))


def check(cls: type[betterproto.Message], raw: bytes) -> bool:
    """Check the wire structure of a whole message tree of type `cls`; True
    when some message in it has a field the schema does not know."""
    wire_types, nested, known = _schema(cls)
    unknown = False
    for number, value in pb.fields(raw, cls.__name__, wire_types):
        sub = nested.get(number)
        if sub is not None:
            unknown = check(sub, value) or unknown
        elif number not in known:
            unknown = True
    return unknown


def _known_only(cls: type[betterproto.Message], raw: bytes) -> bytes:
    """`raw` (checked) without the fields `cls` does not know, at any depth.

    betterproto appends each unknown field to a bytes attribute, copying all
    the earlier ones: quadratic in a request that repeats one a million times.
    """
    _, nested, known = _schema(cls)
    out = bytearray()
    pos, end, what = 0, len(raw), cls.__name__
    while pos < end:
        start = pos
        key, pos = pb.read_varint(raw, pos, what)
        number, wire_type = key >> 3, key & 7
        if wire_type == pb.LEN:
            size, pos = pb.read_varint(raw, pos, what)
            payload, pos = pos, pos + size
        elif wire_type == pb.VARINT:
            _, pos = pb.read_varint(raw, pos, what)
        else:  # check() let only FIXED64 and FIXED32 through
            pos += 8 if wire_type == pb.FIXED64 else 4
        sub = nested.get(number)
        if sub is not None and wire_type == pb.LEN:
            out += pb.len_field(number, _known_only(sub, raw[payload:pos]))
        elif number in known:
            out += raw[start:pos]
    return bytes(out)


def parse(cls: type[M], raw: bytes) -> M:
    """Check, then parse with betterproto; any failure is a DecodeError.
    Fields the schema does not know (a newer NRI's) are left out."""
    if check(cls, raw):
        raw = _known_only(cls, raw)
    try:
        return cls().parse(raw)
    except Exception as exc:
        raise DecodeError(f"malformed {cls.__name__}: {exc}") from exc


def _parse_optional(cls: type[M], raw: bytes | None) -> M | None:
    return None if raw is None else parse(cls, raw)


def _cache() -> Any:
    """A dataclass field for a lazily parsed message: not an argument, not compared."""
    return field(default=None, init=False, repr=False, compare=False)


# ---------------------------------------------------------------------------
# Lazy pod and container views
# ---------------------------------------------------------------------------
#
# A view is a span of the request's buffer. Nothing is decoded until read:
# the first read of an id-like field scans the message's top level once (every
# field's key and length checked, nothing copied) and keeps where each field
# lies; labels, annotations, env and the cgroups path are then decoded, each on
# its own first read, from the range where that field's entries lie. Protobuf
# encoders write a repeated field's entries together, so that range holds
# little else; entries interleaved with other fields are decoded all the same.

LEN, VARINT, FIXED64, FIXED32 = pb.LEN, pb.VARINT, pb.FIXED64, pb.FIXED32
_read_varint = pb.read_varint
_MAX_FIELD = pb.MAX_FIELD


def _index(buf: bytes, pos: int, end: int, what: str, wire_types: tuple[int, ...]) -> list[int]:
    """Check the top level of the message in buf[pos:end]; for each field number
    n < len(wire_types), idx[3n] is the offset of its first occurrence's key
    (-1: absent), and idx[3n+1], idx[3n+2] the bounds of its last occurrence's
    payload, for a varint field its value and -1. wire_types[n] is field n's
    wire type (wire_types[0] = -1: field 0 is invalid); others may be any."""
    known = len(wire_types)
    idx = [-1] * (3 * known)
    while pos < end:
        at = pos
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos, what, end)
        number = key >> 3
        wire_type = key & 7
        if number < known and wire_types[number] != wire_type or number > _MAX_FIELD:
            if number == 0 or number > _MAX_FIELD:
                raise DecodeError(f"malformed {what}: invalid field number {number}")
            raise DecodeError(
                f"malformed {what}: field {number} has wire type {wire_type},"
                f" expected {wire_types[number]}"
            )
        if wire_type == LEN:
            if pos < end and buf[pos] < 0x80:
                size = buf[pos]
                pos += 1
            elif pos + 1 < end and buf[pos + 1] < 0x80:  # two-byte length
                size = buf[pos] & 0x7F | buf[pos + 1] << 7
                pos += 2
            else:
                size, pos = _read_varint(buf, pos, what, end)
            stop = pos + size
            # A repeated field's entries come in a run: walk it in a tighter
            # loop (same one-byte key, lengths of one or two bytes).
            if key < 0x80:
                last = end - 2
                while stop < last and buf[stop] == key:
                    size = buf[stop + 1]
                    if size < 0x80:
                        pos = stop + 2
                    elif buf[stop + 2] < 0x80:
                        size = size & 0x7F | buf[stop + 2] << 7
                        pos = stop + 3
                    else:
                        break
                    stop = pos + size
            if stop > end:
                raise DecodeError(
                    f"malformed {what}: field {number} needs {size} bytes, {end - pos} left"
                )
            if number < known:
                i = 3 * number
                if idx[i] < 0:
                    idx[i] = at
                idx[i + 1] = pos
                idx[i + 2] = stop
            pos = stop
        elif wire_type == VARINT:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = _read_varint(buf, pos, what, end)
            if number < known:
                i = 3 * number
                idx[i] = at
                idx[i + 1] = value
        elif wire_type == FIXED64 or wire_type == FIXED32:
            pos += 8 if wire_type == FIXED64 else 4
            if pos > end:
                raise DecodeError(f"malformed {what}: field {number} cut short")
        else:
            raise DecodeError(f"malformed {what}: field {number} has wire type {wire_type}")
    return idx


def _payloads(buf: bytes, pos: int, end: int, number: int) -> list[tuple[int, int]]:
    """The payload bounds of each occurrence of length-delimited field `number`
    in buf[pos:end], a range of whole fields `_index` has checked."""
    out = []
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos, "", end)
        wire_type = key & 7
        if wire_type == LEN:
            size = buf[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = _read_varint(buf, pos, "", end)
            if key >> 3 == number:
                out.append((pos, pos + size))
            pos += size
        elif wire_type == VARINT:
            _, pos = _read_varint(buf, pos, "", end)
        else:
            pos += 8 if wire_type == FIXED64 else 4
    return out


def _text_at(buf: bytes, a: int, b: int, what: str, number: int) -> str:
    try:
        return buf[a:b].decode()
    except UnicodeDecodeError:
        raise DecodeError(f"malformed {what}: field {number} is not valid UTF-8") from None


_MAP_ENTRY: pb.WireTypes = {1: LEN, 2: LEN}


def _region(buf: bytes, idx: list[int], number: int) -> tuple[bytes, str | None]:
    """The bytes from field `number`'s first key to its last payload's end, and
    the same as text when they are all ASCII (then byte offsets are character
    offsets, and every string in them is valid UTF-8: slicing the text once
    decoded is cheaper than decoding each string)."""
    i = 3 * number
    region = buf[idx[i] : idx[i + 2]]
    return region, region.decode("latin-1") if region.isascii() else None


def _entry(data: bytes, what: str) -> tuple[str, str]:
    """A map<string, string> entry in any layout."""
    key = value = b""
    for field_number, chunk in pb.fields(data, what, _MAP_ENTRY):
        if field_number == 1:
            key = chunk
        elif field_number == 2:
            value = chunk
    return pb.text(key, what, 1), pb.text(value, what, 2)


def _map(buf: bytes, idx: list[int], number: int, what: str) -> dict[str, str]:
    """The map<string, string> field `number` (< 16) of an indexed message."""
    if idx[3 * number] < 0:
        return {}
    region, text = _region(buf, idx, number)
    tag = number << 3 | LEN
    out: dict[str, str] = {}
    pos, end = 0, len(region)
    while pos < end:
        if region[pos] == tag and region[pos + 1] < 0x80:
            a = pos + 2
            pos = b = a + region[pos + 1]
            # The usual entry: key 1 then value 2, one-byte lengths, nothing else.
            if b - a >= 4 and region[a] == 0x0A and region[a + 1] < 0x80:
                p = a + 2 + region[a + 1]
                if p + 2 <= b and region[p] == 0x12 and p + 2 + region[p + 1] == b:
                    if text is not None:
                        out[text[a + 2 : p]] = text[p + 2 : b]
                        continue
                    try:
                        out[region[a + 2 : p].decode()] = region[p + 2 : b].decode()
                        continue
                    except UnicodeDecodeError:
                        pass  # the general path names the field
            k, v = _entry(region[a:b], what)
            out[k] = v
            continue
        for a, b in _payloads(region, pos, _next_field(region, pos), number):
            k, v = _entry(region[a:b], what)
            out[k] = v
        pos = _next_field(region, pos)
    return out


def _next_field(buf: bytes, pos: int) -> int:
    """Where the (checked) field at `pos` ends."""
    key, pos = _read_varint(buf, pos, "")
    wire_type = key & 7
    if wire_type == LEN:
        size, pos = _read_varint(buf, pos, "")
        return pos + size
    if wire_type == VARINT:
        return _read_varint(buf, pos, "")[1]
    return pos + (8 if wire_type == FIXED64 else 4)


def _strings(buf: bytes, idx: list[int], number: int, what: str) -> list[str]:
    """The repeated string field `number` (< 16) of an indexed message."""
    if idx[3 * number] < 0:
        return []
    region, text = _region(buf, idx, number)
    if text is None:
        try:
            return [region[a:b].decode() for a, b in _payloads(region, 0, len(region), number)]
        except UnicodeDecodeError:
            raise DecodeError(f"malformed {what}: field {number} is not valid UTF-8") from None
    tag = number << 3 | LEN
    out = []
    pos, end = 0, len(region)
    while pos < end:
        if region[pos] == tag and region[pos + 1] < 0x80:
            a = pos + 2
            pos += 2 + region[pos + 1]
            out.append(text[a:pos])
            continue
        stop = _next_field(region, pos)
        out += [text[a:b] for a, b in _payloads(region, pos, stop, number)]
        pos = stop
    return out


def _string(buf: bytes, idx: list[int], number: int, what: str) -> str:
    """The string field `number` of an indexed message (its last occurrence)."""
    a = idx[3 * number + 1]
    return "" if a < 0 else _text_at(buf, a, idx[3 * number + 2], what, number)


def _varint(idx: list[int], number: int) -> int:
    """The varint field `number` of an indexed message (0: absent)."""
    return 0 if idx[3 * number] < 0 else idx[3 * number + 1]


class _LazyMessage:
    """A message in buf[start:end], read on demand; equal to another view of
    the same type over the same bytes."""

    __slots__ = ("buf", "start", "end", "_idx", "_labels", "_annotations", "_message")
    _fields: tuple[str, ...] = ()
    """Its public fields, for generic readers (like a NamedTuple's)."""

    def __init__(self, buf: bytes, start: int = 0, end: int = -1) -> None:
        self.buf = buf
        self.start = start
        self.end = len(buf) if end < 0 else end
        self._idx: list[int] | None = None
        self._labels: dict[str, str] | None = None
        self._annotations: dict[str, str] | None = None
        self._message: Any = None

    @property
    def raw(self) -> bytes:
        """The serialized message (a copy unless it is the whole buffer)."""
        if self.start == 0 and self.end == len(self.buf):
            return self.buf
        return self.buf[self.start : self.end]

    def __len__(self) -> int:
        return self.end - self.start

    def contains(self, needle: bytes) -> bool:
        """Whether `needle` occurs in the serialized message (nothing is decoded).
        Strings are plain UTF-8 on the wire, so a text no label, annotation,
        env entry... contains is proven absent without decoding them."""
        return self.buf.find(needle, self.start, self.end) >= 0

    def contains_any(self, needles: Iterable[bytes]) -> bool:
        """Whether any of `needles` occurs in the serialized message."""
        buf, start, end = self.buf, self.start, self.end
        return any(buf.find(n, start, end) >= 0 for n in needles)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _LazyMessage)
        return len(self) == len(other) and self.raw == other.raw

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        try:
            shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields[:3])
        except DecodeError as exc:
            shown = f"malformed: {exc}"
        return f"{type(self).__name__}({shown}, {len(self)} bytes)"


_POD_TYPES = (-1, LEN, LEN, LEN, LEN, LEN, LEN, LEN, LEN, VARINT, LEN)
_POD_LABELS, _POD_ANNOTATIONS = 5, 6


class PodSandboxView(_LazyMessage):
    """A PodSandbox, decoded on demand."""

    __slots__ = ()
    _fields = ("id", "name", "uid", "namespace", "labels", "annotations")

    def _index(self) -> list[int]:
        idx = self._idx
        if idx is None:
            idx = self._idx = _index(self.buf, self.start, self.end, "PodSandbox", _POD_TYPES)
        return idx

    @property
    def id(self) -> str:
        return _string(self.buf, self._idx or self._index(), 1, "PodSandbox")

    @property
    def name(self) -> str:
        return _string(self.buf, self._idx or self._index(), 2, "PodSandbox")

    @property
    def uid(self) -> str:
        return _string(self.buf, self._idx or self._index(), 3, "PodSandbox")

    @property
    def namespace(self) -> str:
        return _string(self.buf, self._idx or self._index(), 4, "PodSandbox")

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            idx = self._idx or self._index()
            self._labels = _map(self.buf, idx, _POD_LABELS, "PodSandbox.labels")
        return self._labels

    @property
    def annotations(self) -> dict[str, str]:
        if self._annotations is None:
            idx = self._idx or self._index()
            self._annotations = _map(self.buf, idx, _POD_ANNOTATIONS, "PodSandbox.annotations")
        return self._annotations

    def message(self) -> nri.PodSandbox:
        """The full PodSandbox, parsed on first use."""
        if self._message is None:
            self._message = parse(nri.PodSandbox, self.raw)
        message: nri.PodSandbox = self._message
        return message


_CTR_TYPES = (-1, LEN, LEN, LEN, VARINT, LEN, LEN, LEN, LEN, LEN, LEN, LEN, VARINT) + (
    LEN,  # 13 rlimits
    VARINT,  # 14 created_at
    VARINT,
    VARINT,
    VARINT,  # 17 exit_code
    LEN,
    LEN,
    LEN,
    LEN,  # 21 user
)
_CTR_STATE, _CTR_LABELS, _CTR_ANNOTATIONS, _CTR_ENV, _CTR_LINUX, _CTR_PID = 4, 5, 6, 8, 11, 12
_LINUX_TYPES = (-1,) + (LEN,) * 12
_CGROUPS_PATH = 5


class ContainerView(_LazyMessage):
    """A Container, decoded on demand."""

    __slots__ = ("_env", "_cgroups_path")
    _fields = (
        "id",
        "pod_sandbox_id",
        "name",
        "state",
        "labels",
        "annotations",
        "env",
        "cgroups_path",
        "pid",
    )

    def __init__(self, buf: bytes, start: int = 0, end: int = -1) -> None:
        super().__init__(buf, start, end)
        self._env: list[str] | None = None
        self._cgroups_path: str | None = None

    def _index(self) -> list[int]:
        idx = self._idx
        if idx is None:
            idx = self._idx = _index(self.buf, self.start, self.end, "Container", _CTR_TYPES)
        return idx

    @property
    def id(self) -> str:
        return _string(self.buf, self._idx or self._index(), 1, "Container")

    @property
    def pod_sandbox_id(self) -> str:
        return _string(self.buf, self._idx or self._index(), 2, "Container")

    @property
    def name(self) -> str:
        return _string(self.buf, self._idx or self._index(), 3, "Container")

    @property
    def state(self) -> int:
        """An nri.ContainerState value."""
        return pb.signed(_varint(self._idx or self._index(), _CTR_STATE), 32)

    @property
    def pid(self) -> int:
        return _varint(self._idx or self._index(), _CTR_PID) & 0xFFFFFFFF

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            idx = self._idx or self._index()
            self._labels = _map(self.buf, idx, _CTR_LABELS, "Container.labels")
        return self._labels

    @property
    def annotations(self) -> dict[str, str]:
        if self._annotations is None:
            idx = self._idx or self._index()
            self._annotations = _map(self.buf, idx, _CTR_ANNOTATIONS, "Container.annotations")
        return self._annotations

    @property
    def env(self) -> list[str]:
        """ "NAME=value" entries."""
        if self._env is None:
            self._env = _strings(self.buf, self._idx or self._index(), _CTR_ENV, "Container")
        return self._env

    @property
    def cgroups_path(self) -> str:
        """linux.cgroups_path."""
        path = self._cgroups_path
        if path is None:
            path = self._cgroups_path = self._read_cgroups_path()
        return path

    def _read_cgroups_path(self) -> str:
        buf, idx = self.buf, self._idx or self._index()
        i = 3 * _CTR_LINUX
        if idx[i] < 0:
            return ""
        # Repeated occurrences of `linux` merge: the last cgroups_path wins.
        found = ""
        for a, b in _payloads(buf, idx[i], idx[i + 2], _CTR_LINUX):
            linux = _index(buf, a, b, "LinuxContainer", _LINUX_TYPES)
            if linux[3 * _CGROUPS_PATH] >= 0:
                found = _string(buf, linux, _CGROUPS_PATH, "LinuxContainer")
        return found

    def message(self) -> nri.Container:
        """The full Container, parsed on first use."""
        if self._message is None:
            self._message = parse(nri.Container, self.raw)
        message: nri.Container = self._message
        return message


@dataclass(slots=True)
class ConfigureRequestView:
    config: str
    runtime_name: str
    runtime_version: str
    registration_timeout: int  # milliseconds; 0: not sent (NRI before v0.8)
    request_timeout: int  # milliseconds; 0: not sent
    nri_version: str
    raw: bytes = field(repr=False)
    _message: nri.ConfigureRequest | None = _cache()

    def message(self) -> nri.ConfigureRequest:
        """The full ConfigureRequest, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.ConfigureRequest, self.raw)
        return self._message


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
        if self._resources is None:
            self._resources = _parse_optional(nri.LinuxResources, self.linux_resources)
        return self._resources


@dataclass(slots=True)
class UpdatePodSandboxRequestView:
    """UpdatePodSandbox (NRI v0.10+): the pod and its new resources."""

    pod: PodSandboxView
    overhead_linux_resources: bytes | None = field(repr=False)  # None when absent
    linux_resources: bytes | None = field(repr=False)

    def overhead_message(self) -> nri.LinuxResources | None:
        """The pod's overhead resources, parsed; None if absent."""
        return _parse_optional(nri.LinuxResources, self.overhead_linux_resources)

    def resources_message(self) -> nri.LinuxResources | None:
        """The pod's resources, parsed; None if absent."""
        return _parse_optional(nri.LinuxResources, self.linux_resources)


@dataclass(slots=True)
class ValidateAdjustmentRequestView:
    """ValidateContainerAdjustment (NRI v0.10+): the container as it was before
    any plugin adjusted it; `message()` has the combined adjustment, the
    updates, which plugin set which field, and the plugins consulted."""

    pod: PodSandboxView
    container: ContainerView
    raw: bytes = field(repr=False)
    _message: nri.ValidateContainerAdjustmentRequest | None = _cache()

    def message(self) -> nri.ValidateContainerAdjustmentRequest:
        """The full request, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.ValidateContainerAdjustmentRequest, self.raw)
        return self._message


@dataclass(slots=True)
class StateChangeView:
    event: int  # nri.Event value
    pod: PodSandboxView
    container: ContainerView | None
