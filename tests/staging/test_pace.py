"""An ingest's cap in bytes a second: the pace's arithmetic on a test clock, then
`dlfs ingest --max-rate` against a real daemon."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from dlfs import Client, InvalidArgument, limits
from dlfs.staging.pace import Pace
from helpers.daemons import read_dataset
from helpers.trees import write_tree


class ManualClock:
    """A clock that moves only when the pace sleeps (or the test says so)."""

    def __init__(self):
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds
        self.slept += seconds


def test_a_fast_sender_is_held_to_the_rate_with_one_burst_at_most():
    clock = ManualClock()
    pace = Pace(1_000_000, clock=clock, sleep=clock.sleep)
    for _ in range(100):  # 100 MB at 1 MB/s: 100 s, less the burst it may send at once
        pace.spend(1_000_000)
    assert clock.now - 100.0 == pytest.approx(100 - limits.ingest_rate_burst_s)


def test_a_sender_that_fell_behind_catches_up_by_one_burst_only():
    clock = ManualClock()
    pace = Pace(1_000_000, clock=clock, sleep=clock.sleep)
    pace.spend(1_000_000)
    clock.now += 60  # a slow source: a minute without anything to send
    burst = int(limits.ingest_rate_burst_s * 1_000_000)
    pace.spend(burst)  # what it missed is not owed to it: one burst goes at once...
    assert clock.slept == pytest.approx(1 - limits.ingest_rate_burst_s)
    before = clock.slept
    pace.spend(500_000)  # ...then the rate holds again
    assert clock.slept - before == pytest.approx(0.5)


def test_a_rate_below_the_least_is_refused():
    with pytest.raises(InvalidArgument, match="--max-rate"):
        Pace(limits.ingest_rate_min - 1)


def test_dlfs_ingest_max_rate_caps_the_stream(daemon, tmp_path):
    rng = np.random.default_rng(1)
    files = {f"f{i:03d}.bin": rng.bytes(256 * 1024) for i in range(48)}  # 12 MiB
    write_tree(tmp_path / "src", files)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                           "ingest", str(tmp_path / "src"), "capped", "--max-rate", "6MiB/s",
                           "--progress", "none"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    # 12 MiB at 6 MiB/s: at least 2 s less one burst, however fast the machine.
    assert elapsed >= 2 - limits.ingest_rate_burst_s
    with Client(daemon.address) as client:
        assert read_dataset(client, "capped") == files


@pytest.mark.parametrize("value, says", [("1KiB", "below the least allowed"),
                                         ("fast", "is not a size")])
def test_a_bad_max_rate_is_refused_before_anything_is_sent(tmp_path, value, says):
    done = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", "127.0.0.1:1",
                           "ingest", str(tmp_path), "x", "--max-rate", value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
