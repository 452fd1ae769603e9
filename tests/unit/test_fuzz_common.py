"""Shared settings and checks of the bad-input property tests (test_fuzz_*.py).

Every fuzz test runs derandomized (the same examples on every run, so CI is
reproducible; a failure prints the example and the blob to replay it), with no
example database and a fixed example budget.  No per-example deadline
(deadline=None): on a loaded CI machine a timing bound would flake, and a
test must not assert on time; a hang still fails the run (CI's limit), and
the inputs' sizes are bounded by the properties themselves.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

T = TypeVar("T")


def fuzz(examples: int) -> settings:
    """Settings of one fuzz test: `examples` examples, derandomized."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def refused_only(
    errors: type[BaseException] | tuple[type[BaseException], ...],
    call: Callable[..., T],
    *args: Any,
) -> T | None:
    """`call(*args)`'s result, or None when it raised one of `errors` with a
    message; any other exception fails the test."""
    try:
        return call(*args)
    except errors as e:
        assert str(e), f"{type(e).__name__} without a message"
        return None


@contextmanager
def allocates_at_most(limit: int) -> Iterator[None]:
    """Fail when the block's peak Python allocation exceeds `limit` bytes."""
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"peak allocation {peak} bytes, more than {limit}"


def text_with_odd_unicode(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text with surrogates, NULs, controls, combining marks and wide digits."""
    odd = st.sampled_from(["\x00", "\ud800", "\u0663", "\u200b", "\ufeff", "\n", "=", ",", "-"])
    return st.lists(st.one_of(st.characters(), odd), max_size=max_size).map("".join)


def overlong_varint(value: int, extra: int) -> bytes:
    """`value` as a protobuf varint padded with `extra` redundant 0x80 bytes."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value == 0 and extra == 0:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)
        if value == 0:
            extra -= 1
            if extra == 0:
                out.append(0)
                return bytes(out)
