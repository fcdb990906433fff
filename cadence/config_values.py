"""Values that flags carry as text: sizes with units, JSON objects."""

from __future__ import annotations

import json
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def json_object(text: str, name: str) -> dict:
    """A flag's JSON object (ValueError naming the flag otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object")
    return value


def parse_size(text: str | int) -> int:
    """Bytes from an int or a size such as '2147483648', '2GiB', '512MiB', '1.5G'."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"{text!r} is not a size (give bytes, or a number with a unit such as 4GiB, 512MiB)"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
