"""dlfs.units: byte sizes as people write them."""

from __future__ import annotations

import pytest

from dlfs.units import parse_size, size_text


@pytest.mark.parametrize("text, expected", [
    ("65536", 65536), ("64MiB", 64 << 20), ("64 MiB", 64 << 20), ("64M", 64 << 20),
    ("64mib", 64 << 20), ("1.5GiB", 3 << 29), ("2TiB", 2 << 40), ("0", 0), ("7B", 7),
])
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "64MB", "-1", "1.5", "0.3KiB", "", "MiB"])
def test_what_is_not_a_size_is_refused_saying_what_is(text):
    with pytest.raises(ValueError, match="not a (size|whole number of bytes)"):
        parse_size(text)


def test_size_text_is_exact():
    assert [size_text(n) for n in (0, 4000, 4096, 64 << 20, 1 << 30, 3 << 29, 5 << 40)] == \
        ["0 B", "4000 B", "4 KiB", "64 MiB", "1 GiB", "1536 MiB", "5 TiB"]
    for n in (1, 1000, 4096, 3 << 29, 123456789):
        assert parse_size(size_text(n).replace(" ", "")) == n
