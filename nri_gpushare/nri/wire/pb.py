"""Protocol Buffers wire format: the project's one walker and field encoder.

Not a general protobuf library: enough to strictly walk messages made of
varints, length-delimited and fixed fields, and to emit the fields our
messages use, byte for byte as the reference encoders do. Both the ttrpc
envelopes (`wire.ttrpc`) and the NRI hot-path codec (`api.lite`) use it.

`spans` is the walker that reads keys and lengths: everything that walks a
message (`fields`, the request decoders) goes through it, but for
`pb_index.index` (the lazy views'), which inlines it in one loop. It is
on the plugin's hot path (a CreateContainerRequest walks a few hundred
fields), so it has fast paths for one-byte keys, varints and lengths, and it
checks wire types against a table instead of per field in the caller.
Malformed input raises `DecodeError` ("malformed <what>: ...").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from nri_gpushare.nri.wire.errors import DecodeError

VARINT: Final = 0
FIXED64: Final = 1
LEN: Final = 2
FIXED32: Final = 5

MASK64: Final = (1 << 64) - 1
MAX_FIELD: Final = (1 << 29) - 1

WireTypes = Mapping[int, int]
"""Expected wire type by field number; fields not listed may have any valid type."""

_NO_TYPES: WireTypes = {}

# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def read_varint(data: bytes, pos: int, what: str, limit: int = -1) -> tuple[int, int]:
    """Decode the varint at `pos`, not reading at or past `limit` (default: the
    end of `data`); return (value, next position)."""
    value = shift = 0
    end = min(len(data) if limit < 0 else limit, pos + 10)
    start = pos
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & MASK64, pos
        shift += 7
    if pos - start == 10:
        raise DecodeError(f"malformed {what}: varint longer than 10 bytes at offset {start}")
    raise DecodeError(f"malformed {what}: truncated varint at offset {start}")


def spans(
    data: bytes,
    what: str,
    wire_types: WireTypes = _NO_TYPES,
    start: int = 0,
    end: int = -1,
    runs: bool = False,
) -> Iterator[tuple[int, int, int, int]]:
    """The walker: check and yield each field of the message in
    `data[start:end]` (default: to the end), without copying a value, as
    (field number, wire type, a, b). For a length-delimited or fixed field,
    (a, b) are the bounds of its payload in `data`; for a varint field, a is
    its value and b the position after it. Either way b is where the next
    field's key starts.

    A field listed in `wire_types` must arrive with that wire type; groups and
    invalid wire types are refused, and so is a field number of 0 or beyond
    2**29 - 1. With `runs`, consecutive entries of a repeated length-delimited
    field 1..15 come as one, the last entry's bounds (all `index` keeps).
    """
    pos, end = start, len(data) if end < 0 else end
    run_key = -1  # the last one-byte key of a length-delimited field: checked
    while pos < end:
        key = data[pos]
        if key == run_key and pos + 1 < end and data[pos + 1] < 0x80:
            # The next entry of a repeated field, with a one-byte length.
            pos += 2
            stop = pos + data[pos - 1]
            if stop > end:
                raise DecodeError(
                    f"malformed {what}: field {key >> 3} needs {stop - pos} bytes, {end - pos} left"
                )
            yield key >> 3, LEN, pos, stop
            pos = stop
            continue
        if key < 0x80:
            pos += 1
        elif pos + 1 < end and data[pos + 1] < 0x80:  # two-byte key: fields 16..2047
            key = key & 0x7F | data[pos + 1] << 7
            pos += 2
        else:
            key, pos = read_varint(data, pos, what, end)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > MAX_FIELD:
            raise DecodeError(f"malformed {what}: invalid field number {number}")
        if wire_types and wire_types.get(number, wire_type) != wire_type:
            raise DecodeError(
                f"malformed {what}: field {number} has wire type {wire_type},"
                f" expected {wire_types[number]}"
            )
        if wire_type == VARINT:
            if pos < end and data[pos] < 0x80:
                value = data[pos]
                pos += 1
            else:
                value, pos = read_varint(data, pos, what, end)
            yield number, VARINT, value, pos
            continue
        if wire_type == LEN:
            if pos < end and data[pos] < 0x80:
                size = data[pos]
                pos += 1
            elif pos + 1 < end and data[pos + 1] < 0x80:  # two-byte length
                size = data[pos] & 0x7F | data[pos + 1] << 7
                pos += 2
            else:
                size, pos = read_varint(data, pos, what, end)
            stop = pos + size
            if key < 0x80:
                run_key = key
            if runs and key < 0x80:  # the run's entries: lengths of one or two bytes
                last = end - 2
                while stop < last and data[stop] == key:
                    size = data[stop + 1]
                    if size < 0x80:
                        pos = stop + 2
                    elif data[stop + 2] < 0x80:
                        size = size & 0x7F | data[stop + 2] << 7
                        pos = stop + 3
                    else:
                        break  # a longer length: the next field, read as usual
                    stop = pos + size
        elif wire_type == FIXED64:
            size, stop = 8, pos + 8
        elif wire_type == FIXED32:
            size, stop = 4, pos + 4
        else:
            raise DecodeError(f"malformed {what}: field {number} has wire type {wire_type}")
        if stop > end:
            raise DecodeError(
                f"malformed {what}: field {number} needs {size} bytes, {end - pos} left"
            )
        yield number, wire_type, pos, stop
        pos = stop


def fields(data: bytes, what: str, wire_types: WireTypes = _NO_TYPES) -> Iterator[tuple[int, Any]]:
    """`spans` with values: yield (field number, value) for each field of a
    serialized message, an `int` for a varint field and `bytes` for a
    length-delimited or fixed one (typed Any: which one a field has is what
    `wire_types` guarantees)."""
    for number, wire_type, a, b in spans(data, what, wire_types):
        yield number, a if wire_type == VARINT else data[a:b]


def text(value: bytes, what: str, number: int) -> str:
    """A string field's value; refuses invalid UTF-8 naming the field."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise DecodeError(f"malformed {what}: field {number} is not valid UTF-8") from None


