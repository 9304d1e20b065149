"""Waiting for an event that a real process makes happen, with a bound for a hang."""

from __future__ import annotations

import time


def wait_until(condition, what: str, timeout_s: float) -> None:
    """Poll `condition()` until it holds; fail naming `what` after `timeout_s` (a bound
    for a hang on a loaded machine, not a speed target)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened within {timeout_s:g} s: {what}"
        time.sleep(0.1)
