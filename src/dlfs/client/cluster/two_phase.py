"""Two-phase ingest over several daemons: all members prepare, then etcd decides.

`run_two_phase` holds the change's intent in etcd (`etcd_commit.ClusterChange`),
opens one Ingest stream per member (`_MemberStream`, fed through a bounded
queue by a producer: striped ingest (`dlfs.client.cluster.striped_ingest`)
or a rebalance (`dlfs.client.cluster.rebalance`)).  Each stream ends with
the member's part durable but unpublished (prepared).  Only when every
member prepared is the change committed: one etcd transaction, which the
members watch and publish.  Any failure before that drops the intent and
every member discards its part (a resumable ingest's members park what
they hold instead).  The client dying anywhere before the commit ends the
same way once its lease expires; after the commit, the dataset is
committed whatever happens to the client or to any member.
"""

from __future__ import annotations

import logging
import queue
import secrets
import sys
import threading
import time

from dlfs import limits
from dlfs.client.cluster.etcd_commit import ClusterChange
from dlfs.client.transport.ingest_requests import IngestStart
from dlfs.coord.cluster_keys import DatasetRecord
from dlfs.errors import Cancelled, DlfsError
from dlfs.staging.source_files import source_error
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)
_END = object()
_ABORT = object()


class _Aborted(Exception):
    """Raised inside a member's request stream to cancel its Ingest call."""


class MemberFailed(Exception):
    """A member's stream failed while the producer was still reading files
    (`check_streams` raises it; `run_two_phase` reports the member's own error)."""

    def __init__(self, stream):
        super().__init__(stream.member.address)
        self.stream = stream


def new_generation() -> int:
    """A new version's number, the same on every member (above the dataset ids daemons
    hand out, so readers tell it from the one it replaces)."""
    return limits.cluster_generation_min | secrets.randbits(62)


def run_two_phase(router, name: str, members: list[str], replicas: int, *,
                  replace: bool, produce, total_bytes: int, progress: bool | None,
                  desc: str, generation: int | None = None, start_fields=None,
                  keep_on_failure: bool = False, kind: str = "ingest") -> DatasetInfo:
    """One prepared Ingest stream per member, fed by `produce(streams, bar)`, then one
    etcd transaction that commits them all.

    `produce` puts pieces on each member's stream (`stream.put`) and calls
    `check_streams(streams)` between samples; `bar` (None or a tqdm bar of
    `total_bytes`) is its to update.  If it raises, or any member fails,
    the intent is dropped and nothing is kept; OSError from the producer
    becomes `source_error`'s typed error (the source could not be read).  Returns the
    dataset's summary once the members published it (or
    `limits.cluster_publish_wait_s` passed: it is committed anyway).
    `replace`: an existing dataset of the name may be replaced
    (AlreadyExists otherwise).  `generation`: the version to name (a resume
    repeats the broken-off ingest's); default a new one.  `start_fields`:
    per member, more IngestStart fields (resuming).  `keep_on_failure`: the
    members park what they hold (resumable ingests).  `kind`: what the
    intent says ("ingest", "replace", "rebalance").
    """
    generation = generation or new_generation()
    change = ClusterChange(router.view, name, kind, generation, members, replicas)
    change.begin(replace=replace, must_exist=kind == "rebalance")
    with change:
        streams = [_MemberStream(router.member(address), name, members, replicas, index,
                                 generation, **(start_fields[index] if start_fields else {}))
                   for index, address in enumerate(members)]
        _stream_all(streams, produce, total_bytes, progress, desc)
        failures = [(s.member.address, s.error) for s in streams if s.error is not None]
        # The member that failed first, not those the client then cancelled.
        failures.sort(key=lambda failure: isinstance(failure[1], (Cancelled, _Aborted)))
        if failures:
            change.abort()  # before anything else: the members discard their parts now
            address, error = failures[0]
            if isinstance(error, DlfsError):
                kept = "" if keep_on_failure else ", nothing was kept"  # else the member says
                raise type(error)(f"ingest into {address} failed{kept}: {error.message}")
            raise error
        summary = streams[0].summary
        change.commit(DatasetRecord(generation, tuple(members), replicas, summary.samples,
                                    summary.bytes, time.time_ns()))
    return router.published(name, generation)


def _stream_all(streams, produce, total_bytes: int, progress, desc: str) -> None:
    """Run every member's stream while `produce` feeds them; raise what `produce` raised
    (OSError as `source_error`'s type), but not a member's failure (reported by the caller)."""
    bar = None
    if progress if progress is not None else sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                   file=sys.stderr)
    threads = [threading.Thread(target=s.run, name=f"dlfs-ingest-{s.index}", daemon=True)
               for s in streams]
    for thread in threads:
        thread.start()
    try:
        produce(streams, bar)
    except BaseException as exc:
        for stream in streams:
            stream.put(_ABORT)  # the member's call is cancelled
        for thread in threads:
            thread.join()
        if isinstance(exc, OSError):
            raise source_error(exc) from None
        if not isinstance(exc, MemberFailed):
            raise
    else:
        for stream in streams:
            stream.put(_END)
        for thread in threads:
            thread.join()
    finally:
        if bar is not None:
            bar.close()


def check_streams(streams) -> None:
    """Raise (ending the producer) once any member's stream has failed."""
    failed = next((s for s in streams if s.error is not None), None)
    if failed is not None:  # stop every member: a striped ingest is all or nothing
        raise MemberFailed(failed)


class _MemberStream:
    """One member's Ingest call, fed piece by piece through a bounded queue."""

    def __init__(self, member, name: str, members: list[str], replicas: int, index: int,
                 generation: int, **start_fields):
        """Every member replaces what it holds of `name`: whether the dataset may be
        replaced was decided in etcd (`ClusterChange.begin`)."""
        self.member = member
        self.name = name
        self.index = index
        self.summary: DatasetInfo | None = None  # the prepared part's, once prepared
        self.start = IngestStart(dataset=name, replace=True, members=tuple(members),
                                 replicas=replicas, member_index=index, prepare_only=True,
                                 generation=generation, **start_fields)
        self._queue: queue.Queue = queue.Queue(maxsize=limits.ingest_queue_pieces_max)
        self.error: BaseException | None = None
        self.aborted = False  # the client cancelled this member's call itself

    def put(self, piece) -> None:
        while self.error is None:
            try:
                self._queue.put(piece, timeout=0.1)
                return
            except queue.Full:
                continue

    def _pieces(self):
        while (piece := self._queue.get()) is not _END:
            if piece is _ABORT:
                self.aborted = True
                raise _Aborted("the client stopped the ingest")
            yield piece

    def run(self) -> None:
        try:
            self.summary = self.member.control.ingest(self.start, self._pieces())
        except BaseException as exc:  # noqa: BLE001 - reported by run_two_phase
            self.error = _Aborted("cancelled by the client") if self.aborted else exc
        finally:
            while True:  # unblock the producer if it is waiting on this queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
