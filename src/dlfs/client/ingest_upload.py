"""Upload a dataset to one daemon: sources read in parallel, one ordered stream.

Which files become samples, from directory trees and tar archives, is
decided in staging (`dlfs.staging.source_set`).  The files are read by a
pool of reader threads (`dlfs.staging.read_pool`: many opens in flight,
bounded memory) and sent in the sources' order (sorted paths of a tree,
archive order of an archive) over one ingest stream: the daemon's data path
when it has one (`dlfs.client.transport.datapath_upload`), else its gRPC
Ingest call (`DaemonControl.ingest`).  Each file's mode and mtime travel
with it, and its CRC32C is computed here while it is sent, so the daemon
verifies what it stored against what was read.

Resumable ingests (`resumable=True`, the CLI's default): when the stream
breaks off, the daemon keeps the files it holds durably and parks the
ingest, still invisible.  `resume=True` asks the daemon how many files it
holds, checks that the source starts with the same files
(`dlfs.client.ingest_resume`), and sends the rest.  With nothing to resume,
`resume=True` starts a new resumable ingest.
"""

from __future__ import annotations

import logging

from dlfs.client.ingest_resume import check_prefix, check_resumable, held_ingest, resume_hint
from dlfs.client.transport import datapath_upload
from dlfs.client.transport.contract import DaemonTransport
from dlfs.client.transport.ingest_requests import IngestStart, dir_pieces, file_pieces
from dlfs.errors import (
    AlreadyExists,
    DlfsError,
    FailedPrecondition,
    InvalidArgument,
    ResumeConflict,
)
from dlfs.paths import check_dataset_name
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.ordered_files import ordered_files, pool_for
from dlfs.staging.pace import pace_for
from dlfs.staging.progress import IngestProgress, IngestStats, progress_mode
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.staging.resume_prefix import EMPTY_PREFIX, resume_prefix
from dlfs.staging.source_files import source_error
from dlfs.staging.source_set import SourceSet, as_source_set
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)

VIA_CHOICES = ("auto", "datapath", "grpc")


def upload(transport: DaemonTransport, name: str, source, *, replace: bool = False,
           progress: bool | str | None = None, readers: int = READERS_DEFAULT,
           resumable: bool = False, resume: bool = False, via: str = "auto",
           stats: IngestStats | None = None, max_rate: int | None = None) -> DatasetInfo:
    """Stream `source` (a SourceSet, a source, or a `walk_tree` report) to one daemon as
    dataset `name`; one ingest stream.

    `progress`: None shows a bar when stderr is a terminal; "log" prints a
    line every few seconds.  `readers`: files read at once.  `via`: "auto"
    sends over the daemon's data path when it has one (its Unix socket on
    the same host, else TCP), else over gRPC; "datapath" or "grpc" insist
    on one.  `resumable`: if the stream breaks off, the daemon keeps what it
    holds durably for a later `resume=True`.  `stats` (an IngestStats) is
    filled in.  `max_rate`: at most so many bytes a second (`dlfs.staging.pace`).  Raises AlreadyExists (name taken, no `replace`; or a parked
    ingest of that name), InvalidArgument (bad or changing source files),
    ResumeConflict (see `dlfs.errors`), and the daemon's errors; a failed
    non-resumable ingest leaves nothing on the daemon.
    """
    check_dataset_name(name)
    pace = pace_for(max_rate)
    if via not in VIA_CHOICES:
        raise InvalidArgument(f"via must be one of {', '.join(VIA_CHOICES)}, not {via!r}")
    data_path = None
    if via != "grpc":
        data_path = transport.data_path()
        if data_path is None and via == "datapath":
            raise FailedPrecondition(f"the daemon at {transport.address} has no data path "
                                     "to ingest over (TLS, or --data-port -1)")
    sources = as_source_set(source)
    duplicates = Duplicates() if sources.needs_duplicate_check else None
    resumable = resumable or resume
    resume_from, skipped = None, EMPTY_PREFIX
    if resume:
        resume_from, skipped = _resume_point(transport, name, sources, duplicates, replace)
    skip = resume_from or 0
    start = IngestStart(name, replace=replace, resumable=resumable, resume_from=resume_from)
    meter = IngestProgress(f"ingest {name}", sources.total_bytes, mode=progress_mode(progress),
                           known_files=_remaining(sources, skip))
    meter.skip(skipped.bytes if sources.known_files is not None else 0)
    with pool_for(sources, skip, readers) as pool:
        try:
            info = _stream(transport, data_path, start, ordered_files(pool, meter, duplicates, pace),
                           sources.dirs)
        finally:
            elapsed = meter.close()
    if stats is not None:
        stats.files, stats.data_bytes = meter.files, meter.data_bytes
        stats.source_bytes, stats.elapsed_s, stats.readers = meter.source_bytes, elapsed, readers
        stats.resumed_files, stats.resumed_bytes = skip, skipped.bytes
        stats.via = "grpc" if data_path is None else "datapath"
    return info


def _stream(transport: DaemonTransport, data_path, start: IngestStart, chunks, dirs) -> DatasetInfo:
    """Send the staged `chunks` after the empty directories `dirs`: over `data_path`
    when there is one, else over gRPC."""
    if data_path is not None:
        return _guarded(lambda: datapath_upload.send(
            data_path, start.dataset, chunks, replace=start.replace, resumable=start.resumable,
            resume_from=start.resume_from, dirs=dirs), transport, start)
    pieces = _chained(dir_pieces(dirs), file_pieces(chunks))  # directories first, resumed too
    return _guarded(lambda: transport.control.ingest(start, pieces), transport, start)


def _guarded(send, transport: DaemonTransport, start: IngestStart):
    """`send()`; a source that cannot be read raises `source_error`'s type
    (PermissionDenied for its permissions), and a failure of a resumable ingest says
    what a resume would continue from."""
    try:
        return send()
    except OSError as exc:  # the source: socket errors arrive as Unavailable
        error: DlfsError = source_error(exc)
    except DlfsError as exc:
        error = exc
    if start.resumable:
        raise resume_hint(error, [transport.control], start.dataset) from None
    raise error from None


def _resume_point(transport: DaemonTransport, name: str, sources: SourceSet,
                  duplicates: Duplicates | None, replace: bool):
    """(files the daemon holds of the parked ingest of `name`, their `Prefix`); (None,
    EMPTY_PREFIX) when it holds none.  Raises AlreadyExists (sealed, nothing to resume,
    no `replace`), ResumeConflict (it cannot be resumed from this source)."""
    control = transport.control
    state = held_ingest(control, name)
    if state is None:
        if not replace and name in [info.name for info in control.list_datasets()]:
            raise AlreadyExists(f"dataset {name!r} is already ingested (sealed): nothing to "
                                "resume; pass --replace to ingest it again")
        log.info("nothing to resume for %r on %s: starting a new ingest", name,
                 transport.address)
        return None, EMPTY_PREFIX
    check_resumable(state, name, transport.address)
    if state.members:
        raise ResumeConflict(
            f"the broken-off ingest of {name!r} is striped over {', '.join(state.members)}"
            "; resume it with all of them in --server")
    if state.replace != replace:
        raise ResumeConflict(
            f"the broken-off ingest of {name!r} was started "
            f"{'with' if state.replace else 'without'} --replace; resume it the same way")
    skipped = resume_prefix(sources, [state.samples], duplicates)[state.samples]
    check_prefix(state, skipped, name, transport.address)
    return state.samples, skipped


def _chained(first, rest):
    yield from first
    yield from rest


def _remaining(sources: SourceSet, skip: int) -> int | None:
    known = sources.known_files
    return None if known is None else known - skip
