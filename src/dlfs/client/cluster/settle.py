"""Settling a striped ingest its members hold prepared, when the first member cannot decide.

A striped ingest is committed on its first member before the others, and
that member's SEAL is the decision (`dlfs.client.cluster.striped_ingest`, docs/cluster.md).
Members left prepared ask the first member until it answers.  If it is lost
for good, they would wait forever, serving the old version, with the name
busy for new ingests.  `settle` ends that wait:

- The first member answers: its decision (committed or aborted) is applied
  now to every member still prepared.  If it still holds the version
  prepared itself, it decides by itself (it aborts after
  --prepared-ingest-timeout-s): nothing is done.
- It does not answer, and the operator says it is lost for good
  (`first_member_lost`): every other member must answer.  Members commit
  only after the first member committed, so if any of them published the
  prepared version, the decision was commit and the rest commit too;
  otherwise every member aborts it and the old version stays.  A first
  member that comes back holding the version committed would then disagree
  with the others; `dlfs datasets` names it, and `dlfs rm` there ends it.

Whatever happens, each member ends with a whole version, old or new.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from dlfs.client.transport.contract import DaemonControl
from dlfs.client.transport.control_replies import ABORTED, COMMITTED, PENDING
from dlfs.errors import DlfsError, FailedPrecondition, NotFound, Unavailable


@dataclasses.dataclass(frozen=True)
class SettleReport:
    """What `settle` did.  `decision` is "" when no member held the dataset prepared."""

    dataset: str
    generation: int = 0  # the prepared version
    first_member: str = ""
    decision: str = ""  # "committed" or "aborted"
    decided_by: str = ""  # who made the decision, in words
    settled: tuple = ()  # addresses that committed or aborted it now
    failed: tuple = ()  # (address, error message) of members that could not be told


def settle(name: str, addresses: tuple, member: Callable[[str], DaemonControl], *,
           first_member_lost: bool = False) -> SettleReport:
    """Decide the prepared ingest of dataset `name` on its members (see the module doc).

    `addresses`: daemons to look for a prepared ingest of `name` on (one
    member left prepared is enough: it knows all members; the first member,
    once it has decided, holds nothing prepared).  `member(address)`
    makes the control calls of a member (made once each: the decision must not
    wait on a member that does not answer).  Raises NotFound (none of `addresses`
    answers about `name`), FailedPrecondition (the first member still
    decides), Unavailable (the first member does not answer and
    `first_member_lost` is not set, or another member does not answer).
    """
    prepared = _find_prepared(name, addresses, member)
    if prepared is None:
        return SettleReport(name)
    generation, members = prepared
    first, others = members[0], members[1:]
    outcome = _outcome(member(first), name, generation)
    if outcome == PENDING:
        raise FailedPrecondition(
            f"the first member {first} of dataset {name!r} holds generation {generation} "
            "prepared itself: it decides, and aborts it after its --prepared-ingest-timeout-s "
            "unless a client commits it; the other members follow")
    if outcome is not None:
        decision, decided_by = outcome, f"its first member {first}"
        states = {address: _state(member(address), name, generation) for address in members}
    elif not first_member_lost:
        raise Unavailable(
            f"the first member {first} of dataset {name!r} does not answer, and it decides "
            f"whether generation {generation} is committed.  Once it is back the members "
            "follow it by themselves.  If it is lost for good, run this again with "
            "--first-member-lost")
    else:
        states = {address: _state(member(address), name, generation) for address in others}
        down = [address for address, state in states.items() if state is None]
        if down:
            raise Unavailable(
                f"member(s) {', '.join(down)} of dataset {name!r} do not answer: without "
                f"the first member {first}, every other member must answer to decide (one "
                "of them may have committed)")
        committed = [address for address, state in states.items() if state == COMMITTED]
        if committed:
            decision = COMMITTED
            decided_by = f"{committed[0]}, which had committed it (so {first} had)"
        else:
            decision = ABORTED
            decided_by = f"the operator ({first} lost; no other member had committed)"
    settled, failed = [], []
    for address in [address for address, state in states.items() if state == "prepared"]:
        control = member(address)
        decide = control.commit_ingest if decision == COMMITTED else control.abort_ingest
        try:
            decide(name, generation, retry=False)
            settled.append(address)
        except DlfsError as exc:
            failed.append((address, exc.message))
    return SettleReport(name, generation, first, decision, decided_by, tuple(settled),
                        tuple(failed))


def _find_prepared(name: str, addresses: tuple, member) -> tuple[int, tuple] | None:
    """(generation, members) of the first prepared ingest of `name` among `addresses`."""
    answered = False
    for address in addresses:
        try:
            progress = member(address).ingest_progress(name, retry=False)
        except NotFound:
            answered = True
            continue
        except Unavailable:
            continue
        answered = True
        if progress.state == "prepared" and progress.members:
            return progress.generation, tuple(progress.members)
    if not answered:
        raise Unavailable(f"none of {', '.join(addresses)} answers")
    return None


def _outcome(control: DaemonControl, name: str, generation: int) -> str | None:
    """The first member's outcome of `generation` (`control_replies.COMMITTED`, ...); None when
    it does not answer."""
    try:
        return control.ingest_outcome(name, generation, retry=False)
    except Unavailable:
        return None


def _state(control: DaemonControl, name: str, generation: int) -> str | None:
    """"prepared", "committed" (publishes `generation`), "other", or None (no answer)."""
    try:
        progress = control.ingest_progress(name, retry=False)
        if progress.state == "prepared" and progress.generation == generation:
            return "prepared"
    except NotFound:
        pass
    except Unavailable:
        return None
    try:
        info = control.get_dataset(name, retry=False)
    except NotFound:
        return "other"
    except Unavailable:
        return None
    return COMMITTED if info.sealed and info.generation == generation else "other"
