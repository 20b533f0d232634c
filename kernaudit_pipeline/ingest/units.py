"""Numbers and units as profilers print them, old and new.

Nsight Compute's unit spellings changed over the years: ncu 2019-2022 wrote time as
``nsecond``/``usecond``/``msecond`` and frequency as ``cycle/second`` (a V100 capture of 2020
prints ``"SM Frequency","cycle/second","1,018,478,881.28"``); ncu 2023+ writes
``cycle/nsecond`` or ``cycle/usecond`` (``1.98`` cycle/nsecond is 1,980 MHz); a ncu 2025 CSV
printed with ``--print-units base`` writes ``hz`` and ``ns``; the raw page writes ``us``.
Every spelling here was seen in a real file (tests/fixtures/public) or ncu's own help text.

Memory units carry SI prefixes: ``Kbyte`` is 1,000 bytes, not 1,024. Evidence, from this
project's H200 capture (ncu 2025.3.1): a Triton GEMM whose ``metadata.shared`` is 147,456
bytes shows ``launch__shared_mem_per_block_dynamic`` = ``147.456000`` ``Kbyte/block``, and the
same report exported with ``--print-units base`` shows ``147,456`` ``byte/block``. Binary
prefixes (``KiB``, ``MiB``) are 1,024-based.

A value that is not a finite number is an error (:class:`BadValue`), never a silent ``None``
or ``inf``: ``1e308`` milliseconds is ``inf`` microseconds, a unit error to quarantine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

MISSING_TOKENS = frozenset({"", "n/a", "na", "no data", "nan", "none", "null", "-", "--"})


class BadValue(ValueError):
    """A field that should be a number (in a known unit) and is not."""


def parse_number(text: object) -> float | None:
    """``"1,234.5"`` -> 1234.5; ``"n/a"``/``"no data"``/``""`` -> None; garbage, booleans
    and values that are not finite raise :class:`BadValue`."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise BadValue(f"boolean {text!r} is not a number")
    if isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:
            raise BadValue(f"integer with {len(str(abs(int(text))))} digits is out of range") from None
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise BadValue(f"{text!r} is not a finite number")
        return value
    s = str(text).strip().strip('"')
    if s.lower() in MISSING_TOKENS:
        return None
    s = s.replace(",", "")
    try:
        value = float(s)
    except ValueError:
        raise BadValue(f"not a number: {str(text)[:40]!r}") from None
    if not math.isfinite(value):
        raise BadValue(f"{str(text)[:40]!r} is not a finite number")
    return value


def finite(value: float | None, what: str) -> float | None:
    """``value`` after a unit conversion, refused when it overflowed to ``inf``."""
    if value is not None and not math.isfinite(value):
        raise BadValue(f"{what} is not a finite number after unit conversion")
    return value


_TIME_TO_US = {
    "ns": 1e-3, "nsec": 1e-3, "nsecond": 1e-3, "nanosecond": 1e-3,
    "us": 1.0, "usec": 1.0, "usecond": 1.0, "microsecond": 1.0, "\u00b5s": 1.0, "\u03bcs": 1.0,
    "ms": 1e3, "msec": 1e3, "msecond": 1e3, "millisecond": 1e3,
    "s": 1e6, "sec": 1e6, "second": 1e6,
}
_BYTE_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
                "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}
_BYTE_RE = re.compile(r"^(k|m|g|t|ki|mi|gi|ti)?(?:bytes?|b)(?:/block)?$")
_HZ_TO_MHZ = {"hz": 1e-6, "khz": 1e-3, "mhz": 1.0, "ghz": 1e3,
              # cycles per unit of time, as ncu writes the SM and DRAM frequencies
              "cycle/second": 1e-6, "cycle/s": 1e-6, "cycle/msecond": 1e-3, "cycle/ms": 1e-3,
              "cycle/usecond": 1.0, "cycle/us": 1.0, "cycle/nsecond": 1e3, "cycle/ns": 1e3}


def _key(unit: object) -> str:
    return "" if unit is None else " ".join(str(unit).split()).lower()


def _scaled(value: float | None, unit: str, table: Mapping[str, float], kind: str, what: str) -> float | None:
    """``value`` in ``unit`` times the table's factor; an unknown unit is refused, never guessed."""
    if value is None:
        return None
    factor = table.get(_key(unit))
    if factor is None:
        raise BadValue(f"unknown {kind} unit {unit!r}")
    return finite(value * factor, what)


def time_to_us(value: float | None, unit: str) -> float | None:
    return _scaled(value, unit, _TIME_TO_US, "time", "the duration")


def bytes_from(value: float | None, unit: str) -> float | None:
    """``Kbyte/block`` (SI, 1,000), ``KiB`` (1,024), ``byte``; a missing unit is bytes."""
    if value is None:
        return None
    key = _key(unit).replace("kbytes", "kbyte")
    if key in ("", "bytes"):
        return value
    match = _BYTE_RE.match(key)
    if match is None:
        raise BadValue(f"unknown byte unit {unit!r}")
    return finite(value * _BYTE_PREFIX[match.group(1) or ""], "the byte count")


def freq_to_mhz(value: float | None, unit: str) -> float | None:
    return _scaled(value, unit, _HZ_TO_MHZ, "frequency", "the frequency")


def as_int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def dims_product(text: object) -> int | None:
    """``"(256, 1, 1)"`` -> 256; ``[2, 64, 1]`` -> 128."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        parts = [as_int(parse_number(x)) for x in text]
        if any(p is None for p in parts):
            raise BadValue(f"not a dimension tuple: {str(text)[:40]!r}")
    else:
        s = str(text).strip()
        if s.lower() in MISSING_TOKENS:
            return None
        nums = re.findall(r"\d+", s)
        if not nums:
            raise BadValue(f"not a dimension tuple: {s[:40]!r}")
        parts = [int(x) for x in nums]
    total = 1
    for p in parts:
        total *= p
    return total
