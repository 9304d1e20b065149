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

from dlfs.client.transport.contract import DaemonControl
from dlfs.client.transport.control_replies import IngestState
from dlfs.errors import AlreadyExists, DlfsError, NotFound, ResumeConflict, Unavailable
from dlfs.staging.progress import human_bytes
from dlfs.staging.resume_prefix import Prefix

# How long the note of an error waits for a daemon's answer (it is only a hint).
_HINT_TIMEOUT_S = 5.0


def held_ingest(control: DaemonControl, name: str) -> IngestState | None:
    """The unsealed ingest of `name` the daemon holds, or None when it has none."""
    try:
        return control.ingest_progress(name)
    except NotFound:
        return None


def check_resumable(state: IngestState, name: str, address: str) -> None:
    """Raise ResumeConflict while another client still sends the ingest."""
    if state.state == "receiving":
        raise ResumeConflict(
            f"the ingest of {name!r} on {address} is still receiving from another client "
            f"({state.samples:,} files durable so far); stop that client, or wait until "
            "the daemon notices it is gone (its --stream-stall-timeout-s), then resume")


def check_prefix(state: IngestState, prefix: Prefix, name: str, address: str) -> None:
    """Raise ResumeConflict when the source's first files are not those the daemon holds."""
    if state.digest != prefix.digest:
        raise ResumeConflict(
            f"cannot resume {name!r} on {address}: the daemon holds the first "
            f"{state.samples:,} files of the broken-off ingest (the last is "
            f"{state.last_path!r}), but the source's first {prefix.count:,} files differ "
            f"(the last is {prefix.last_path!r}; names, sizes or mtimes changed).  Ingest "
            f"again without --resume after `dlfs rm {name}`")


def resume_hint(error: BaseException, controls: list[DaemonControl], name: str
                ) -> BaseException:
    """`error` with a note on what a resume would continue from, when anything is parked
    (one call to each daemon, `_HINT_TIMEOUT_S` at most, made once)."""
    if isinstance(error, (AlreadyExists, ResumeConflict)):
        return error  # refused before anything was sent; the message says what to do
    notes = []
    for control in controls:
        try:
            state = control.ingest_progress(name, timeout_s=_HINT_TIMEOUT_S, retry=False)
        except Exception:  # noqa: BLE001 - only a hint
            continue
        notes.append(f"{state.samples:,} files ({human_bytes(state.bytes)}) on "
                     f"{control.address}")
    if not isinstance(error, DlfsError):
        return error
    if not notes:
        if not isinstance(error, Unavailable):
            return error
        hinted = type(error)(f"{error.message}; once the daemon is back, run the same command "
                             "with --resume to continue from its last checkpoint")
        hinted.request_id = error.request_id
        return hinted
    hinted = type(error)(f"{error.message}; the ingest is parked with {', '.join(notes)} "
                         "durable: run the same command with --resume to continue, or "
                         f"`dlfs rm {name}` to discard it")
    hinted.request_id = error.request_id
    return hinted
