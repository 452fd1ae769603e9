"""Device-ID ranges (`nri_gpushare.share.ids`): what Allocate writes into the
annotation and what the NRI plugin and the device plugin read back.  The
text is read as untrusted: anything but well-formed ranges is BadIds, never
another exception, and nothing past the bounds is accepted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nri_gpushare.share.ids import (
    MAX_ID,
    MAX_TEXT,
    BadIds,
    device_id,
    format_ids,
    id_number,
    parse_ids,
)


@pytest.mark.parametrize(
    "ids, text",
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0-1"),
        ([3, 0, 1, 2, 7], "0-3,7"),
        ([1, 3, 5], "1,3,5"),
        ([2, 2, 3], "2-3"),
        ([9, 10, 11, 100], "9-11,100"),  # numeric, not text, order
        (range(640), "0-639"),
        ([MAX_ID], str(MAX_ID)),
    ],
)
def test_format(ids: list[int], text: str) -> None:
    assert format_ids(ids) == text
    if text:
        assert parse_ids(text) == frozenset(ids)


def test_parse_accepts_any_order_of_ranges() -> None:
    assert parse_ids("7,0-3") == {0, 1, 2, 3, 7}
    assert parse_ids("5-5") == {5}
    assert parse_ids(f"0-{MAX_ID}") == frozenset(range(MAX_ID + 1))


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "no device IDs"),
        (",", "is not a device ID"),
        ("1,", "is not a device ID"),
        (",1", "is not a device ID"),
        ("-", "is not a device ID"),
        ("1-", "is not a device ID"),
        ("-1", "is not a device ID"),
        ("1-2-3", "is not a device ID"),
        ("3-1", "runs backwards"),
        ("1-3,2", "repeats IDs"),
        ("1,1", "repeats IDs"),
        (" 1", "is not a device ID"),
        ("1 ", "is not a device ID"),
        ("+1", "is not a device ID"),
        ("1_000", "is not a device ID"),
        ("0x10", "is not a device ID"),
        ("1e3", "is not a device ID"),
        ("\u0663", "is not a device ID"),  # ARABIC-INDIC DIGIT THREE: isdigit()
        ("\u00b2", "is not a device ID"),  # SUPERSCRIPT TWO: isdigit()
        ("\uff11", "is not a device ID"),  # FULLWIDTH DIGIT ONE
        (str(MAX_ID + 1), "is not a device ID"),
        ("0-" + str(MAX_ID + 1), "is not a device ID"),
        ("9" * 40, "is not a device ID"),
        ("1\n2", "is not a device ID"),
        ("1" * (MAX_TEXT + 1), f"longer than {MAX_TEXT}"),
        (",".join(["1"] * 3000), f"longer than {MAX_TEXT}"),
    ],
)
def test_parse_refuses(text: str, words: str) -> None:
    with pytest.raises(BadIds) as err:
        parse_ids(text)
    assert words in str(err.value)
    assert len(str(err.value)) < 80  # a hostile text is not echoed at length


def test_device_id_round_trip() -> None:
    for n in (0, 1, 10, MAX_ID):
        assert id_number(device_id(n)) == n
    for bad in ("", "-1", "1.0", "a", str(MAX_ID + 1), "\u0661"):
        with pytest.raises(BadIds):
            id_number(bad)


@given(st.frozensets(st.integers(0, MAX_ID), max_size=200))
def test_round_trip(ids: frozenset[int]) -> None:
    text = format_ids(ids)
    if ids:
        assert parse_ids(text) == ids
        assert format_ids(parse_ids(text)) == text
    else:
        assert text == ""


@given(st.text(alphabet="0123456789,- x\u0663", max_size=60) | st.text(max_size=60))
def test_parse_is_total(text: str) -> None:
    """Any text gives IDs within bounds or BadIds, nothing else."""
    try:
        ids = parse_ids(text)
    except BadIds:
        return
    assert ids and all(0 <= i <= MAX_ID for i in ids)
    assert parse_ids(format_ids(ids)) == ids
