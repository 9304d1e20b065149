"""The client's one call policy (call_policy.Call): each rule, on a fake clock.

Attempts raise the typed errors transports raise; the clock and the pauses are
the test's, so the bounds are checked, not the machine's speed."""

from __future__ import annotations

import pytest

from dlfs import errors, limits
from dlfs.client import process_state
from dlfs.client.ticket import DatasetTicket
from dlfs.client.transport.call_policy import Call, stall_s, time_left
from dlfs.types import DatasetInfo


class Clock:
    def __init__(self):
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def call(clock: Clock, *, timeout_s: float = 60.0, reconnect_timeout_s: float = 10.0,
         address: str = "reached:1", retry: bool = True) -> Call:
    process_state.reached.add("reached:1")
    return Call(address, timeout_s=timeout_s, reconnect_timeout_s=reconnect_timeout_s,
                retry=retry, clock=clock, sleep=clock.sleep)


def lost(stalled: bool = False) -> errors.Unavailable:
    error = errors.Unavailable("worker at unix:@x dropped the connection (reset)")
    error.connection_lost, error.stalled = True, int(stalled)
    return error


def refused(split: int = 0) -> errors.Overloaded:
    error = errors.Overloaded(f"refused (split {split})")
    error.refused_at_connect, error.split = True, split
    return error


