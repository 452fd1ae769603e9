"""The few protobuf wire-format primitives the ttrpc envelopes need.

Not a general protobuf library: enough to encode and strictly decode messages
made of varints, strings, bytes and nested messages. Malformed input raises
ProtocolError naming the message being decoded.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import ProtocolError

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5

_MASK64 = (1 << 64) - 1
_FIXED_SIZE = {FIXED64: 8, FIXED32: 4}


def varint(value: int) -> bytes:
    """Encode an int as a varint; negative values use 64-bit two's complement."""
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def varint_field(field: int, value: int) -> bytes:
    """A varint field, omitted when zero (proto3 default)."""
    return tag(field, VARINT) + varint(value) if value else b""


def bytes_field(field: int, value: bytes, *, always: bool = False) -> bytes:
    """A length-delimited field, omitted when empty unless `always`."""
    if not value and not always:
        return b""
    return tag(field, LEN) + varint(len(value)) + value


def string_field(field: int, value: str) -> bytes:
    return bytes_field(field, value.encode())


def signed(value: int, bits: int) -> int:
    """Reinterpret a decoded varint as a two's complement integer of `bits` bits."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def read_varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """Decode the varint at `pos`; return (value, next position)."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _MASK64, i + 1
        shift += 7
    if len(data) - pos >= 10:
        raise ProtocolError(f"malformed {what}: varint longer than 10 bytes at offset {pos}")
    raise ProtocolError(f"malformed {what}: truncated varint at offset {pos}")


def fields(data: bytes, what: str) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field number, wire type, value) for each field of a serialized message.

    Varints come as ints, length-delimited fields as bytes, fixed fields as raw
    bytes. Groups and invalid wire types are refused.
    """
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos, what)
        field, wire_type = key >> 3, key & 7
        if field == 0 or field > 0x1FFFFFFF:
            raise ProtocolError(f"malformed {what}: invalid field number {field}")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos, what)
            yield field, wire_type, value
            continue
        if wire_type == LEN:
            size, pos = read_varint(data, pos, what)
        elif wire_type in _FIXED_SIZE:
            size = _FIXED_SIZE[wire_type]
        else:
            raise ProtocolError(f"malformed {what}: field {field} has wire type {wire_type}")
        if pos + size > end:
            raise ProtocolError(
                f"malformed {what}: field {field} needs {size} bytes, {end - pos} left"
            )
        yield field, wire_type, data[pos : pos + size]
        pos += size


def expect(what: str, field: int, wire_type: int, want: int) -> None:
    """Refuse a known field that arrived with the wrong wire type."""
    if wire_type != want:
        raise ProtocolError(
            f"malformed {what}: field {field} has wire type {wire_type}, expected {want}"
        )


def text(what: str, field: int, value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"malformed {what}: field {field} is not valid UTF-8") from exc
