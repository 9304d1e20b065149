"""The client's one policy for a failed call to a daemon: again at once, again after a
pause, another way (gRPC for the data path), or raise.

Every call of a one-daemon transport that only reads (gRPC control calls, gRPC
reads, data path reads, hints and versions) runs as one `Call`, and only
`Call.decide` says what follows a failure.  The rules, in order:

1. *Lost*: a connection that broke, was reset or stopped answering
   (`Unavailable.connection_lost`: a data path worker that died or hung, a
   connection idle in the pool whose worker went away) is tried again at
   once, on a new connection: the daemon's kernel hands that one to a worker
   that accepts, a live one.  Each stall doubles the next connection's stall
   bound (`stall_s`), so a daemon that is only slow is given longer.
2. *Split refusal*: a connection refused at its HELLO by one of the daemon's
   serving processes at its own share of a split limit (`Overloaded.split`) is
   tried again at once: the next connection goes to the next process
   waiting.  As many times in a row as the refusal names processes, and once
   more (`limits.data_split_refusal_tries_max` at most).
3. *Refused*: a connection refused at its HELLO otherwise (the daemon's
   connection limit, this peer's share, no descriptors: `refused_at_connect`)
   takes the call's other way if it has one (gRPC, for
   `limits.data_overloaded_retry_s`); where it has none (a forked worker, which
   cannot use gRPC) it is tried again after that pause, within the reconnect
   window.
4. *Not reached*: Unavailable otherwise (nothing listens, the daemon restarts)
   takes the other way for good when the data path never worked (a blocked
   port).  A refused connection (`Unavailable.refused`: nothing listens there)
   to a daemon this process never reached (`process_state.reached`) is raised
   at once: a mistyped address or a daemon not started, which waiting does not
   mend.  Otherwise it is tried again after a pause (`limits.retry_backoff_s`,
   growing), within the reconnect window: `reconnect_timeout_s` from the first
   failure in a row for a daemon reached before (it is restarting),
   `limits.first_contact_timeout_s` for one never reached (a connect that timed
   out, a name that did not resolve yet).
5. Anything else is raised as it is.

A call that changes state is made with `retry=False`: one attempt, whatever
fails.  Every call has one deadline as a whole (`timeout_s` from its start):
no attempt, pause or connect runs past it (`time_left`), and nested calls (a
data path read falling back to gRPC, a cluster member's part of a batch)
keep the outermost one.  At most `limits.call_attempts_max` attempts.  When
a call fails after more than one attempt, its error's message ends with what
was tried, each attempt's target and outcome (`DlfsError.tried`).

Transport-neutral: attempts raise the typed errors of `dlfs.errors` (the gRPC
transport converts gRPC's failures inside its attempts; the data path raises
them itself).
"""

from __future__ import annotations

import contextvars
import time
from typing import Callable, NamedTuple, TypeVar

from dlfs import limits
from dlfs.client import process_state
from dlfs.errors import DlfsError, Overloaded, Unavailable

T = TypeVar("T")

# What follows a failed attempt.
AGAIN = "again"  # at once, or after `pause_s`
OTHER_WAY = "other way"  # the call's fallback (gRPC for the data path)
RAISE = "raise"


class Step(NamedTuple):
    """What `Call.decide` says follows a failed attempt, and by which rule."""

    action: str  # AGAIN, OTHER_WAY or RAISE
    rule: str  # "lost", "split", "refused", "unreached", "final"
    pause_s: float = 0.0


# The call in progress in this context: its deadline and stalls bound the attempts.
_current: contextvars.ContextVar["Call | None"] = contextvars.ContextVar("dlfs_call",
                                                                       default=None)


def time_left(bound_s: float) -> float:
    """`bound_s`, or less: what is left of the deadline of the call in progress (0 when
    it passed).  What an attempt's own timeouts (a connect, a reply, a gRPC call's
    deadline) are cut to."""
    call = _current.get()
    return bound_s if call is None else max(0.0, min(bound_s, call.deadline - call.clock()))


def stall_s() -> float:
    """How long a data connection may stay silent while a reply is due before it is
    taken for hung: `limits.data_reply_stall_s`, doubled for each stall of the call
    in progress."""
    call = _current.get()
    return limits.data_reply_stall_s * (2 ** min(call.stalls, 8) if call is not None else 1)


