"""The one size parser and the one byte formatter every message uses."""

import pytest

from nri_gpushare.share.units import GiB, MiB, format_bytes, parse_size


@pytest.mark.parametrize(
    ("n", "text"),
    [(4 * GiB, "4096Mi"), (3276 * MiB, "3276Mi"), (0, "0Mi"), (1536, "1536B"), (3072, "3Ki")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize("n", [0, 1024, 3 * GiB // 2, 3276 * MiB, 5 * GiB + 7 * 1024])
def test_format_bytes_reads_back(n: int) -> None:
    assert parse_size(format_bytes(n)) == n


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("2Gi", 2 * GiB),
        ("3276Mi", 3276 * MiB),
        ("512M", 512 * 10**6),
        ("4", 4 * GiB),
        (" 1.5Gi ", 3 * GiB // 2),
    ],
)
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["2X", "-1", "", "0.1", "1e3", "2gi", "\u0663Gi"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        parse_size(text)
