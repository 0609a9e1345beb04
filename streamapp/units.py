"""Byte sizes and durations written by people: parsed strictly, rejected loudly when ambiguous;
and the bytes a buffered record counts for (:func:`event_bytes`), which every byte budget uses.

A size meant as "100 MB" that is silently read as kilobytes is how a 100 GB buffer happens, so
only units with one meaning are accepted: bytes (``B`` or a bare integer), binary
``KiB/MiB/GiB/TiB`` and decimal ``kB/MB/GB/TB``. Single letters (``K``, ``M``, ``G``) and
lower-case spellings (``mb``, ``mib``) are rejected with the accepted spellings in the message.
"""

from __future__ import annotations

import re
from typing import Any

from streamapp.errors import UsageError

_BYTE_UNITS = {
    "B": 1,
    "kB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}
# A sign is read so that "-5s" is reported as negative, not as a duration without a unit.
_NUMBER_AND_UNIT = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


class UnitError(UsageError, ValueError):
    """A size or duration that cannot be read without guessing."""


def parse_bytes(text: str | int, *, name: str = "size") -> int:
    """Return a byte count for ``"512MiB"``, ``"16 MB"``, ``"1048576"`` or an int."""
    if isinstance(text, bool):
        raise UnitError(f"{name}: expected a byte size, got {text!r}")
    if isinstance(text, int):
        return _non_negative(text, name)
    match = _NUMBER_AND_UNIT.match(str(text))
    if not match:
        raise UnitError(f"{name}: {text!r} is not a size; write e.g. 512MiB, 16MB or 1048576")
    number, unit = match.groups()
    unit = unit or "B"
    if unit not in _BYTE_UNITS:
        raise UnitError(
            f"{name}: unit {unit!r} in {text!r} is ambiguous or unknown; "
            f"use one of {', '.join(_BYTE_UNITS)}"
        )
    value = float(number) * _BYTE_UNITS[unit]
    if unit == "B" and "." in number:
        raise UnitError(f"{name}: {text!r} is a fraction of a byte")
    return _non_negative(int(value), name)


def parse_duration(text: str | float, *, name: str = "duration") -> float:
    """Return seconds for ``"5s"``, ``"250ms"``, ``"2min"``, ``"1h"``; a bare number is rejected."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _non_negative(float(text), name)
    match = _NUMBER_AND_UNIT.match(str(text))
    if not match or match.group(2) not in _DURATION_UNITS:
        raise UnitError(
            f"{name}: {text!r} needs a unit; write e.g. 5s, 250ms, 2min or 1h"
        )
    number, unit = match.groups()
    if float(number) < 0:
        raise UnitError(f"{name}: {text!r} is negative; a duration must be positive, e.g. 5s")
    return float(number) * _DURATION_UNITS[unit]


def milliseconds(seconds: float) -> int:
    """A duration in whole milliseconds, rounded: the one conversion of a setting's seconds, so every
    reader agrees (1.001s is 1001ms; truncating would give 1000, 1.001 being 1.000999... in binary)."""
    return round(seconds * 1000)


def format_bytes(count: int) -> str:
    """``1536 -> '1.5KiB'``: for messages and reports."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _non_negative(value, name):
    if value < 0:
        raise UnitError(f"{name}: must not be negative, got {value}")
    return value


def event_bytes(item: Any) -> int:
    """Key plus value bytes of a buffered event or outgoing message (anything else counts nothing)."""
    message = getattr(item, "message", None)
    return _length(getattr(message, "key", None)) + _length(getattr(message, "value", None))


def _length(data: Any) -> int:
    return len(data) if isinstance(data, (bytes, bytearray, memoryview, str)) else 0