def signed(value: int, bits: int) -> int:
    """Reinterpret a decoded varint as a two's complement integer of `bits` bits."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


# ---------------------------------------------------------------------------
# Encoding (proto3: a scalar field at its default value is left out)
# ---------------------------------------------------------------------------

_BYTE: Final = [bytes((i,)) for i in range(256)]


def uvarint(value: int) -> bytes:
    """Encode a non-negative int as a varint."""
    if value < 0x80:
        return _BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value: int) -> bytes:
    """Encode an int as a varint; negative values use 64-bit two's complement."""
    return uvarint(value & MASK64)


def tag(field: int, wire_type: int) -> bytes:
    """The key of a field: its number and wire type."""
    return uvarint(field << 3 | wire_type)


def len_field(field: int, payload: bytes) -> bytes:
    """A length-delimited field, emitted even when empty (a present message)."""
    key, size = field << 3 | LEN, len(payload)
    if key < 0x80 and size < 0x80:  # the usual case: one-byte key and length
        return bytes((key, size)) + payload
    return uvarint(key) + uvarint(size) + payload


def bytes_field(field: int, value: bytes, *, always: bool = False) -> bytes:
    """A bytes field, omitted when empty unless `always`."""
    if not value and not always:
        return b""
    return len_field(field, value)


def string_field(field: int, value: str) -> bytes:
    """A string field, omitted when empty."""
    if not value:
        return b""
    data = value.encode()
    key, size = field << 3 | LEN, len(data)
    if key < 0x80 and size < 0x80:
        return bytes((key, size)) + data
    return uvarint(key) + uvarint(size) + data


def varint_field(field: int, value: int) -> bytes:
    """A varint field, omitted when zero; negatives as 64-bit two's complement."""
    if not value:
        return b""
    key = field << 3  # | VARINT
    if key < 0x80 and 0 < value < 0x80:
        return bytes((key, value))
    return uvarint(key) + varint(value)


def int_field(field: int, value: int, bits: int = 64) -> bytes:
    """An int32/int64 field, omitted when zero; refuses values out of range."""
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError(f"{value} does not fit int{bits}")
    return varint_field(field, value)


def uint_field(field: int, value: int, bits: int = 32) -> bytes:
    """A uint32/uint64 field, omitted when zero; refuses values out of range."""
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{value} does not fit uint{bits}")
    return varint_field(field, value)


def bool_field(field: int, value: bool) -> bytes:
    """A bool field, omitted when false."""
    return tag(field, VARINT) + b"\x01" if value else b""
