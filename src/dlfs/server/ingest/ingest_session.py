"""Ingest session: receive the files of one dataset into its extents and catalog.

Durability order (see catalog.py): sample bytes are appended to the
dataset's own extents; entries go to the catalog in SAMPLES records as they
accumulate (unsynced: an unsealed dataset is discarded at restart anyway);
`finish` fsyncs the extents, writes the remaining entries, then builds and
checks the directory tree; `discard` writes DELETE and removes the extents.
A resumable session also checkpoints (checkpoints.py): every so many bytes
or seconds, when `park`ed (its stream broke off) and when it is resumed.
The `IngestMachine` (ingest_machine.py) owns the ingest's state, writes
BEGIN and SEAL, and decides when to finish or discard: a session holds no
reference to it; it gets the catalog and the ExtentWriter it writes to and
returns what it built.  A prepared ingest found at restart is a
`RecoveredIngest` (recovered_ingest.py).
"""

from __future__ import annotations

import dataclasses
import logging
import stat as stat_module
import threading
import time

import numpy as np

from dlfs import limits
from dlfs.formats import ingest_digest
from dlfs.formats.block_crcs import BLOCK_BYTES, BlockHasher
from dlfs.crc import crc32c
from dlfs.errors import DataCorruption, DlfsError, InvalidArgument, Unavailable
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.paths import check_sample_path
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core.directory import Cluster, DatasetIndex
from dlfs.server.core.extents import DISK_ERRORS, ExtentStore, ExtentWriter
from dlfs.server.core.checkpoints import Checkpoint, encode_checkpoint, truncate_blocks
from dlfs.server.ingest.recovered_ingest import discard_dataset
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _OpenFile:
    """The sample being received."""

    path: str
    size: int
    mode: int
    mtime_ns: int
    extent_no: int
    offset: int
    received: int = 0
    crc: int = 0
    # Block CRCs (dlfs.formats.block_crcs) of a sample longer than one block, else None.
    blocks: BlockHasher | None = None


