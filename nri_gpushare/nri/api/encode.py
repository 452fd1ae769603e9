"""Encoders of the responses a plugin sends, byte for byte as betterproto
serializes the equivalent message (field order, defaults left out, and the
same choice of what an empty nested message looks like)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from nri_gpushare.nri.api import fields as F
from nri_gpushare.nri.wire import pb

EMPTY = b""
"""Any message with no fields set (Empty, RunPodSandboxResponse, ...)."""


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
    serialized: bytes = b""
    """More ContainerAdjustment fields, serialized, sent after the others: how a
    handler's betterproto ContainerAdjustment travels (`stub.service`)."""


def _wrapped_uint32(number: int, value: int | None) -> bytes:
    """An Optional{FileMode,UInt32} wrapper: present (maybe empty) unless None."""
    if value is None:
        return b""
    return pb.len_field(number, pb.uint_field(F.OptionalValue.VALUE, value, 32))


def _key_value(key: str, value: str) -> bytes:
    return pb.string_field(F.MapEntry.KEY, key) + pb.string_field(F.MapEntry.VALUE, value)


def _map_entry(number: int, key: str, value: str) -> bytes:
    # Like betterproto, an entry with empty key and value is left out.
    entry = _key_value(key, value)
    return pb.len_field(number, entry) if entry else b""


def _device(d: Device) -> bytes:
    D = F.LinuxDevice
    return b"".join(
        (
            pb.string_field(D.PATH, d.path),
            pb.string_field(D.TYPE, d.type),
            pb.int_field(D.MAJOR, d.major),
            pb.int_field(D.MINOR, d.minor),
            _wrapped_uint32(D.FILE_MODE, d.file_mode),
            _wrapped_uint32(D.UID, d.uid),
            _wrapped_uint32(D.GID, d.gid),
        )
    )


def _mount(m: MountSpec) -> bytes:
    parts = [
        pb.string_field(F.Mount.DESTINATION, m.destination),
        pb.string_field(F.Mount.TYPE, m.type),
        pb.string_field(F.Mount.SOURCE, m.source),
    ]
    parts += [pb.len_field(F.Mount.OPTIONS, option.encode()) for option in m.options]
    return b"".join(parts)


_CACHE_LIMIT = 1024
_encoded_parts: dict[Device | MountSpec | tuple[int, str, str], bytes] = {}
"""Fields already encoded: a node injects the same few devices, mounts and
environment entries into every container."""


def _cached(key: Device | MountSpec | tuple[int, str, str]) -> bytes:
    try:
        data = _encoded_parts.get(key)
    except TypeError:  # unhashable (a list where a tuple belongs): not cached
        return _encode_part(key)
    if data is None:
        data = _encode_part(key)
        if len(_encoded_parts) >= _CACHE_LIMIT:
            _encoded_parts.clear()
        _encoded_parts[key] = data
    return data


def _encode_part(key: Device | MountSpec | tuple[int, str, str]) -> bytes:
    if isinstance(key, Device):
        return pb.len_field(F.LinuxContainerAdjustment.DEVICES, _device(key))
    if isinstance(key, MountSpec):
        return pb.len_field(F.ContainerAdjustment.MOUNTS, _mount(key))
    number, k, v = key
    return pb.len_field(
        number, pb.string_field(F.KeyValue.KEY, k) + pb.string_field(F.KeyValue.VALUE, v)
    )


_ENV: Final = F.ContainerAdjustment.ENV


def encode_container_adjustment(adj: Adjustment) -> bytes:
    """Serialize `adj` as a ContainerAdjustment (annotations 2, mounts 3, env 4,
    linux 6 with devices 1, then `adj.serialized`); the linux part is left out
    when there are no devices."""
    A = F.ContainerAdjustment
    parts = [_map_entry(A.ANNOTATIONS, k, v) for k, v in adj.annotations.items()]
    parts += [_cached(m) for m in adj.mounts]
    parts += [_cached((_ENV, k, v)) for k, v in adj.env]
    if adj.devices:
        parts.append(pb.len_field(A.LINUX, b"".join([_cached(d) for d in adj.devices])))
    parts.append(adj.serialized)
    return b"".join(parts)


def _repeated(number: int, items: Sequence[bytes]) -> bytes:
    if not items:  # the usual case: nothing to join
        return b""
    return b"".join([pb.len_field(number, item) for item in items])


def encode_create_container_response(
    adjust: Adjustment | None = None,
    updates: Sequence[bytes] = (),
    evictions: Sequence[bytes] = (),
) -> bytes:
    """A CreateContainerResponse: adjust 1 (present, maybe empty, unless None),
    then serialized ContainerUpdate (2) and ContainerEviction (3) messages."""
    R = F.CreateContainerResponse
    head = b"" if adjust is None else pb.len_field(R.ADJUST, encode_container_adjustment(adjust))
    return head + _repeated(R.UPDATE, updates) + _repeated(R.EVICT, evictions)


def encode_configure_response(events: int) -> bytes:
    """A ConfigureResponse: the events mask (int32 field 2, its only field)."""
    if not -(1 << 31) <= events < 1 << 31:
        raise ValueError(f"event mask {events:#x} does not fit int32")
    return pb.varint_field(F.ConfigureResponse.EVENTS, events)


def encode_synchronize_response(more: bool = False, updates: Sequence[bytes] = ()) -> bytes:
    """A SynchronizeResponse: serialized ContainerUpdates (1), more (2)."""
    return _repeated(F.SynchronizeResponse.UPDATE, updates) + pb.bool_field(
        F.SynchronizeResponse.MORE, more
    )


def encode_stop_container_response(updates: Sequence[bytes] = ()) -> bytes:
    """A StopContainerResponse: serialized ContainerUpdates (1)."""
    return _repeated(F.StopContainerResponse.UPDATE, updates)


def encode_update_container_response(
    updates: Sequence[bytes] = (), evictions: Sequence[bytes] = ()
) -> bytes:
    """An UpdateContainerResponse: ContainerUpdates (1), ContainerEvictions (2)."""
    R = F.UpdateContainerResponse
    return _repeated(R.UPDATE, updates) + _repeated(R.EVICT, evictions)


def encode_validate_adjustment_response(reject: bool = False, reason: str = "") -> bytes:
    """A ValidateContainerAdjustmentResponse: reject (bool 1), reason (2)."""
    R = F.ValidateContainerAdjustmentResponse
    return pb.bool_field(R.REJECT, reject) + pb.string_field(R.REASON, reason)
