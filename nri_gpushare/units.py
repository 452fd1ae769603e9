"""Sizes in the one notation of this project: what requests, the config and
every message a person reads use.

`parse_size` reads a number and an optional unit (blanks around and between them
are ignored):

- the number: ASCII digits with an optional fraction (``2``, ``1.5``, ``.5``,
  ``2.``);
- the unit: ``Ki Mi Gi Ti`` binary, ``K M G T`` (or ``k``) decimal, each with an
  optional trailing ``B`` (``2GiB``); no unit: GiB (``4`` is 4Gi);
- a fraction is allowed when the size is a whole number of bytes (``1.5Gi``
  yes, ``0.1`` GiB no);
- at most `MAX_SIZE_CHARS` characters in all (checked first).

The arithmetic is on integers, so nothing is rounded.  `format_bytes` writes a
size back in a form `parse_size` reads; `quote` is how a message shows a value
someone else wrote.
"""

from __future__ import annotations

import re

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
_QUANTITY = re.compile(r"([0-9]+)?(?:\.([0-9]*))?\s*(?:([KMGT]i?|k)B?)?")
MAX_SIZE_CHARS = 64
"""Characters a size may have: the exact form of one byte in GiB,
0.000000000931322574615478515625Gi, has 34."""
_EXAMPLES = "use e.g. 2Gi, 3276Mi, 512M (Ki Mi Gi Ti binary, K M G T decimal, a bare number is GiB)"

QUOTE_CHARS = 64


def quote(text: str) -> str:
    """`text`, written by someone else, as a message shows it: whole when short,
    else its first QUOTE_CHARS characters, '…' and its length, so a message stays
    short whatever it quotes; characters that are not printable are escaped."""
    head = text[:QUOTE_CHARS]
    if not head.isprintable():
        head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    if len(text) <= QUOTE_CHARS:
        return head
    return f"{head}… ({len(text)} characters)"


class SizeError(ValueError):
    """A text that is not a size.  str() quotes the text ("'2X' is not a memory
    size; ..."); `reason` is the same without it, for a caller that already
    shows the text ("not a memory size; ...")."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"'{quote(text)}' is {reason}")
        self.reason = reason


def parse_size(text: str) -> int:
    """Bytes from a size such as 2Gi, 3276Mi, 512M or 4 (GiB); surrounding
    blanks are ignored.  Raises SizeError with a message for a person."""
    text = text.strip()
    if len(text) > MAX_SIZE_CHARS:
        raise SizeError(
            text, f"not a memory size: longer than {MAX_SIZE_CHARS} characters; {_EXAMPLES}"
        )
    m = _QUANTITY.fullmatch(text) if text.isascii() else None
    if m is None or not (m.group(1) or m.group(2)):
        raise SizeError(text, f"not a memory size; {_EXAMPLES}")
    whole, fraction = m.group(1) or "", m.group(2) or ""
    unit = _UNITS[m.group(3) or ""]
    scale: int = 10 ** len(fraction)
    part, rest = divmod(int(fraction or "0") * unit, scale)
    if rest:
        raise SizeError(text, "not a whole number of bytes")
    return int(whole or "0") * unit + part


def format_bytes(n: int) -> str:
    """Bytes in the unit people write in requests: Mi when whole, else Ki, else bytes."""
    if n % MiB == 0:
        return f"{n // MiB}Mi"
    if n % KiB == 0:
        return f"{n // KiB}Ki"
    return f"{n}B"
