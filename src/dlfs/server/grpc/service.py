"""gRPC servicer: translates messages to store calls and back.

Handlers raise typed `DlfsError`s; `interceptor.ErrorInterceptor` turns
them into status codes.  Every handler honours the call's deadline.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import grpc
import numpy as np

from dlfs import limits
from dlfs.formats import grpc_chunks
from dlfs.errors import Cancelled, InvalidArgument, Overloaded, ReplyTooLarge
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from dlfs.server.core.extents import disk_error
from dlfs.server.grpc import messages
from dlfs.server.ingest.ingest_machine import with_outcome
from dlfs.server.store import Store
from dlfs.version import __version__

log = logging.getLogger(__name__)


def _deadline(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class DlfsServicer(dlfs_pb2_grpc.DlfsServicer):
    """`data_path_info()` returns the daemon's `datapath.DataPathInfo` (GetDataPath).
    `cluster_member` (the daemon's `ClusterMember` with --etcd, else None) applies
    etcd's state before a striped ingest that finds an older one prepared."""

    def __init__(self, store: Store, data_path_info, authorizer=None):
        self.store = store
        self.cluster_member = None
        self.data_path_info = data_path_info
        self.authorizer = authorizer  # dlfs.server.auth.Authorizer, or None: no tokens
        self.metrics_address = ""  # set by the daemon when it serves /metrics

    # --- metadata ----------------------------------------------------------------

    def ListDatasets(self, request, context):
        return pb.ListDatasetsReply(
            datasets=[messages.dataset_info(s) for s in self.store.summaries()])

    def GetDataset(self, request, context):
        spaces = self.store.spaces
        if spaces.has(request.dataset):
            return messages.dataset_info(spaces.summary(request.dataset))
        return messages.dataset_info(self.store.dataset(request.dataset).summary())

    def Stat(self, request, context):
        # A space's entries name their files' versions (no sample ids): its listings
        # need no version of their own.
        if self.store.spaces.has(request.dataset):
            return messages.entry(self.store.spaces.stat(request.dataset, request.path))
        dataset = self.store.dataset(request.dataset)
        dataset.check_generation(request.generation)  # its sample ids are this version's
        return messages.entry(dataset.stat(request.path))

    def ListDir(self, request, context):
        page_size = request.page_size or limits.list_page_entries_default
        if self.store.spaces.has(request.dataset):
            entries, more = self.store.spaces.listdir(request.dataset, request.path,
                                                      request.start_after, page_size)
        else:
            dataset = self.store.dataset(request.dataset)
            dataset.check_generation(request.generation)
            entries, more = dataset.listdir(request.path, request.start_after, page_size)
        return pb.ListDirReply(entries=[messages.entry(e) for e in entries], more=more)

    # --- checkpoint spaces ------------------------------------------------------------

    def CreateSpace(self, request, context):
        return messages.dataset_info(self.store.spaces.create(request.name))

    def MakeDir(self, request, context):
        return messages.entry(self.store.spaces.mkdir(request.space, request.path,
                                                      request.mode or 0o755))

    def Remove(self, request, context):
        self.store.spaces.remove(request.space, request.path, request.directory)
        return pb.RemoveReply()

    def Rename(self, request, context):
        self.store.spaces.rename(request.space, request.path, request.target)
        return pb.RemoveReply()

    def Lookup(self, request, context):
        dataset = self.store.dataset(request.dataset)
        count = len(request.ids) + len(request.paths)
        if count > limits.lookup_items_max:
            raise InvalidArgument(
                f"lookup of {count} items exceeds the limit of {limits.lookup_items_max}; "
                "split it")
        if request.ids and request.paths:
            raise InvalidArgument("give either sample ids or paths, not both")
        if request.paths:
            ids = dataset.ids_of(list(request.paths))
        else:
            ids = dataset.check_ids(messages.ids_array(request.ids))
        entries = []
        reply_bytes = 0
        limit = self.store.config.message_bytes_max - limits.MiB
        for i in ids.tolist():
            path = dataset.path(i)
            reply_bytes += len(path.encode()) * 2 + limits.entry_reply_bytes
            if reply_bytes > limit:  # refuse before building a reply that cannot be sent
                raise InvalidArgument(
                    f"the lookup's reply would exceed {limit} bytes (--message-bytes-max less "
                    f"1 MiB) after {len(entries)} of {len(ids)} items; ask for fewer at once")
            entries.append(messages.entry(dataset.stat(path)))
        return pb.LookupReply(entries=entries)

    # --- data ----------------------------------------------------------------------

    def GetBatch(self, request, context):
        started = time.perf_counter()
        with self.store.reading(request.dataset, request.generation) as dataset:
            plan = self._batch_plan(dataset, request)
            yield from self._stream(dataset, plan, not request.skip_verify, context)
        self._count("GetBatch", plan, started)

    def GetSmallBatch(self, request, context):
        started = time.perf_counter()
        with self.store.reading(request.dataset, request.generation) as dataset:
            plan = self._batch_plan(dataset, request)
            limit = self.store.config.chunk_bytes
            if plan.payload_bytes > limit:
                raise ReplyTooLarge(f"the reply holds {plan.payload_bytes} bytes, more than one "
                                    f"message carries ({limit}, --chunk-bytes); use GetBatch")
            (reply,) = self._stream(dataset, plan, not request.skip_verify, context)
        self._count("GetSmallBatch", plan, started)
        return reply

    def _batch_plan(self, dataset, request):
        """The read plan of a GetBatchRequest; its prefetch ids are hinted on the way."""
        ids = messages.ids_array(request.ids) if request.ids else None
        paths = list(request.paths) if request.paths else None
        _checked, plan = self.store.reads.plan(dataset, ids=ids, paths=paths)
        if request.prefetch_ids:
            _, hint = self.store.reads.plan(dataset, ids=messages.ids_array(request.prefetch_ids))
            try:
                self.store.reads.hint(dataset, hint)
            except Overloaded:
                pass  # a hint that cannot be queued is dropped: it only costs speed
        return plan

    def Prefetch(self, request, context):
        dataset = self.store.dataset(request.dataset)
        ids = messages.ids_array(request.ids) if request.ids else None
        paths = list(request.paths) if request.paths else None
        _checked, plan = self.store.reads.plan(dataset, ids=ids, paths=paths)
        self.store.reads.hint(dataset, plan)
        return pb.PrefetchReply(ranges=plan.ranges, bytes=plan.payload_bytes)

    def ReadRange(self, request, context):
        started = time.perf_counter()
        if request.path and request.id:
            raise InvalidArgument("give either a sample id or a path, not both")
        with self.store.reading(request.dataset, request.generation) as dataset:
            sample_id = dataset.id_of(request.path) if request.path else request.id
            read = self.store.reads.plan_range(dataset, sample_id, request.offset, request.length)
            # Verified here: the whole sample, or each block the range touches.
            windows = self.store.reads.read_range(dataset, read,
                                                  verify=not request.skip_verify,
                                                  deadline=_deadline(context))
            one = np.array([read.length], np.uint64)
            yield from self._send(windows, read.length, one * 0, one, context)
        self.store.reads.count_served("ReadRange", 1, read.length, started)

    def _count(self, method: str, plan, started: float) -> None:
        self.store.reads.count_read(method, plan, time.perf_counter() - started)

    def Warm(self, request, context):
        store = self.store
        status = store.warm_status(request.dataset) if request.status_only \
            else store.warm(request.dataset)
        if status is None:
            return pb.WarmReply(dataset=request.dataset, state="none")
        return pb.WarmReply(dataset=status.dataset, generation=status.generation,
                            state=status.state, bytes_total=status.bytes_total,
                            bytes_warmed=status.bytes_warmed, budget_bytes=status.budget_bytes,
                            fits=status.fits, message=status.message,
                            bytes_resident=status.bytes_resident)

    def GetDataPath(self, request, context):
        return messages.data_path_info(self.data_path_info())

    def Status(self, request, context):
        status = self.store.status()
        if self.authorizer is not None and \
                self.authorizer.role_of(context.invocation_metadata()) != "admin":
            status = dataclasses.replace(status, data_dir="")  # read tokens need not know it
        return messages.status_reply(status, __version__, self.metrics_address)

    def _stream(self, dataset, plan, verify: bool, context):
        """Send a plan's payload as pre-encoded BatchChunks (see dlfs.formats.grpc_chunks); the
        first carries the offsets and lengths."""
        windows = self.store.reads.read(dataset, plan, verify=verify, deadline=_deadline(context))
        return self._send(windows, plan.payload_bytes, plan.request_offsets,
                          plan.request_lengths, context)

    def _send(self, windows, payload_bytes: int, offsets, lengths, context):
        """(payload offset, bytes) windows as BatchChunks; the first carries the
        payload's size and the items' offsets and lengths."""
        header_sent = False
        for start, window in windows:
            if not context.is_active():
                raise Cancelled("the client cancelled the read")
            header = pb.BatchChunk(data_offset=start)
            if not header_sent:
                messages.batch_header(header, payload_bytes, offsets, lengths)
                header_sent = True
            yield grpc_chunks.encode_chunk(header, window)
        if not header_sent:  # empty payload: only the header
            yield grpc_chunks.encode_chunk(messages.batch_header(
                pb.BatchChunk(), 0, offsets, lengths), b"")

    def GetIndex(self, request, context):
        dataset = self.store.dataset(request.dataset)
        per_chunk = limits.chunk_bytes_default // messages.INDEX_BYTES_PER_SAMPLE
        for first in range(0, max(len(dataset), 1), per_chunk):
            chunk = messages.index_chunk(dataset, first, min(first + per_chunk, len(dataset)))
            if first == 0:
                # No data dir or daemon token: co-located readers get descriptors instead.
                chunk.dataset_id = dataset.dataset_id
                chunk.generation = dataset.generation
                chunk.samples = len(dataset)
                if dataset.cluster is not None:
                    chunk.members.extend(dataset.cluster.members)
                    chunk.replicas = dataset.cluster.replicas
            yield chunk

    def Scrub(self, request, context):
        with self.store.reading(request.dataset) as dataset:
            for checked, checked_bytes, bad in self.store.reads.scrub(dataset):
                if not context.is_active():
                    raise Cancelled("the client cancelled the scrub")
                yield pb.ScrubProgress(
                    samples_checked=checked, bytes_checked=checked_bytes,
                    samples_total=len(dataset),
                    damaged=[messages.entry(dataset.stat(dataset.path(i))) for i, _ in bad],
                    reasons=[reason for _, reason in bad])
        yield pb.ScrubProgress(samples_checked=len(dataset), bytes_checked=dataset.total_bytes,
                               samples_total=len(dataset), done=True)

    def Ingest(self, request_iterator, context):
        session = None
        end = None
        files = data_bytes = 0
        try:
            for message in request_iterator:
                if end is not None:
                    raise InvalidArgument("a message followed the ingest stream's `end`")
                if message.HasField("end"):
                    end = message.end
                if session is None:
                    if not message.HasField("start"):
                        raise InvalidArgument("the first ingest message must carry `start`")
                    start = message.start
                    if start.resume:
                        session = self.store.ingests.resume(start.dataset, start.resume_from,
                                                            start.replace, messages.cluster(start))
                    else:
                        if start.prepare_only and self.cluster_member is not None:
                            self.cluster_member.before_ingest(start.dataset, start.generation)
                        session = self.store.ingests.begin(start.dataset, start.replace,
                                                           messages.cluster(start),
                                                           resumable=start.resumable)
                elif message.HasField("start"):
                    raise InvalidArgument("`start` may only appear in the first ingest message")
                for piece in message.pieces:
                    files += bool(piece.path)
                    data_bytes += len(piece.data)
                    if piece.directory:
                        if (piece.data or piece.size or piece.HasField("crc32c") or piece.remote
                                or piece.kept or piece.holders):
                            raise InvalidArgument(f"directory piece {piece.path!r} carries "
                                                  "only its path")
                        session.add_directory(piece.path)
                        continue
                    if piece.remote or piece.kept:
                        if (not piece.path or piece.data or not piece.HasField("crc32c")
                                or piece.remote == piece.kept):
                            raise InvalidArgument("a remote or kept piece (not both) carries a "
                                                  "path, a crc32c and no data")
                        if piece.remote:
                            session.add_remote(piece.path, piece.size, piece.mode,
                                               piece.mtime_ns, piece.crc32c, tuple(piece.holders))
                        else:
                            self._copy_kept(session, start, piece)
                        continue
                    if piece.path:
                        session.start_file(piece.path, piece.size, piece.mode, piece.mtime_ns,
                                           tuple(piece.holders))
                    session.write(piece.data)
                    if piece.HasField("crc32c"):
                        if session.file_open:
                            raise InvalidArgument("a checksum arrived before its file was complete")
                        session.check_last_crc(piece.crc32c)
            if session is None:
                raise InvalidArgument("the ingest stream was empty")
            if end is None or not context.is_active():
                raise Cancelled("the ingest stream stopped before its end (the client went away "
                                "or was cut off)")
            if (end.files, end.bytes) != (files, data_bytes):
                raise InvalidArgument(
                    f"the ingest stream ended claiming {end.files} files and {end.bytes} bytes "
                    f"but carried {files} files and {data_bytes} bytes")
            if start.prepare_only:
                return messages.dataset_info(self.store.ingests.prepare(session))
            return messages.dataset_info(self.store.ingests.commit(session))
        except BaseException as exc:
            note = None
            if session is not None:  # a resumable ingest is parked, any other discarded
                note = self.store.ingests.break_off(session, f"{type(exc).__name__}: {exc}")
            if isinstance(exc, grpc.RpcError) and not context.is_active():
                raise Cancelled(f"the ingest stream broke off; {note or 'it had ended'}") \
                    from exc
            if isinstance(exc, OSError) and session is not None:  # the disk's, untyped
                exc = disk_error(exc, f"dataset {session.name!r}")
            # The error says what became of the ingest: parked (how much, and what
            # continues or ends it) or discarded.
            raise with_outcome(exc, note)

    def GetIngestProgress(self, request, context):
        return messages.ingest_progress(self.store.ingests.progress(request.dataset))

    def _copy_kept(self, session, start, piece) -> None:
        """Store `piece`'s sample again from this daemon's copy in the dataset the
        ingest replaces, holding a read lease on it while copying."""
        if not start.replace:
            raise InvalidArgument("kept pieces copy from the dataset being replaced: the ingest "
                                  "must set replace")
        with self.store.reading(start.dataset) as replaced:
            sample_id = replaced.id_of(piece.path)
            if replaced.size_and_crc(sample_id) != (piece.size, piece.crc32c):
                raise InvalidArgument(
                    f"kept sample {piece.path!r} differs from this daemon's copy in dataset "
                    f"{replaced.name!r} (size or CRC32C); send its bytes instead")
            session.start_file(piece.path, piece.size, piece.mode, piece.mtime_ns,
                               tuple(piece.holders))
            for window in self.store.reads.read_sample(replaced, sample_id):
                session.write(window)
        session.check_last_crc(piece.crc32c)

    def DeleteDataset(self, request, context):
        return messages.dataset_info(self.store.delete(request.dataset))

    def DiscardIngest(self, request, context):
        return messages.dataset_info(self.store.discard_ingest(request.dataset))

