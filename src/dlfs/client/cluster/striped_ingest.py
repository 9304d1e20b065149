"""Striped ingest: one dataset over several daemons, all of them or none.

`ingest_striped` reads every file once (staging's reader pool,
`dlfs.staging.ordered_files`: many files in flight, bounded memory),
streams it to its holders (rendezvous placement,
`dlfs.client.cluster.placement`) and its metadata to every other member,
with two-phase commit (`dlfs.client.cluster.two_phase`): all members
prepare (durable, unpublished), then one etcd transaction decides and the
members publish what it says.  `router` is the cluster's `ClusterRouter`;
the members are the live ones (leases in etcd), in address order.

Resumable striped ingests: each member parks its part when its stream
breaks off; a resume asks every member what it holds (each may hold a
different number of files) and sends each member the files after its own.
"""

from __future__ import annotations

import logging

from dlfs.client.cluster.placement import member_hashes, place, place_one
from dlfs.client.cluster.silent_members import members_for_change, silent
from dlfs.client.cluster.two_phase import check_streams, run_two_phase
from dlfs.client.ingest_resume import check_prefix, check_resumable, held_ingest, resume_hint
from dlfs.client.transport.ingest_requests import IngestPiece, dir_pieces
from dlfs.errors import DlfsError, ResumeConflict, Unavailable
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.ordered_files import ordered_files, pool_for
from dlfs.staging.pace import pace_for
from dlfs.staging.progress import IngestProgress, IngestStats, progress_mode
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.staging.resume_prefix import resume_prefix
from dlfs.staging.source_set import as_source_set
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)


def ingest_striped(router, source, name: str, *, replace: bool, replicas: int,
                   progress: bool | str | None, readers: int = READERS_DEFAULT,
                   resumable: bool = False, resume: bool = False, via: str = "auto",
                   stats: IngestStats | None = None, max_rate: int | None = None
                   ) -> DatasetInfo:
    """Stripe `source` (see `dlfs.client.ingest_upload.upload`) over the live members
    with `replicas` copies each.

    Every member gets the whole directory (metadata of every sample) and the
    bytes of the samples it holds.  Two-phase: each member's stream ends with
    its data durable but unpublished; only when all succeeded does one etcd
    transaction commit it.  On any failure every member discards its part
    and nothing is kept, unless `resumable`: then each member that was
    receiving parks what it holds durably, and `resume=True` continues them
    (with the same members and replicas).  Members are fed over gRPC
    whatever `via` says.  A member that does not answer (killed; the cluster
    drops it once its lease expires) is left out, or waited for, before the
    streams open (not when resuming: the parked parts name their members), and
    a non-resumable ingest that a member's death broke off starts once more
    without it (`silent_members`: a warning says which).
    Raises Unavailable when the cluster has no live member, AlreadyExists
    (the name exists and not `replace`, or another change of it is in
    flight).
    """
    if not router.addresses:
        raise Unavailable(f"no live member in {router.address}: start the daemons with --etcd")
    what = f"{'replace' if replace else 'ingest'} of {name!r}"
    options = dict(replace=replace, replicas=replicas, progress=progress, readers=readers,
                   resumable=resumable, resume=resume, stats=stats, max_rate=max_rate)
    if resume:  # parked parts belong to the members that hold them
        return _stripe(router, source, name, list(router.addresses), **options)
    members = members_for_change(router, replicas, what)
    try:
        return _stripe(router, source, name, members, **options)
    except Unavailable:
        if resumable:
            raise  # the members park their parts: the error says how to resume
        gone = silent(router, members)
        if not gone:
            raise
        # A member died during it: the cluster is about to drop it; once more without.
        log.warning("the %s broke off: %s stopped answering; starting it again", what,
                    ", ".join(gone))
        return _stripe(router, source, name, members_for_change(router, replicas, what),
                       **options)


