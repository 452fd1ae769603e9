"""The one size parser, the one byte formatter and the one way a message
quotes a value someone else wrote."""

import pytest

from nri_gpushare.units import (
    MAX_SIZE_CHARS,
    GiB,
    MiB,
    SizeError,
    format_bytes,
    parse_size,
    quote,
)


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
        (".5", GiB // 2),
        ("2.", 2 * GiB),
        ("2 Gi", 2 * GiB),
        ("2GiB", 2 * GiB),
        ("8k", 8000),
        ("8KB", 8000),
        ("1.5K", 1500),
        ("1Ti", 1 << 40),
        ("2T", 2 * 10**12),
        ("0", 0),
        ("0.000000000931322574615478515625Gi", 1),  # one byte, exactly
        ("0.000000000931322574615478515625", 1),  # bare: GiB
        ("1" + "0" * 61 + "Ki", 10**61 * 1024),  # the longest size allowed, 64 characters
    ],
)
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_parse_size_is_integer_exact() -> None:
    # 28-digit decimal arithmetic rounded this to 1 GiB, a whole number of bytes.
    with pytest.raises(SizeError, match="not a whole number of bytes"):
        parse_size("1.0000000000000000000000000001Gi")
    # ... and a number past 28 digits lost its last digits.
    assert (
        parse_size("12345678901234567890123456789012Ki") == 12345678901234567890123456789012 * 1024
    )


@pytest.mark.parametrize(
    "text", ["2X", "-1", "", ".", "Gi", "1e3", "2gi", "2B", "2 Gi B", "1,5Gi", "+1", "0x10"]
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(SizeError, match="is not a memory size; use e.g. 2Gi") as info:
        parse_size(text)
    assert info.value.reason.startswith("not a memory size; use e.g. 2Gi, 3276Mi, 512M")


@pytest.mark.parametrize("text", ["\u0663Gi", "\uff12Gi", "1\uff10", "\u00b2", "\u0663.5"])
def test_parse_size_refuses_digits_other_than_ascii(text: str) -> None:
    with pytest.raises(SizeError) as info:
        parse_size(text)
    assert str(info.value) == (
        f"'{text}' is not a memory size; use e.g. 2Gi, 3276Mi, 512M "
        "(Ki Mi Gi Ti binary, K M G T decimal, a bare number is GiB)"
    )


@pytest.mark.parametrize("n", [MAX_SIZE_CHARS + 1, 5000, 10**6])
def test_parse_size_bounds_the_length_first(n: int) -> None:
    # 4,301 digits made int() raise; a million made Decimal overflow.
    with pytest.raises(SizeError) as info:
        parse_size("1" * n)
    assert info.value.reason.startswith(
        f"not a memory size: longer than {MAX_SIZE_CHARS} characters"
    )
    assert len(str(info.value)) < 300
    assert parse_size("1" * 10 + " " * (MAX_SIZE_CHARS - 12) + "Ki") == 1111111111 * 1024


def test_size_error_is_a_value_error_with_and_without_the_text() -> None:
    with pytest.raises(ValueError) as info:
        parse_size("lots")
    assert isinstance(info.value, SizeError)
    assert str(info.value).startswith("'lots' is not a memory size")
    assert info.value.reason.startswith("not a memory size")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("2Gi", "2Gi"),
        ("", ""),
        ("x" * 64, "x" * 64),
        ("x" * 65, "x" * 64 + "… (65 characters)"),
        ("y" * (3 << 20), "y" * 64 + "… (3145728 characters)"),
        ("a\nb\x00", "a\\nb\\x00"),
        ("\uff12Gi", "\uff12Gi"),  # printable: shown as written
    ],
)
def test_quote(text: str, shown: str) -> None:
    assert quote(text) == shown