class Call:
    """One call's attempts under the policy (see the module's docstring).  Not
    thread-safe: one per call.

    `address`: the daemon called.  `timeout_s`: the call's deadline as a whole.
    `reconnect_timeout_s`: the reconnect window.  `retry`: False for a call made
    once.  `clock`, `sleep`: time.monotonic and time.sleep, unless a test's.
    """

    def __init__(self, address: str, *, timeout_s: float, reconnect_timeout_s: float,
                 retry: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.address = address
        self.clock = clock
        self._sleep = sleep
        started = clock()
        outer = _current.get()
        self.deadline = started + timeout_s
        if outer is not None:
            self.deadline = min(self.deadline, outer.deadline)
        self.retry = retry
        if address and address not in process_state.reached:
            reconnect_timeout_s = min(reconnect_timeout_s, limits.first_contact_timeout_s)
        self.reconnect_timeout_s = reconnect_timeout_s
        self.stalls = 0  # attempts lost to a connection that stopped answering
        self.tried: list[str] = []  # each failed attempt: its error's message
        self._unreached_since: float | None = None  # first of the failures in a row
        self._split_tries = 0  # split refusals in a row
        self._pauses = 0  # pauses so far (the backoff's index)

    def run(self, attempt: Callable[[], T], other_way: Callable[[Step], T] | None = None,
            *, fall_back_unreached: bool = False) -> T:
        """`attempt()`, again as `decide` says; `other_way(step)` where it says so (the
        call's fallback, given why).  `fall_back_unreached`: rule 4 takes the other
        way (the data path never worked).  Raises the last attempt's error, naming
        what was tried when there were several."""
        token = _current.set(self)
        try:
            for _ in range(limits.call_attempts_max):
                try:
                    result = attempt()
                except DlfsError as exc:
                    step = self.decide(exc, can_fall_back=other_way is not None,
                                       fall_back_unreached=fall_back_unreached)
                    if step.action == RAISE:
                        raise self._told(exc) from None
                    self.tried.append(exc.message)
                    if step.action == OTHER_WAY:
                        assert other_way is not None
                        try:
                            return other_way(step)
                        except DlfsError as fallback_error:
                            raise self._told(fallback_error) from None
                    if step.pause_s:
                        self._sleep(step.pause_s)
                    continue
                self._reached()
                return result
            raise AssertionError("unreachable: the last attempt is decided RAISE")
        finally:
            _current.reset(token)

    def decide(self, exc: DlfsError, *, can_fall_back: bool = False,
               fall_back_unreached: bool = False) -> Step:
        """What follows attempt error `exc` (the rules of the module's docstring)."""
        now = self.clock()
        if not isinstance(exc, Unavailable):
            self._reached()  # the daemon answered, with an error
        final = Step(RAISE, "final")
        if not self.retry or len(self.tried) + 1 >= limits.call_attempts_max:
            return final
        if isinstance(exc, Unavailable) and exc.connection_lost:
            self._reached()
            self._unreached_since, self._split_tries, self._pauses = None, 0, 0
            self.stalls += exc.stalled
            return Step(AGAIN, "lost") if now < self.deadline else final
        if isinstance(exc, Overloaded) and exc.refused_at_connect:
            self._reached()
            self._split_tries += 1
            if self._split_tries < min(exc.split + 1, limits.data_split_refusal_tries_max):
                return Step(AGAIN, "split") if now < self.deadline else final
            self._split_tries = 0
            if can_fall_back:
                return Step(OTHER_WAY, "refused")
            return self._after(now, limits.data_overloaded_retry_s, "refused")
        if isinstance(exc, Unavailable):
            if fall_back_unreached and can_fall_back:
                return Step(OTHER_WAY, "unreached")
            if exc.refused and not self._ever_reached():
                return final
            backoff = limits.retry_backoff_s
            return self._after(now, backoff[min(self._pauses, len(backoff) - 1)], "unreached")
        return final

    def _after(self, now: float, pause_s: float, rule: str) -> Step:
        """Again after `pause_s`, if the next attempt starts within the reconnect window
        (from the first failure in a row) and the deadline; else raise."""
        if self._unreached_since is None:
            self._unreached_since = now
        give_up = min(self._unreached_since + self.reconnect_timeout_s, self.deadline)
        if now + pause_s > give_up:
            return Step(RAISE, "final")
        self._pauses += 1
        return Step(AGAIN, rule, pause_s)

    def _reached(self) -> None:
        if self.address:
            process_state.reached.add(self.address)

    def _ever_reached(self) -> bool:
        """Whether this process reached the daemon called (a call without an address
        counts as reached: nothing says it was not)."""
        return not self.address or self.address in process_state.reached

    def _told(self, exc: DlfsError) -> DlfsError:
        """`exc`, its message ending with what was tried before it (when anything was)."""
        if not self.tried or exc.tried:
            return exc
        exc.tried = tuple(self.tried) + (exc.message,)
        exc.message = f"{exc.message} [{tried_summary(exc.tried)}]"
        exc.args = (exc.message,)
        return exc


def tried_summary(tried: tuple[str, ...]) -> str:
    """What a call tried (each attempt's error message, the last one raised): "the same
    on each of N attempts", or "N attempts, before this one: A; 2x B" (a run of the
    same outcome counted once)."""
    *before, last = tried
    if all(outcome == last for outcome in before):
        return f"the same on each of {len(tried)} attempts"
    runs: list[list] = []
    for outcome in before:
        if runs and runs[-1][0] == outcome:
            runs[-1][1] += 1
        else:
            runs.append([outcome, 1])
    parts = [f"{n}x {o}" if n > 1 else o for o, n in runs]
    return f"{len(tried)} attempts, before this one: " + "; ".join(parts)


def call_with_retry(attempt: Callable[[], T], *, timeout_s: float, address: str = "",
                    deadline_s: float | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """`attempt()` as one `Call` without another way: reconnect window `timeout_s`
    (0: one attempt), deadline `deadline_s` (default: the window and a minute)."""
    call = Call(address, timeout_s=timeout_s + 60.0 if deadline_s is None else deadline_s,
                reconnect_timeout_s=timeout_s, retry=timeout_s > 0, clock=clock, sleep=sleep)
    return call.run(attempt)
