"""Value parsing shared by every request source: lists, whole numbers, sizes,
compute percentages, choices and GPU lists.  Errors are `Invalid`, without the
key: the caller knows which key or variable it read."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..model import Gpu
from ..units import parse_size


class Invalid(Exception):
    """A value's problem, without the key (the caller knows the key)."""


def items(text: str) -> list[str]:
    out = [i.strip() for i in text.split(",")]
    if not text.strip() or "" in out:
        raise Invalid("empty value in the list")
    return out


def is_number(text: str) -> bool:
    """ASCII decimal digits only (str.isdigit also accepts e.g. '²')."""
    return text.isascii() and text.isdigit()


def int_list(text: str, low: int, high: int | None, single: bool = False) -> list[int]:
    values = items(text)
    if single and len(values) != 1:
        raise Invalid("must be a single value")
    out = []
    for item in values:
        if not is_number(item) or int(item) < low or (high is not None and int(item) > high):
            raise Invalid(f"'{item}' is not allowed")
        out.append(int(item))
    return out


def memory_list(text: str) -> tuple[int, ...]:
    """gpu-memory: sizes per GPU; a single 0 opts out."""
    try:
        values = tuple(parse_size(i) for i in items(text))
    except ValueError as e:
        raise Invalid(str(e)) from None
    if values != (0,) and 0 in values:
        raise Invalid("every GPU needs more than 0 bytes (a single 0 opts the container out)")
    return values


def core_list(text: str) -> tuple[int, ...]:
    """gpu-core: percent per GPU, multiples of 5 in 5..100."""
    values = items(text)
    out = []
    for item in values:
        if not is_number(item) or not 5 <= int(item) <= 100 or int(item) % 5:
            which = f"'{item}' " if len(values) > 1 else ""
            raise Invalid(f"{which}must be a multiple of 5 between 5 and 100 (percent of a GPU)")
        out.append(int(item))
    return tuple(out)


def choice(allowed: Sequence[str]) -> Callable[[str], str]:
    """A parser for one of `allowed`, case-insensitive."""

    def parse(text: str) -> str:
        if text.lower() not in allowed:
            raise Invalid(f"must be one of {', '.join(allowed)}")
        return text.lower()

    return parse


class GpuList:
    """Parses GPU lists (indexes or UUIDs) against the node's GPUs."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self.gpus = list(gpus)
        self.by_uuid = {g.uuid.lower(): g.index for g in self.gpus}
        self.indexes = {g.index for g in self.gpus}

    def parse(self, text: str, indexes_only: bool = False) -> tuple[int, ...]:
        out: list[int] = []
        for item in items(text):
            if is_number(item):
                index = int(item)
                if index not in self.indexes:
                    raise Invalid(f"no GPU {index} on this node; {self.known()}")
            elif not indexes_only and item.lower() in self.by_uuid:
                index = self.by_uuid[item.lower()]
            else:
                what = "an index" if indexes_only else "an index or a UUID"
                raise Invalid(f"'{item}' is not {what} of a GPU of this node; {self.known()}")
            if index in out:
                raise Invalid(f"GPU {item} is listed twice")
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
