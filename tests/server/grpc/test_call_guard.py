"""The gRPC front door's call guard without a daemon: tickets, and the watchdog that
cancels calls that stalled or read a trickle, on an injected clock."""

from __future__ import annotations

import pytest

import dlfs
from dlfs import limits
from dlfs.server.grpc.call_guard import CallGuard


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Context:
    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def guard():
    clock = Clock()
    made = CallGuard(slots=3, per_client=2, stall_timeout_s=10.0, clock=clock)
    made.clock_ = clock
    yield made
    made.close()


def test_a_read_that_moves_a_trickle_is_cancelled_at_its_deadline(guard):
    clock = guard.clock_
    read, ingest = Context(), Context()
    reading = guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.5:4711", read)
    ingesting = guard.admit("/dlfs.v1.Dlfs/Ingest", "ipv4:10.0.0.6:4711", ingest)
    # A message of 64 KiB every 4 s: never a stall (10 s), far below 1 MiB/s.
    for _ in range(2):
        clock.now += 4
        reading.progress(64 * 1024)
        ingesting.progress(64 * 1024)
        assert guard.check_stalls() == []
    clock.now += 4
    reading.progress(64 * 1024)
    ingesting.progress(64 * 1024)
    # 12 s in: past 10 s plus 192 KiB at 1 MiB/s.  An ingest goes at its source's pace:
    # only the stall rule applies to it.
    assert reading.deadline() == pytest.approx(
        1000.0 + 10.0 + 3 * 64 * 1024 / limits.stream_bytes_per_s_min)
    assert guard.check_stalls() == [reading] and read.cancelled and not ingest.cancelled


def test_a_read_at_the_floor_rate_is_never_cancelled(guard):
    clock = guard.clock_
    context = Context()
    ticket = guard.admit("/dlfs.v1.Dlfs/ReadRange", "ipv4:10.0.0.5:1", context)
    for _ in range(100):
        clock.now += 1
        ticket.progress(limits.stream_bytes_per_s_min)
        assert guard.check_stalls() == []
    assert not context.cancelled


def test_tickets_are_bounded_in_all_and_per_client(guard):
    first = guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.5:1", Context())
    guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.5:2", Context())
    with pytest.raises(dlfs.Overloaded, match="client 10.0.0.5 already has 2"):
        guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.5:3", Context())
    guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.6:1", Context())
    with pytest.raises(dlfs.Overloaded, match="limit of 3 streamed reads"):
        guard.admit("/dlfs.v1.Dlfs/GetBatch", "ipv4:10.0.0.7:1", Context())
    first.release()
    assert guard.active() == 2
