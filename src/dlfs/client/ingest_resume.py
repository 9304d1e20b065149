"""Resuming a broken-off ingest: what the daemons hold, checked against the source.

A resumable ingest that broke off is parked on its daemons, still
invisible, with the files they received durably.  Before a resume sends the
files after those, the client asks each daemon what it holds (`held_ingest`)
and checks that the source still starts with the same files (a digest of
their paths, sizes and mtimes, computed by `dlfs.staging.resume_prefix`
without reading their bytes).  Used by the one-daemon upload
(`dlfs.client.ingest_upload`) and the striped one
(`dlfs.client.cluster.striped_ingest`).
"""

from __future__ import annotations

import time

from dlfs.client.transport.contract import DaemonControl
from dlfs.client.transport.control_replies import UnsealedIngest
from dlfs.errors import AlreadyExists, DlfsError, NotFound, ResumeConflict, Unavailable
from dlfs.staging.progress import human_bytes
from dlfs.staging.resume_prefix import Prefix

# How long the note of an error waits for the daemons' answers (it is only a hint),
# and how often it asks one that still counts the broken stream as receiving.
_HINT_TIMEOUT_S = 5.0
_HINT_POLL_S = 0.05


def held_ingest(control: DaemonControl, name: str) -> UnsealedIngest | None:
    """The unsealed ingest of `name` the daemon holds, or None when it has none."""
    try:
        return control.ingest_progress(name)
    except NotFound:
        return None


def check_resumable(state: UnsealedIngest, name: str, address: str) -> None:
    """Raise ResumeConflict while another client still sends the ingest."""
    if state.state == "receiving":
        raise ResumeConflict(
            f"the ingest of {name!r} on {address} is still receiving from another client "
            f"({state.samples:,} files durable so far); stop that client, or wait until "
            "the daemon notices it is gone (its --stream-stall-timeout-s), then resume")


def check_prefix(state: UnsealedIngest, prefix: Prefix, name: str, address: str) -> None:
    """Raise ResumeConflict when the source's first files are not those the daemon holds."""
    if state.digest != prefix.digest:
        raise ResumeConflict(
            f"cannot resume {name!r} on {address}: the daemon holds the first "
            f"{state.samples:,} files of the broken-off ingest (the last is "
            f"{state.last_path!r}), but the source's first {prefix.count:,} files differ "
            f"(the last is {prefix.last_path!r}; names, sizes or mtimes changed).  Ingest "
            f"again without --resume after `dlfs discard {name}`")


def resume_hint(error: BaseException, controls: list[DaemonControl], name: str
                ) -> BaseException:
    """`error` of a resumable ingest, with a note on what became of the ingest.

    One daemon whose own error it is (it carries a request id) has said
    that already (its message ends with "the ingest is parked with ..." or
    "the ingest was discarded ..."): `error` is returned as it is.  Otherwise
    (the source failed here, the connection broke, a striped ingest) each
    daemon is asked what it holds, waiting while it still counts the stream
    as receiving (it notices the break a moment later), `_HINT_TIMEOUT_S` in
    all: parked with so many files, and the commands that continue or end it;
    or, when none holds anything, that nothing was kept.
    """
    if isinstance(error, (AlreadyExists, ResumeConflict)):
        return error  # refused before anything was sent; the message says what to do
    if not isinstance(error, DlfsError):
        return error
    if error.request_id is not None and len(controls) == 1:
        return error
    deadline = time.monotonic() + _HINT_TIMEOUT_S
    parked, prepared, answered = [], [], 0
    for control in controls:
        state = _settled_state(control, name, deadline)
        if state is False:
            continue
        answered += 1
        if state is None:
            continue
        files = f"{state.samples:,} files ({human_bytes(state.bytes)})"
        if state.state == "prepared":
            prepared.append(f"{control.address} holds its part prepared ({files})")
        else:
            parked.append(f"{files} on {control.address}")
    notes = []
    if parked:
        notes.append(f"the ingest is parked with {', '.join(parked)} durable: run the same "
                     "command with --resume to continue it, or "
                     f"`dlfs discard {name}` to end it and free its space")
    if prepared:  # a striped member whose part arrived whole: only a commit or abort ends it
        notes.append(f"{', '.join(prepared)}: run the same command with --resume to commit "
                     "it, else it follows the first member's decision (an abort, when that "
                     "member holds nothing)")
    if notes:
        message = f"{error.message}; {'; '.join(notes)}"
    elif answered == len(controls):
        message = f"{error.message}; nothing of the ingest was kept"
    elif isinstance(error, Unavailable):
        message = (f"{error.message}; once the daemon is back, run the same command with "
                   "--resume to continue from its last checkpoint")
    else:
        return error
    hinted = type(error)(message)
    hinted.request_id = error.request_id
    return hinted


def _settled_state(control: DaemonControl, name: str, deadline: float
                   ) -> UnsealedIngest | None | bool:
    """The parked (or prepared) ingest of `name` on `control`'s daemon; None when it holds
    none; False when it did not answer, or still counts the stream as receiving at
    `deadline` (time.monotonic())."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            state = control.ingest_progress(name, timeout_s=left, retry=False)
        except NotFound:
            return None
        except Exception:  # noqa: BLE001 - only a hint
            return False
        if state.state != "receiving":
            return state
        time.sleep(min(_HINT_POLL_S, max(0.0, deadline - time.monotonic())))