def script(outcomes):
    """An attempt that raises the next of `outcomes` (an exception) or returns it."""
    left = list(outcomes)
    made = []

    def attempt():
        outcome = left.pop(0)
        made.append(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    attempt.made = made
    return attempt


def test_a_lost_connection_is_tried_again_at_once_without_spending_the_window():
    clock = Clock()
    attempt = script([lost(), lost(), "ok"])
    assert call(clock, reconnect_timeout_s=0.001).run(attempt) == "ok"
    assert clock.pauses == []


def test_each_stall_doubles_the_next_connections_stall_bound():
    clock = Clock()
    seen = []

    def attempt():
        seen.append(stall_s())
        if len(seen) < 3:
            raise lost(stalled=True)
        return "ok"

    assert call(clock).run(attempt) == "ok"
    assert seen == [limits.data_reply_stall_s * k for k in (1, 2, 4)]
    assert stall_s() == limits.data_reply_stall_s  # outside a call


def test_a_split_refusal_is_tried_once_per_process_and_once_more_then_the_other_way():
    clock = Clock()
    attempt = script([refused(split=3)] * 4 + ["data path"])
    ways = []
    assert call(clock).run(attempt, lambda step: ways.append(step) or "grpc") == "grpc"
    assert len(attempt.made) == 4 and clock.pauses == []
    assert [(s.action, s.rule) for s in ways] == [("other way", "refused")]


def test_a_refusal_without_another_way_waits_and_tries_again_within_the_window():
    clock = Clock()
    attempt = script([refused(), refused(), "ok"])
    assert call(clock).run(attempt) == "ok"
    assert clock.pauses == [limits.data_overloaded_retry_s] * 2


def test_an_unreached_data_path_that_never_worked_takes_the_other_way_at_once():
    clock = Clock()
    attempt = script([errors.Unavailable("nothing listens")])
    assert call(clock).run(attempt, lambda step: step.rule,
                           fall_back_unreached=True) == "unreached"
    assert clock.pauses == []


def test_an_unreached_daemon_is_waited_for_within_the_window_from_the_first_failure():
    clock = Clock()
    down = [errors.Unavailable("DLFS daemon at reached:1 is unavailable") for _ in range(64)]
    with pytest.raises(errors.Unavailable) as raised:
        call(clock, reconnect_timeout_s=3.0).run(script(down))
    assert limits.retry_backoff_s[:3] == tuple(clock.pauses[:3])  # growing pauses
    assert 3.0 - limits.retry_backoff_s[-1] < clock.now <= 3.0
    assert raised.value.message.endswith(f"[the same on each of {len(clock.pauses) + 1} "
                                         "attempts]")
    # A lost connection between failures starts the window (and the backoff) again.
    clock = Clock()
    outcomes = [errors.Unavailable("down") for _ in range(4)] + [lost()] + \
        [errors.Unavailable("down") for _ in range(4)]
    assert call(clock, reconnect_timeout_s=1.0).run(script(outcomes + ["ok"])) == "ok"
    assert clock.pauses == list(limits.retry_backoff_s[:4]) * 2


def test_a_daemon_never_reached_gets_the_first_contact_bound():
    clock = Clock()
    process_state.reached.discard("never:1")
    with pytest.raises(errors.Unavailable):
        call(clock, address="never:1").run(script([errors.Unavailable("down")
                                                   for _ in range(64)]))
    assert clock.now <= limits.first_contact_timeout_s


def nobody_listens() -> errors.Unavailable:
    error = errors.Unavailable("DLFS daemon at x:1 is unavailable: nothing listens there")
    error.refused = True
    return error


def test_a_refusal_from_a_daemon_never_reached_is_raised_at_once():
    clock = Clock()
    process_state.reached.discard("never:1")
    attempt = script([nobody_listens(), "never"])
    with pytest.raises(errors.Unavailable) as raised:
        call(clock, address="never:1").run(attempt)
    assert len(attempt.made) == 1 and clock.pauses == [] and raised.value.tried == ()
    assert raised.value.refused
    # A daemon reached before that refuses is restarting: waited for within the window.
    attempt = script([nobody_listens(), nobody_listens(), "ok"])
    assert call(clock).run(attempt) == "ok"
    assert clock.pauses == list(limits.retry_backoff_s[:2])
    # A data path that never worked still takes the other way first.
    process_state.reached.discard("never:1")
    attempt = script([nobody_listens()])
    assert call(clock, address="never:1").run(attempt, lambda step: step.rule,
                                               fall_back_unreached=True) == "unreached"


def test_the_daemons_of_a_ticket_count_as_reached_where_it_is_opened():
    """A process started afresh (a spawned DataLoader worker) that opens a ticket waits
    for its daemon restarting, as the process that made the ticket would."""
    process_state.reached.discard("ticketed:7010")
    info = DatasetInfo("ds", samples=1, bytes=1, sealed=True, created_ns=0, extents=1)
    dataset = DatasetTicket(("ticketed:7010",), {}, info, {}).open()
    try:
        assert "ticketed:7010" in process_state.reached
    finally:
        dataset.client.close()
        process_state.reached.discard("ticketed:7010")


def test_the_deadline_bounds_the_whole_call_and_every_attempt_inside_it():
    clock = Clock()
    lefts = []

    def attempt():
        lefts.append(time_left(100.0))
        clock.now += 4.0  # each attempt takes 4 s, then the daemon is found restarting
        raise errors.Unavailable("down")

    with pytest.raises(errors.Unavailable):
        call(clock, timeout_s=10.0, reconnect_timeout_s=60.0).run(attempt)
    assert lefts[0] == 10.0 and all(b < a for a, b in zip(lefts, lefts[1:]))
    assert clock.now <= 10.0 + 4.0  # no attempt starts past the deadline
    assert time_left(100.0) == 100.0  # outside a call


def test_a_nested_call_keeps_the_outer_deadline():
    clock = Clock()
    outer = call(clock, timeout_s=5.0)

    def attempt():
        clock.now += 2.0
        inner = call(clock, timeout_s=60.0)
        return inner.run(lambda: time_left(60.0))

    assert outer.run(attempt) == 3.0


def test_a_call_made_once_and_other_errors_are_raised_at_once():
    clock = Clock()
    attempt = script([lost()])
    with pytest.raises(errors.Unavailable):
        call(clock, retry=False).run(attempt)
    for error in (errors.NotFound("no such dataset"), errors.InvalidReply("9 samples for 8"),
                  errors.Overloaded("too many requests"), errors.DeadlineExceeded("late")):
        attempt = script([error, "never"])
        with pytest.raises(type(error)) as raised:
            call(clock).run(attempt)
        assert raised.value.tried == () and len(attempt.made) == 1


def test_the_error_says_what_was_tried():
    clock = Clock()
    attempt = script([lost(), lost(), refused(), errors.NotFound("gone")])
    with pytest.raises(errors.NotFound) as raised:
        call(clock).run(attempt)
    assert raised.value.message == (
        "gone [4 attempts, before this one: 2x worker at unix:@x dropped the connection "
        "(reset); refused (split 0)]")
    assert len(raised.value.tried) == 4