def _stripe(router, source, name: str, members: list[str], *, replace: bool, replicas: int,
            progress, readers: int, resumable: bool, resume: bool,
            stats: IngestStats | None, max_rate: int | None) -> DatasetInfo:
    """`ingest_striped` over `members`, once."""
    pace = pace_for(max_rate)  # the whole stream's bytes, all members together
    sources = as_source_set(source)
    duplicates = Duplicates() if sources.needs_duplicate_check else None
    resumable = resumable or resume
    skips = [0] * len(members)
    fields = [{"resumable": resumable} for _ in members]
    generation = None
    if resume:
        generation = _resume_points(router, members, replicas, replace, name, sources,
                                    duplicates, skips, fields)
    skip = min(skips)
    if sources.known_files is not None:
        paths = [f.path for f in sources.entries()]
        table = place(name, paths, members, replicas).tolist()
        del paths

        def holders_of(index, _file):
            return table[index]
    else:
        hashes = member_hashes(members)

        def holders_of(_index, file):
            return place_one(name, file.path, hashes, replicas)

    meter = IngestProgress(f"ingest {name} ({len(members)} daemons, {replicas}x)",
                           sources.total_bytes, mode=progress_mode(progress),
                           known_files=None if sources.known_files is None
                           else sources.known_files - skip)
    with pool_for(sources, skip, readers) as pool:
        def produce(streams, _bar) -> None:
            _produce(ordered_files(pool, meter, duplicates, pace), skip, skips, holders_of, streams,
                     sources.dirs)

        try:
            info = run_two_phase(router, name, members, replicas, replace=replace,
                                 produce=produce, total_bytes=0, progress=False, desc="",
                                 generation=generation, start_fields=fields,
                                 keep_on_failure=resumable,
                                 kind="replace" if replace else "ingest")
        except DlfsError as exc:
            if resumable:
                raise resume_hint(exc, [router.member(a).control for a in members],
                                  name) from None
            raise
        finally:
            elapsed = meter.close()
    if stats is not None:
        stats.files, stats.data_bytes = meter.files, meter.data_bytes
        stats.source_bytes, stats.elapsed_s, stats.readers = meter.source_bytes, elapsed, readers
        stats.resumed_files = skip
    return info


def _resume_points(router, members, replicas, replace, name, sources, duplicates, skips,
                   fields) -> int | None:
    """Ask every member what it holds; fill `skips` and `fields`; return the generation
    to reuse (None when nothing is parked anywhere)."""
    results = router.each(lambda member: held_ingest(member.control, name))
    states = []
    for index, address in enumerate(members):
        state = results.get(address)
        if isinstance(state, Exception):
            raise state
        if state is None:
            continue
        check_resumable(state, name, address)
        if (list(state.members) != members or state.replicas != replicas
                or state.member_index != index):
            raise ResumeConflict(
                f"the broken-off ingest of {name!r} on {address} was started over "
                f"{', '.join(state.members) or 'that daemon alone'} with {state.replicas} "
                "replicas; resume it while the same members are live, with the same "
                "--replicas")
        states.append((index, state))
    if not states:
        return None
    generations = {state.generation for _, state in states}
    if len(generations) != 1:
        raise ResumeConflict(f"the members hold different versions of the broken-off ingest of "
                             f"{name!r}; end it (`dlfs discard {name}`) and ingest again")
    prefixes = resume_prefix(sources, [state.samples for _, state in states], duplicates)
    for index, state in states:
        skips[index] = state.samples
        if state.state == "prepared":  # voted yes for a change whose intent is gone
            raise ResumeConflict(
                f"{members[index]} holds the ingest of {name!r} prepared; it discards it as "
                "soon as it reads etcd (the intent is gone); resume again in a moment")
        check_prefix(state, prefixes[state.samples], name, members[index])
        fields[index].update(resume_from=state.samples)
    return generations.pop()  # members that hold nothing start from the beginning


def _produce(chunks, skip: int, skips: list[int], holders_of, streams, dirs=()) -> None:
    """Each file's pieces to its holders, its metadata to the other members; a member
    gets only the files after those it already holds (`skips`, resuming).  Every
    member's stream starts with the empty directories `dirs` (a resumed one too)."""
    for piece in dir_pieces(dirs):
        for stream in streams:
            stream.put(piece)
    index = skip - 1
    holders: list[int] = []
    holding: list = []
    current = None
    for file, data, last, crc in chunks:
        if file is not None:
            check_streams(streams)
            index += 1
            current = file
            holders = holders_of(index, file)
            holding = [streams[h] for h in holders if index >= skips[h]]
            piece = IngestPiece(file.path, file.size, file.mode, file.mtime_ns, data,
                                crc if last else None, holders)
        else:
            piece = IngestPiece(data=data, crc32c=crc if last else None)
        for stream in holding:
            stream.put(piece)
        if last:
            remote = IngestPiece(current.path, current.size, current.mode, current.mtime_ns,
                                 crc32c=crc, holders=holders, remote=True)
            for member, stream in enumerate(streams):
                if member not in holders and index >= skips[member]:
                    stream.put(remote)
