"""Light views of NRI requests: the fields a plugin usually reads, plus the raw
bytes, from which `message()` parses the full betterproto message on first use.

`parse` checks the wire structure of the whole message tree before handing it
to betterproto (which accepts, for one, a nested field cut short), so a view's
`message()` raises only `DecodeError` on malformed input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple, TypeVar, cast

import betterproto

from nri_gpushare.wire import pb
from nri_gpushare.wire.errors import DecodeError

from . import nri

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


@dataclass(slots=True)
class PodSandboxView:
    id: str
    name: str
    uid: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    raw: bytes = field(repr=False)
    _message: nri.PodSandbox | None = _cache()

    def message(self) -> nri.PodSandbox:
        """The full PodSandbox, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.PodSandbox, self.raw)
        return self._message


@dataclass(slots=True)
class ContainerView:
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

    def message(self) -> nri.Container:
        """The full Container, parsed from `raw` on first use."""
        if self._message is None:
            self._message = parse(nri.Container, self.raw)
        return self._message


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
