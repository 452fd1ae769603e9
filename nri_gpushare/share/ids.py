"""Device IDs as ranges: ``[0, 1, 2, 3, 7]`` <-> ``"0-3,7"``.

The device plugin numbers each resource's devices 0, 1, ...; a container's
IDs travel in one annotation (`nri_gpushare.names.KUBELET_ANNOTATIONS`), compactly, and
come back in the daemon's status.  Parsing is bounded: the text comes from a
container's annotations, which only the device plugin should have written,
but is read as untrusted like every other value."""

from __future__ import annotations

from collections.abc import Iterable

MAX_TEXT = 4096
"""Longest ranges text accepted."""
MAX_ID = 99_999
"""Largest device ID (8 GPUs of 80 GiB are 640 memory IDs; 16 GPUs 1,600 core IDs)."""


class BadIds(ValueError):
    """Text that is not a list of device-ID ranges; str() says why."""


def format_ids(ids: Iterable[int]) -> str:
    """Sorted, merged ranges: ``"0-3,7"``; ``""`` for none."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_run(run))
        run = [i]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_ids(text: str) -> frozenset[int]:
    """The IDs in ``"0-3,7"``; BadIds for anything else (empty text, a
    reversed or overlapping range, a number past `MAX_ID`)."""
    if len(text) > MAX_TEXT:
        raise BadIds(f"longer than {MAX_TEXT} characters")
    if not text:
        raise BadIds("no device IDs")
    ids: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.partition("-")
        a, b = _number(low), (_number(high) if sep else None)
        if b is None:
            b = a
        if b < a:
            raise BadIds(f"range {part!r} runs backwards")
        span = set(range(a, b + 1))
        if span & ids:
            raise BadIds(f"range {part!r} repeats IDs")
        ids |= span
    return frozenset(ids)


def _number(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise BadIds(f"{text[:16]!r} is not a device ID (0..{MAX_ID})")
    return int(text)


def device_id(n: int) -> str:
    """The kubelet's device ID for number `n`."""
    return str(n)


def id_number(device: str) -> int:
    """The number of a device ID the kubelet sent back; BadIds if not ours."""
    return _number(device)
