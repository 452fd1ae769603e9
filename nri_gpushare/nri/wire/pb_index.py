"""Reading a message through an index of its top level: the lazy views' way
(`api.views`), on the walker of `pb`.

`index` walks a message's top level once and keeps where each field lies;
a field is then read from there on demand. A repeated field (a map's entries,
a list of strings) is read from its *region*, from its first key to its last
payload's end: protobuf encoders write a repeated field's entries together,
so the region holds little else; entries interleaved with other fields are
read all the same.
"""

from __future__ import annotations

from nri_gpushare.nri.wire.errors import DecodeError
from nri_gpushare.nri.wire.pb import (
    FIXED32,
    FIXED64,
    LEN,
    MAX_FIELD,
    VARINT,
    WireTypes,
    fields,
    read_varint,
    spans,
    text,
)

Index = list[int]
"""For each field number n below a bound: [3n] the offset of its first
occurrence's key (-1: absent); [3n+1], [3n+2] its last occurrence's `spans`
bounds (for a varint: its value, then the position after it)."""

_MAP_ENTRY: WireTypes = {1: LEN, 2: LEN}
_NO_TYPES: WireTypes = {}


def index(
    data: bytes, what: str, wire_types: WireTypes, count: int, start: int = 0, end: int = -1
) -> Index:
    """Check the top level of the message in data[start:end] (every field's
    key and length, nothing copied) and index fields 1 .. count - 1.

    `spans` with `runs`, inlined into one loop that yields nothing: a
    Synchronize indexes tens of thousands of containers of ~80 fields each.
    Whatever `spans` refuses, this refuses with the same message."""
    end = len(data) if end < 0 else end
    idx = [-1] * (3 * count)
    expected = wire_types.get
    pos, last = start, end - 2
    while pos < end:
        at = pos
        key = data[pos]
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
        if expected(number, wire_type) != wire_type:
            raise DecodeError(
                f"malformed {what}: field {number} has wire type {wire_type},"
                f" expected {wire_types[number]}"
            )
        if wire_type == LEN:
            if pos < end and data[pos] < 0x80:
                b = pos + 1 + data[pos]
                pos += 1
            elif pos + 1 < end and data[pos + 1] < 0x80:  # two-byte length
                b = pos + 2 + (data[pos] & 0x7F | data[pos + 1] << 7)
                pos += 2
            else:
                size, pos = read_varint(data, pos, what, end)
                b = pos + size
            # A run of entries with a one-byte key (not a two-byte key's value)
            # and lengths of one or two bytes: only the last one is indexed.
            while b < last and data[b] == key < 0x80:
                size = data[b + 1]
                if size < 0x80:
                    pos = b + 2
                    b = pos + size
                elif data[b + 2] < 0x80:
                    pos = b + 3
                    b = pos + (size & 0x7F | data[b + 2] << 7)
                else:
                    break  # a longer length: the next field, read as usual
        elif wire_type == VARINT:
            if pos < end and data[pos] < 0x80:
                value, b = data[pos], pos + 1
            else:
                value, b = read_varint(data, pos, what, end)
            if number < count:
                i = 3 * number
                if idx[i] < 0:
                    idx[i] = at
                idx[i + 1] = value
                idx[i + 2] = b
            pos = b
            continue
        elif wire_type == FIXED64:
            b = pos + 8
        elif wire_type == FIXED32:
            b = pos + 4
        else:
            raise DecodeError(f"malformed {what}: field {number} has wire type {wire_type}")
        if b > end:
            raise DecodeError(
                f"malformed {what}: field {number} needs {b - pos} bytes, {end - pos} left"
            )
        if number < count:
            i = 3 * number
            if idx[i] < 0:
                idx[i] = at
            idx[i + 1] = pos
            idx[i + 2] = b
        pos = b
    return idx


def payloads(data: bytes, number: int, start: int, end: int) -> list[tuple[int, int]]:
    """The payload bounds of each occurrence of field `number` in the checked
    range data[start:end]."""
    return [(a, b) for n, _, a, b in spans(data, "", _NO_TYPES, start, end) if n == number]


def single(idx: Index, number: int) -> bool:
    """Whether the indexed length-delimited field `number` occurs once (or at
    least: its last occurrence is its first). Its last payload starts at most
    3 bytes past its first key only when that key (1 or 2 bytes) and length
    (1 or 2) lead to it: a second occurrence starts 2 bytes past the first,
    at the earliest, so its payload 4. False may be a single occurrence with
    a longer key and length: the caller then walks the occurrences."""
    i = 3 * number
    return 0 <= idx[i] and idx[i + 1] - idx[i] <= 3


def string_at(data: bytes, idx: Index, number: int, what: str) -> str:
    """The string field `number` of an indexed message (its last occurrence)."""
    a = idx[3 * number + 1]
    if a < 0:
        return ""
    value = data[a : idx[3 * number + 2]]
    try:
        return value.decode()
    except UnicodeDecodeError:
        return text(value, what, number)  # raises, naming the field


def varint_at(idx: Index, number: int) -> int:
    """The varint field `number` of an indexed message (0: absent)."""
    return 0 if idx[3 * number] < 0 else idx[3 * number + 1]


def _region(data: bytes, idx: Index, number: int) -> tuple[bytes, str | None]:
    """Field `number`'s region, and the same as text when it is all ASCII
    (then byte offsets are character offsets, and every string in it is valid
    UTF-8: slicing the text once decoded is cheaper than decoding each string)."""
    i = 3 * number
    region = data[idx[i] : idx[i + 2]]
    return region, region.decode("latin-1") if region.isascii() else None


def _entry(data: bytes, what: str) -> tuple[str, str]:
    """A map<string, string> entry in any layout."""
    key = value = b""
    for number, chunk in fields(data, what, _MAP_ENTRY):
        if number == 1:
            key = chunk
        elif number == 2:
            value = chunk
    return text(key, what, 1), text(value, what, 2)


def string_map(data: bytes, idx: Index, number: int, what: str) -> dict[str, str]:
    """The map<string, string> field `number` of an indexed message."""
    if idx[3 * number] < 0:
        return {}
    region, ascii_text = _region(data, idx, number)
    out: dict[str, str] = {}
    for n, _, a, b in spans(region, what):
        if n != number:
            continue
        # The usual entry: key 1 then value 2, one-byte lengths, nothing else.
        if b - a >= 4 and region[a] == 0x0A and region[a + 1] < 0x80:
            p = a + 2 + region[a + 1]
            if p + 2 <= b and region[p] == 0x12 and region[p + 1] == b - p - 2 < 0x80:
                if ascii_text is not None:
                    out[ascii_text[a + 2 : p]] = ascii_text[p + 2 : b]
                    continue
                try:
                    out[region[a + 2 : p].decode()] = region[p + 2 : b].decode()
                    continue
                except UnicodeDecodeError:
                    pass  # the general path names the field
        k, v = _entry(region[a:b], what)
        out[k] = v
    return out


def strings(data: bytes, idx: Index, number: int, what: str) -> list[str]:
    """The repeated string field `number` of an indexed message."""
    if idx[3 * number] < 0:
        return []
    region, ascii_text = _region(data, idx, number)
    if ascii_text is not None:
        return [ascii_text[a:b] for n, _, a, b in spans(region, what) if n == number]
    return [text(region[a:b], what, number) for a, b in payloads(region, number, 0, len(region))]
