"""Number and unit parsing shared by the parsers: every figure lands in base units."""

from __future__ import annotations

import pytest

from kernaudit_pipeline.ingest._common import compute_capability_from_arch
from kernaudit_pipeline.ingest.units import (
    BadValue, bytes_from, dims_product, freq_to_mhz, parse_number, time_to_us,
)


@pytest.mark.parametrize("text, value", [
    ("3,411,968", 3_411_968.0), ("1,024", 1024.0), ("147.456000", 147.456), ("0", 0.0),
    ("  12.5 ", 12.5), (7, 7.0), ("1,234.5", 1234.5),
])
def test_numbers_with_thousands_separators(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["n/a", "N/A", "no data", "", None, "nan", "-"])
def test_missing_values_are_none_not_zero(text):
    assert parse_number(text) is None


@pytest.mark.parametrize("text", ["lots", "12abc", "1.2.3"])
def test_garbage_raises(text):
    with pytest.raises(BadValue):
        parse_number(text)


@pytest.mark.parametrize("value, unit, us", [
    (25.888, "us", 25.888), (25.888, "usecond", 25.888), (25_888, "ns", 25.888),
    (25_888, "nsecond", 25.888), (1.569, "ms", 1569.0), (1.569, "msecond", 1569.0), (2, "s", 2e6),
])
def test_time_units_to_microseconds(value, unit, us):
    assert time_to_us(value, unit) == pytest.approx(us)


def test_unknown_time_unit_is_an_error_not_a_guess():
    with pytest.raises(BadValue, match="furlong"):
        time_to_us(1.0, "furlong")
    with pytest.raises(BadValue):
        time_to_us(1.0, "cycle")


@pytest.mark.parametrize("value, unit, nbytes", [
    # ncu's Kbyte is SI: 147.456 Kbyte/block is Triton's metadata.shared of 147,456 bytes
    (147.456, "Kbyte/block", 147_456), (1.024, "Kbyte/block", 1024), (233.472, "Kbyte", 233_472),
    (16.793344, "Mbyte", 16_793_344), (0, "byte/block", 0), (1024, "byte", 1024),
    (144, "KiB", 147_456), (1, "MiB", 1_048_576), (5, "", 5),
])
def test_byte_units(value, unit, nbytes):
    assert bytes_from(value, unit) == pytest.approx(nbytes)


def test_unknown_byte_unit_raises():
    with pytest.raises(BadValue):
        bytes_from(1.0, "sector")


def test_frequency_units():
    assert freq_to_mhz(1.736199, "Ghz") == pytest.approx(1736.199)
    assert freq_to_mhz(1_980_000_000, "hz") == pytest.approx(1980.0)
    assert freq_to_mhz(1980, "Mhz") == 1980


def test_dimension_tuples_and_archs():
    assert dims_product("(256, 1, 1)") == 256
    assert dims_product([2, 64, 1]) == 128
    assert dims_product("n/a") is None
    assert compute_capability_from_arch(90) == "9.0"
    assert compute_capability_from_arch("sm_90a") == "9.0"
    assert compute_capability_from_arch("100") == "10.0"
    assert compute_capability_from_arch("8.9") == "8.9"


@pytest.mark.parametrize("text, exact", [
    ("232.45", 232_448), ("147.46", 147_456), ("24.58", 24_576), ("131.07", 131_072), ("1.02", 1_024),
    ("213.19", 213_190),  # no 128-byte multiple within +-5 B: the printed value stands
])
def test_details_page_rounding_is_undone_only_when_unambiguous(text, exact):
    from kernaudit_pipeline.ingest.ncu_details import snap_rounded_bytes
    assert snap_rounded_bytes(text, "Kbyte/block", bytes_from(parse_number(text), "Kbyte/block")) == exact
