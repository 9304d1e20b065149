"""Byte sizes and counts as people write them: `size_text` for help and messages,
`parse_size` for command-line flags, `counted` for "1 file" and "2 files".  Binary
units (KiB = 1024 B), as everywhere in DLFS."""

from __future__ import annotations

import re

UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_FACTORS = {"": 1, "b": 1, **{name.lower(): factor for name, factor in UNITS},
            **{name[0].lower(): factor for name, factor in UNITS}}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def size_text(n: int) -> str:
    """`n` bytes in the largest binary unit that divides it exactly ("64 MiB", "1 GiB",
    "4000 B"), so a help text shows the value itself, not a rounding of it."""
    for name, factor in UNITS:
        if n and n % factor == 0:
            return f"{n // factor} {name}"
    return f"{n} B"


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """"1 file", "2 files", "12,000 files": `n` (with thousands separators) and `noun`,
    or its plural (`nouns`, by default `noun` + "s") unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


def parse_size(text: str) -> int:
    """Bytes from "65536", "64MiB", "64 MiB", "64M", "1.5GiB" (binary units, case
    ignored).  Raises ValueError naming the accepted forms."""
    match = _SIZE.fullmatch(text)
    factor = _FACTORS.get(match.group(2).lower()) if match else None
    if match is None or factor is None:
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with KiB, MiB, GiB "
                         "or TiB (64MiB, 1.5GiB)")
    value = float(match.group(1)) * factor
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)
