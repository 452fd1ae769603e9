"""Value parsing shared by every request source: lists, whole numbers, sizes,
compute percentages, choices and GPU lists.  Errors are `Invalid`, without the
key: the caller knows which key or variable it read, and cites the value.

Every value is someone else's: numbers are bounded before int() (`is_number`,
`parse_size`), and a message shows a value only through `units.quote`, once
(an error here names a list's item only when the list has more than one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from nri_gpushare.share.model import Gpu
from nri_gpushare.units import SizeError, parse_size, quote

MAX_DIGITS = 18
"""Digits a whole number may have: far more than any count, index, percentage
or size needs, and int() of it is cheap (Python refuses 4,301 digits)."""


MAX_ITEMS = 64
"""Items a list may have: more than any node's GPUs, and counted before
anything is parsed, so a huge list costs nothing (every live container's
request may be parsed again at each Synchronize)."""


CORE_RULE = "must be a multiple of 5 between 5 and 100 (percent of a GPU)"
"""gpu-core's rule per GPU, as every source's refusal states it."""


class Invalid(Exception):
    """A value's problem, without the key (the caller knows the key)."""


def items(text: str) -> list[str]:
    if text.count(",") >= MAX_ITEMS:
        raise Invalid(f"a list of at most {MAX_ITEMS} values (one per GPU) is allowed")
    out = [i.strip() for i in text.split(",")]
    if not text.strip() or "" in out:
        raise Invalid("empty value in the list")
    return out


def is_number(text: str) -> bool:
    """A whole number: ASCII decimal digits only (str.isdigit also accepts
    e.g. '²'), at most MAX_DIGITS of them."""
    return len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def _which(item: str, values: Sequence[str]) -> str:
    """The item an error is about, when the list has more than one."""
    return f"'{quote(item)}' " if len(values) > 1 else ""


def int_list(text: str, low: int, high: int | None, single: bool = False) -> list[int]:
    values = items(text)
    if single and len(values) != 1:
        raise Invalid("must be a single value")
    out = []
    for item in values:
        if not is_number(item) or int(item) < low or (high is not None and int(item) > high):
            allowed = (
                f" from {low} to {high}"
                if high is not None
                else f", at least {low}, of at most {MAX_DIGITS} digits"
            )
            raise Invalid(f"{_which(item, values)}must be a whole number{allowed}")
        out.append(int(item))
    return out


def memory_list(text: str) -> tuple[int, ...]:
    """gpu-memory: sizes per GPU; a single 0 opts out."""
    values = items(text)
    out = []
    for item in values:
        try:
            out.append(parse_size(item))
        except SizeError as e:
            raise Invalid(str(e) if len(values) > 1 else e.reason) from None
    if len(out) > 1 and 0 in out:
        raise Invalid("every GPU needs more than 0 bytes (a single 0 opts the container out)")
    return tuple(out)


def core_list(text: str) -> tuple[int, ...]:
    """gpu-core: percent per GPU, multiples of 5 in 5..100."""
    values = items(text)
    out = []
    for item in values:
        if not is_number(item) or not 5 <= int(item) <= 100 or int(item) % 5:
            raise Invalid(f"{_which(item, values)}{CORE_RULE}")
        out.append(int(item))
    return tuple(out)


Choice = TypeVar("Choice", bound=str)


def choice(allowed: Sequence[Choice]) -> Callable[[str], Choice]:
    """A parser for one of `allowed`, case-insensitive."""

    def parse(text: str) -> Choice:
        lowered = text.lower()
        for value in allowed:
            if value == lowered:
                return value
        raise Invalid(f"must be one of {', '.join(allowed)}")

    return parse


class GpuList:
    """Parses GPU lists (indexes or UUIDs) against the node's GPUs."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self.gpus = list(gpus)
        self.by_uuid = {g.uuid.lower(): g.index for g in self.gpus}
        self.indexes = {g.index for g in self.gpus}

    def parse(self, text: str, indexes_only: bool = False) -> tuple[int, ...]:
        out: list[int] = []
        values = items(text)
        for item in values:
            if is_number(item):
                index = int(item)
                if index not in self.indexes:
                    raise Invalid(f"no GPU {index} on this node; {self.known()}")
            elif not indexes_only and item.lower() in self.by_uuid:
                index = self.by_uuid[item.lower()]
            else:
                what = "an index" if indexes_only else "an index or a UUID"
                raise Invalid(
                    f"{_which(item, values)}must be {what} of a GPU of this node; {self.known()}"
                )
            if index in out:
                raise Invalid(f"GPU {item} is listed twice")  # a known index or UUID: short
            out.append(index)
        return tuple(out)

    def known(self) -> str:
        if not self.gpus:
            return "this node has no GPUs"
        return "GPUs here: " + ", ".join(f"{g.index} ({g.uuid})" for g in self.gpus)


def expand(values: tuple[int, ...], n: int) -> tuple[int, ...]:
    """A short list repeats its last value."""
    return values[:n] + (values[-1],) * (n - len(values))


def same_list(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Per-GPU lists agree when they agree once both are expanded to one length."""
    n = max(len(a), len(b))
    return expand(a, n) == expand(b, n)


def equal(a: object, b: object) -> bool:
    return a == b
