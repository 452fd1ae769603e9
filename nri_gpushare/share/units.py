"""Sizes in the one notation of this project: what requests, the config and
every message a person reads use.

`parse_size` reads ``2Gi``, ``3276Mi``, ``512M``, ``1.5Gi`` (``Ki Mi Gi Ti``
binary, ``K M G T`` decimal, an optional trailing ``B``; a bare number is
GiB); `format_bytes` writes a size back in a form `parse_size` reads.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS = {
    "": GiB,
    "Ki": KiB,
    "Mi": MiB,
    "Gi": GiB,
    "Ti": TiB,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_QUANTITY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT]i?|k)B?)?")


def parse_size(text: str) -> int:
    """Bytes from a size such as 2Gi, 3276Mi, 512M or 4 (GiB); surrounding
    blanks are ignored.  Raises ValueError with a message for a person."""
    text = text.strip()
    m = _QUANTITY.fullmatch(text) if text.isascii() else None
    if not m:
        raise ValueError(
            f"'{text}' is not a memory size; use e.g. 2Gi, 3276Mi, 512M "
            f"(Ki Mi Gi Ti binary, K M G T decimal, a bare number is GiB)"
        )
    try:
        exact = Decimal(m.group(1)) * _UNITS[m.group(2) or ""]
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"'{text}' is not a number") from None
    if exact != exact.to_integral_value():
        raise ValueError(f"'{text}' is not a whole number of bytes")
    return int(exact)


def format_bytes(n: int) -> str:
    """Bytes in the unit people write in requests: Mi when whole, else Ki, else bytes."""
    if n % MiB == 0:
        return f"{n // MiB}Mi"
    if n % KiB == 0:
        return f"{n // KiB}Ki"
    return f"{n}B"
