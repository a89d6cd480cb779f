"""Byte quantities: parsing "6GiB"-style strings and printing sizes for humans."""

from __future__ import annotations

import re

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"

_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: object, what: str = "value") -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts an ``int`` or a string such as ``"6GiB"``, ``"800MiB"``, ``"1.5GB"``,
    ``"4096"``. Python floats are refused: a float budget reads like Inductor's
    ``activation_memory_budget`` fraction, and dsgraph budgets are bytes.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of bytes, got bool {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must be a non-negative number of bytes, got {value}")
        return value
    if isinstance(value, float):
        raise ValueError(
            f"{what} must be bytes: an int or a string with a unit such as '6GiB' or "
            f"'800MiB'; got the float {value!r} (dsgraph budgets are bytes, not fractions)"
        )
    if isinstance(value, str):
        m = _BYTES_RE.match(value)
        unit = m.group(2).lower() if m else None
        # A bare decimal ("0.5") is refused like a float: it reads as a fraction.
        if m and unit in _UNITS:
            return int(float(m.group(1)) * _UNITS[unit])
        if m and unit == "" and "." not in m.group(1):
            return int(m.group(1))
        raise ValueError(
            f"{what}: cannot read {value!r} as bytes; write an integer or a number with one of "
            f"the units {_UNIT_NAMES} (e.g. '6GiB', '800MiB')"
        )
    raise ValueError(f"{what} must be an int or a string such as '6GiB', got {type(value).__name__}")


def format_bytes(n: int | float) -> str:
    """Human-readable size with binary units: 1288490188 -> '1.20 GiB'."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"
