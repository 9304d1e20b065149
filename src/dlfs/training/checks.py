"""Argument checks at the boundary of the training-side modules (pipeline, sampler, torch).

One function per kind of check, so that every module refuses a bad value
with the same kind of message: the argument's name, the range it must be
in, and the value it got.
"""

from __future__ import annotations

import numbers

from dlfs.errors import InvalidArgument


def check_int(name: str, value, low: int, high: int) -> int:
    """`value` as an int when it is an integer in ``[low, high]``, else InvalidArgument.

    Python and numpy integers pass; bools, floats and strings do not, even
    when they compare equal to an integer in range.  The message names
    `name`, the range and the value.  Cost: O(1).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer in [{low}, {high}], not {value!r}")
    return int(value)
