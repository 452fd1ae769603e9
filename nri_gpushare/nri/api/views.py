"""Views of a pod and a container: the fields a plugin usually reads, decoded
lazily from the request's bytes, and `message()`, which parses the full
betterproto message on first use (the requests around them: `request_views`).

`parse` checks the wire structure of the whole message tree before handing it
to betterproto (which accepts, for one, a nested field cut short), so a view's
`message()` raises only `DecodeError` on malformed input.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any, NamedTuple, TypeVar, cast

import betterproto

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.api import nri
from nri_gpushare.nri.wire import pb
from nri_gpushare.nri.wire import pb_index as pbi
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
    at = 0  # where the current field's key starts
    for number, wire_type, a, b in pb.spans(raw, cls.__name__):
        sub = nested.get(number)
        if sub is not None and wire_type == pb.LEN:
            out += pb.len_field(number, _known_only(sub, raw[a:b]))
        elif number in known:
            out += raw[at:b]
        at = b
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


# ---------------------------------------------------------------------------
# Lazy pod and container views
# ---------------------------------------------------------------------------
#
# A view is a span of the request's buffer. Nothing is decoded until read:
# the first read of an id-like field indexes the message's top level once
# (`pb_index.index`: every field's key and length checked, nothing copied); labels,
# annotations, env and the cgroups path are then decoded, each on its own
# first read, from where that field lies.

LEN, VARINT = pb.LEN, pb.VARINT


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
        self._idx: pbi.Index | None = None
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
        for needle in needles:
            if buf.find(needle, start, end) >= 0:
                return True
        return False

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


_P = F.PodSandbox
_POD_TYPES: pb.WireTypes = dict.fromkeys(range(1, _P.IPS + 1), LEN) | {_P.PID: VARINT}


class PodSandboxView(_LazyMessage):
    """A PodSandbox, decoded on demand."""

    __slots__ = ()
    _fields = ("id", "name", "uid", "namespace", "labels", "annotations")

    def _index(self) -> pbi.Index:
        idx = self._idx
        if idx is None:
            idx = self._idx = pbi.index(
                self.buf, "PodSandbox", _POD_TYPES, _P.IPS + 1, self.start, self.end
            )
        return idx

    @property
    def id(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _P.ID, "PodSandbox")

    @property
    def name(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _P.NAME, "PodSandbox")

    @property
    def uid(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _P.UID, "PodSandbox")

    @property
    def namespace(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _P.NAMESPACE, "PodSandbox")

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            idx = self._idx or self._index()
            self._labels = pbi.string_map(self.buf, idx, _P.LABELS, "PodSandbox.labels")
        return self._labels

    @property
    def annotations(self) -> dict[str, str]:
        if self._annotations is None:
            idx = self._idx or self._index()
            self._annotations = pbi.string_map(
                self.buf, idx, _P.ANNOTATIONS, "PodSandbox.annotations"
            )
        return self._annotations

    def message(self) -> nri.PodSandbox:
        """The full PodSandbox, parsed on first use."""
        if self._message is None:
            self._message = parse(nri.PodSandbox, self.raw)
        message: nri.PodSandbox = self._message
        return message


_C = F.Container
_CTR_VARINTS = (_C.STATE, _C.PID, _C.CREATED_AT, _C.STARTED_AT, _C.FINISHED_AT, _C.EXIT_CODE)
_CTR_TYPES: pb.WireTypes = dict.fromkeys(range(1, _C.USER + 1), LEN) | dict.fromkeys(
    _CTR_VARINTS, VARINT
)
_L = F.LinuxContainer
_LINUX_TYPES: pb.WireTypes = dict.fromkeys(range(1, _L.LAST + 1), LEN)


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

    def _index(self) -> pbi.Index:
        idx = self._idx
        if idx is None:
            idx = self._idx = pbi.index(
                self.buf, "Container", _CTR_TYPES, _C.USER + 1, self.start, self.end
            )
        return idx

    @property
    def id(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _C.ID, "Container")

    @property
    def pod_sandbox_id(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _C.POD_SANDBOX_ID, "Container")

    @property
    def name(self) -> str:
        return pbi.string_at(self.buf, self._idx or self._index(), _C.NAME, "Container")

    @property
    def state(self) -> int:
        """An nri.ContainerState value."""
        return pb.signed(pbi.varint_at(self._idx or self._index(), _C.STATE), 32)

    @property
    def pid(self) -> int:
        return pbi.varint_at(self._idx or self._index(), _C.PID) & 0xFFFFFFFF

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            idx = self._idx or self._index()
            self._labels = pbi.string_map(self.buf, idx, _C.LABELS, "Container.labels")
        return self._labels

    @property
    def annotations(self) -> dict[str, str]:
        if self._annotations is None:
            idx = self._idx or self._index()
            self._annotations = pbi.string_map(
                self.buf, idx, _C.ANNOTATIONS, "Container.annotations"
            )
        return self._annotations

    @property
    def env(self) -> list[str]:
        """ "NAME=value" entries."""
        if self._env is None:
            self._env = pbi.strings(self.buf, self._idx or self._index(), _C.ENV, "Container")
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
        i = 3 * _C.LINUX
        if idx[i] < 0:
            return ""
        if pbi.single(idx, _C.LINUX):  # the usual case: one `linux`, read where it is
            a, b = idx[i + 1], idx[i + 2]
            linux = pbi.index(buf, "LinuxContainer", _LINUX_TYPES, _L.LAST + 1, a, b)
            return pbi.string_at(buf, linux, _L.CGROUPS_PATH, "LinuxContainer")
        # Repeated occurrences of `linux` merge: the last cgroups_path wins.
        found = ""
        for a, b in pbi.payloads(buf, _C.LINUX, idx[i], idx[i + 2]):
            linux = pbi.index(buf, "LinuxContainer", _LINUX_TYPES, _L.LAST + 1, a, b)
            if linux[3 * _L.CGROUPS_PATH] >= 0:
                found = pbi.string_at(buf, linux, _L.CGROUPS_PATH, "LinuxContainer")
        return found

    def message(self) -> nri.Container:
        """The full Container, parsed on first use."""
        if self._message is None:
            self._message = parse(nri.Container, self.raw)
        message: nri.Container = self._message
        return message