class IngestSession:
    """Receives one dataset's files; create with `IngestMachine.begin`.

    Call `start_file`, then `write` until the announced size is reached
    (the file ends itself then; `check_last_crc` compares the client's
    CRC), repeat, then hand the session to `IngestMachine.commit` (or
    `prepare`, or `abort`).  One stream drives one session;
    the one call from another thread is the stopping daemon's `close_writer`
    (or `discard`), which waits for the write or checkpoint under way and
    makes every later one raise Unavailable.

    `catalog` receives the SAMPLES (and HOLDERS) records, `writer` the
    sample bytes; `name`, `dataset_id`, `created_ns`, `replace` and
    `cluster` describe the ingest and never change.
    """

    def __init__(self, name: str, dataset_id: int, created_ns: int, catalog: cat.Catalog,
                 writer: ExtentWriter | None, replace: bool = False,
                 cluster: Cluster | None = None, resumable: bool = False,
                 checkpoint_bytes: int = limits.ingest_checkpoint_bytes,
                 checkpoint_interval_s: float = limits.ingest_checkpoint_interval_s):
        self.name = name
        self.dataset_id = dataset_id
        self.created_ns = created_ns
        self.replace = replace
        self.cluster = cluster
        self.resumable = resumable
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_interval_s = checkpoint_interval_s
        self._catalog = catalog
        self._writer = writer
        # Where the dataset's extents are (a parked session has no writer).
        self._extents = writer.store if writer is not None else None
        self._blocks: list[records.SampleBlock] = []
        # (path, extent, offset, length, crc, mode, mtime, holders)
        self._pending: list[tuple] = []
        self._pending_block_crcs: list[int] = []  # of the pending samples, in order
        self._dirs: list[str] = []  # empty directories (add_directory)
        self._holders: tuple = ()  # holders of the file being received
        self._file: _OpenFile | None = None
        self._last: tuple[str, int] | None = None  # (path, crc) of the last finished file
        self.samples = 0
        self.bytes = 0
        # Resumable sessions: the digest of the files so far (dlfs.formats.ingest_digest), the
        # last checkpoint, and what arrived since it.
        self.digest = ingest_digest.EMPTY
        self.checkpoint: Checkpoint | None = None
        self._since_checkpoint = 0
        self._checkpoint_due = 0.0
        # Held while the writer is used or a checkpoint recorded.  A stopping daemon
        # closes the writer from its own thread, dropping unsynced bytes: a checkpoint
        # the stream's thread took after that would claim them (the next start parked
        # files the extent no longer held).  Reentrant: a write ends a file, which may
        # checkpoint.
        self._writing = threading.RLock()
        self._stopped = False
        # The error of a catalog append of samples that failed (see `_flush_entries`).
        self._records_failed: DlfsError | None = None

    @classmethod
    def restored(cls, name: str, dataset_id: int, created_ns: int, catalog: cat.Catalog,
                 blocks: list, checkpoint: Checkpoint, cluster: Cluster | None,
                 extents: ExtentStore) -> "IngestSession":
        """A parked session rebuilt from the catalog at start (no writer until resumed;
        `extents` removes its extents if it is discarded before)."""
        session = cls(name, dataset_id, created_ns, catalog, None, checkpoint.replace, cluster,
                      resumable=True)
        session._extents = extents
        session._blocks = list(blocks)
        session.samples, session.bytes = checkpoint.samples, checkpoint.bytes
        session.digest, session.checkpoint = checkpoint.digest, checkpoint
        if blocks and len(blocks[-1]):
            session._last = (blocks[-1].paths[-1], int(blocks[-1].crc[-1]))
        return session

    @property
    def last_path(self) -> str:
        return self._last[0] if self._last is not None else ""

    def summary(self) -> DatasetInfo:
        """What has arrived so far, as an unsealed dataset's summary."""
        return DatasetInfo(self.name, self.samples, self.bytes, False, self.created_ns, 0)

    @property
    def file_open(self) -> bool:
        return self._file is not None

    def start_file(self, path: str, size: int, mode: int, mtime_ns: int,
                   holders: tuple = ()) -> None:
        """Begin a sample stored here.  `holders`: the member indices storing it
        (striped datasets only; must include this daemon).  Raises InvalidArgument."""
        self._check_holders(path, holders, remote=False)
        self._holders = tuple(holders)
        self._start(path, size, mode, mtime_ns)

    def add_remote(self, path: str, size: int, mode: int, mtime_ns: int, crc: int,
                   holders: tuple) -> None:
        """Record a sample of a striped dataset that other members store (metadata only)."""
        if self._file is not None:
            raise InvalidArgument(
                f"file {self._file.path!r} got {self._file.received} of {self._file.size} bytes "
                f"before {path!r} started")
        self._check_holders(path, holders, remote=True)
        check_sample_path(path)
        self._pending.append((path, NO_EXTENT, 0, size, crc, _regular_mode(path, mode), mtime_ns,
                              tuple(holders)))
        self._last = (path, crc)
        self._count(path, size, mtime_ns)

    def add_directory(self, path: str) -> None:
        """Record a directory that holds no sample (an empty one of the source), so the
        dataset's tree is the one ingested.  Raises InvalidArgument (bad path; a
        file of the same path fails at `finish`)."""
        if self._file is not None:
            raise InvalidArgument(
                f"file {self._file.path!r} got {self._file.received} of {self._file.size} bytes "
                f"before directory {path!r}")
        check_sample_path(path)
        if len(self._dirs) >= limits.dataset_samples_max:
            raise InvalidArgument(f"dataset {self.name!r} would hold more than "
                                  f"{limits.dataset_samples_max} empty directories")
        self._dirs.append(path)

    def _check_holders(self, path: str, holders, remote: bool) -> None:
        cluster = self.cluster
        if cluster is None:
            if holders or remote:
                raise InvalidArgument(f"file {path!r} names holders, but the ingest did not "
                                      "name cluster members")
            return
        members = len(cluster.members)
        if (len(holders) != cluster.replicas or len(set(holders)) != len(holders)
                or any(h >= members for h in holders)):
            raise InvalidArgument(f"file {path!r}: holders {list(holders)} must be "
                                  f"{cluster.replicas} distinct member indices below {members}")
        if (cluster.member_index in holders) == remote:
            raise InvalidArgument(
                f"file {path!r}: holders {list(holders)} and remote={remote} disagree about "
                f"member {cluster.member_index} (this daemon)")

    def _start(self, path: str, size: int, mode: int, mtime_ns: int) -> None:
        if self._file is not None:
            raise InvalidArgument(
                f"file {self._file.path!r} got {self._file.received} of {self._file.size} bytes "
                f"before {path!r} started"
            )
        check_sample_path(path)
        if size > limits.sample_bytes_max:
            raise InvalidArgument(
                f"file {path!r} is {size} bytes, over the limit of {limits.sample_bytes_max}"
            )
        mode = _regular_mode(path, mode)
        with self._writing:
            self._check_running()
            extent_no, offset = self._writer.begin_sample(size)
        self._file = _OpenFile(path, size, mode, mtime_ns, extent_no, offset,
                               blocks=BlockHasher() if size > BLOCK_BYTES else None)
        if size == 0:
            self._end_file()

    def write(self, data) -> None:
        """Append bytes to the current sample; ends it when its size is reached."""
        file = self._file
        if file is None:
            if len(data):
                raise InvalidArgument("file data arrived before any file was started")
            return
        if file.received + len(data) > file.size:
            raise InvalidArgument(
                f"file {file.path!r} was announced as {file.size} bytes but more arrived"
            )
        with self._writing:
            self._check_running()
            self._writer.write(data)
            file.received += len(data)
            file.crc = crc32c(data, file.crc)
            if file.blocks is not None:
                file.blocks.update(data)
            if file.received == file.size:
                self._end_file()

    def check_last_crc(self, expected: int) -> None:
        """Compare the client's CRC32C with what was stored for the last file."""
        if self._last is None:
            raise InvalidArgument("a checksum arrived before any file was complete")
        path, crc = self._last
        if crc != expected:
            raise DataCorruption(
                f"file {path!r} changed in transit: the client read CRC32C {expected:08x}, "
                f"the daemon received {crc:08x}; ingest again"
            )

    def _end_file(self) -> None:
        file, self._file = self._file, None
        self._writer.end_sample()
        self._pending.append((file.path, file.extent_no, file.offset, file.size, file.crc,
                              file.mode, file.mtime_ns, self._holders))
        if file.blocks is not None:
            self._pending_block_crcs.extend(file.blocks.finish(file.size))
        self._last = (file.path, file.crc)
        self._count(file.path, file.size, file.mtime_ns)

    def _count(self, path: str, size: int, mtime_ns: int) -> None:
        if self.samples >= limits.dataset_samples_max:
            raise InvalidArgument(
                f"dataset {self.name!r} would hold more than {limits.dataset_samples_max} samples "
                "(limits.dataset_samples_max: each costs daemon memory); split it into several "
                "datasets")
        self.samples += 1
        self.bytes += size
        if self.resumable:
            self.digest = ingest_digest.chain(self.digest, path, size, mtime_ns)
            self._since_checkpoint += size
            if (self._since_checkpoint >= self.checkpoint_bytes
                    or time.monotonic() >= self._checkpoint_due):
                self.take_checkpoint()
                return
        if len(self._pending) >= limits.catalog_samples_per_record or \
                len(self._pending_block_crcs) >= limits.catalog_block_crcs_per_record:
            self._flush_entries()

    def _flush_entries(self) -> None:
        """Append the pending samples' records (SAMPLES, HOLDERS, BLOCKS).  A failure
        may leave some of one block's records in the catalog: the session then
        appends no more entries (`_records_failed`), so no checkpoint or seal can
        follow them; a resumable one goes back to its last checkpoint instead
        (`park`), after which such records are void (checkpoints.py)."""
        if self._records_failed is not None:
            raise type(self._records_failed)(
                f"{self._records_failed.message} (an earlier catalog write of this ingest "
                "failed; it records nothing more)")
        if not self._pending:
            return
        columns = list(zip(*self._pending))
        block = records.SampleBlock(
            list(columns[0]),
            np.array(columns[1], dtype=np.uint32),
            np.array(columns[2], dtype=np.uint64),
            np.array(columns[3], dtype=np.uint64),
            np.array(columns[4], dtype=np.uint32),
            np.array(columns[5], dtype=np.uint32),
            np.array(columns[6], dtype=np.int64),
            holders=np.array(columns[7], dtype=np.uint16) if self.cluster else None,
            block_crc=np.array(self._pending_block_crcs, dtype=np.uint32),
            block_bytes=BLOCK_BYTES,
        )
        try:
            for record_type, payload in records.block_records(self.dataset_id, block):
                self._catalog.append(record_type, payload)
        except DlfsError as exc:
            self._records_failed = exc
            raise
        self._pending_block_crcs = []
        self._blocks.append(block)
        self._pending = []

    def finish(self) -> DatasetIndex:
        """Make everything received durable and build the dataset, without publishing it.

        Cost: an fsync of the open extent and its directory, one catalog
        append, and the index build (O(n log n) for n samples).  Call it
        once.  Raises InvalidArgument on an unfinished file, a duplicate
        path or a file/directory conflict, StorageFull (the IngestMachine
        aborts the ingest then).
        """
        if self._file is not None:
            raise InvalidArgument(
                f"the stream ended inside file {self._file.path!r} ({self._file.received} of "
                f"{self._file.size} bytes received)"
            )
        with self._writing:
            self._check_running()
            if self._writer is not None:
                self._writer.sync()
                self._writer.close()
        self._flush_entries()
        for record_type, payload in records.dirs_records(self.dataset_id, self._dirs):
            self._catalog.append(record_type, payload)
        blocks, self._blocks = self._blocks, []
        return DatasetIndex(self.name, self.dataset_id, self.created_ns,
                            records.SampleBlock.concat(blocks), self.cluster, dirs=self._dirs)

    # --- resumable sessions (checkpoints.py) ------------------------------------------------

    def take_checkpoint(self) -> Checkpoint:
        """Make every finished file durable and record it (CHECKPOINT, catalog fsync'ed).

        The file being received, if any, is not part of it (its bytes stay
        behind the recorded extent end, and are cut off when resumed).
        Raises StorageFull and OSError from the fsyncs and appends, Unavailable
        once the daemon stopped the session (`close_writer`).
        """
        with self._writing:
            self._check_running()
            return self._take_checkpoint()

    def _take_checkpoint(self) -> Checkpoint:
        if self._file is not None:
            position = (self._file.extent_no, self._file.offset)
        elif self._writer is not None:
            position = self._writer.position()
        else:  # restored at start, not resumed yet
            position = (self.checkpoint.extent_no, self.checkpoint.extent_end)
        if self._writer is not None:
            self._writer.sync()  # a closed writer syncs only its directory
        self._flush_entries()
        checkpoint = Checkpoint(self.samples, self.bytes, position[0], position[1],
                                time.time_ns(), self.replace, self.digest)
        self._catalog.append(records.RecordType.CHECKPOINT,
                             encode_checkpoint(self.dataset_id, checkpoint), sync=True)
        self.checkpoint = checkpoint
        self._since_checkpoint = 0
        self._checkpoint_due = time.monotonic() + self.checkpoint_interval_s
        return checkpoint

    def park(self) -> Checkpoint:
        """The stream broke off: drop the file being received, checkpoint, close the
        extent.  The session keeps its samples and waits for `resume`.

        When that checkpoint cannot be taken because the disk failed (full, or
        EIO), the session goes back to its last checkpoint instead, which is
        durable: what arrived after it is forgotten and cut off the extents
        (`back_to_checkpoint`).  Raises what the checkpoint raised otherwise
        (Unavailable once the daemon stopped the session, CatalogFailed).
        """
        with self._writing:
            try:
                checkpoint = self.take_checkpoint()
            except DISK_ERRORS as exc:
                log.warning("ingest of dataset %r: a checkpoint at the break failed (%s); "
                            "going back to the last one", self.name, exc.message)
                return self.back_to_checkpoint()
            self._file = None
            if self._writer is not None:
                self._writer.close()
        return checkpoint

    def back_to_checkpoint(self) -> Checkpoint:
        """Forget what arrived after the last checkpoint: close the writer unsynced,
        keep the first `checkpoint.samples` files, and cut the extents where the
        checkpoint ends (so the space the session holds is what it says), as a
        restart would find it.  Returns that checkpoint.  Raises StorageFailed
        when the extents cannot be cut (the session is unchanged in memory then
        but for the closed writer; a resume cuts them).
        """
        with self._writing:
            checkpoint = self.checkpoint
            assert checkpoint is not None, "only resumable sessions go back"
            self._file = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._pending, self._pending_block_crcs, self._holders = [], [], ()
            self._records_failed = None  # what it appended past the checkpoint is void
            self._blocks = truncate_blocks(self._blocks, checkpoint.samples)
            self.samples, self.bytes = checkpoint.samples, checkpoint.bytes
            self.digest = checkpoint.digest
            self._since_checkpoint = 0
            last = self._blocks[-1] if self._blocks else None
            self._last = (last.paths[-1], int(last.crc[-1])) if last is not None else None
            self._extents.cut_dataset(self.dataset_id, checkpoint.extent_no,
                                      checkpoint.extent_end, f"dataset {self.name!r}")
        return checkpoint

    def disk_bytes(self) -> int:
        """Bytes the session's extents take on the data dir now (see
        ExtentStore.dataset_disk_bytes).  Never raises."""
        return self._extents.dataset_disk_bytes(self.dataset_id)

    def resume(self, writer: ExtentWriter) -> Checkpoint:
        """Continue after `park` (or a prepare, or a restart) with a fresh `writer`
        (opened after the checkpoint's extent); records a CHECKPOINT first, which
        voids any record a crashed daemon left after the last one."""
        assert self._file is None
        self._writer = writer
        self._dirs = []  # every stream, a resumed one too, sends all empty directories first
        return self.take_checkpoint()

    def discard(self) -> None:
        """Remove what the session wrote: a DELETE record, then its extents.  Never
        raises (see `discard_dataset`).  A resumable session's DELETE is synced: a
        CHECKPOINT without it would bring back a parked ingest whose extents are gone."""
        with self._writing:
            self._stopped = True
            if self._writer is not None:
                self._writer.close()
                remove = self._writer.discard
            else:  # parked (after a restart, or gone back to its checkpoint): no writer
                def remove():
                    self._extents.remove_dataset(self.dataset_id)
        discard_dataset(self._catalog, remove, self.name, self.dataset_id, sync=self.resumable)

    def close_writer(self) -> None:
        """Close the extent being written without syncing (the daemon is stopping: a
        resumable session's last checkpoint is what the next start parks).  Waits
        for the write or checkpoint under way; any later one raises Unavailable."""
        with self._writing:
            self._stopped = True
            if self._writer is not None:
                self._writer.close()

    def _check_running(self) -> None:
        """Raise Unavailable once the daemon stopped this session (caller holds
        `_writing`)."""
        if self._stopped:
            raise Unavailable(
                f"the daemon is stopping: the ingest of dataset {self.name!r} ends here (a "
                "resumable ingest keeps its last checkpoint: `dlfs ingest --resume` once the "
                "daemon is back; any other ingest again)")


def _regular_mode(path: str, mode: int) -> int:
    """`mode` of a regular file (0 means read-only for everyone); raises otherwise."""
    if mode and not stat_module.S_ISREG(mode):
        raise InvalidArgument(f"file {path!r} has mode {mode:o}, which is not a regular file")
    return mode or (stat_module.S_IFREG | 0o444)
