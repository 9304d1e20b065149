"""`DLFSReader`: torch.distributed.checkpoint's StorageReader for checkpoint spaces.

A checkpoint is there when its `.metadata` is (`DLFSWriter`'s commit):
`read_metadata` raises NotFound naming the directory otherwise, so a save
that never finished is never half loaded.  `read_data` gathers every item
of the rank's load plan, sorts them by file and offset, joins neighbours
into runs (`read_runs.plan_runs`) and reads the runs over the data path,
`read_threads` requests at once with at most `INFLIGHT_BYTES_MAX` bytes
received ahead of the planner; each run's items go to the planner as soon
as the run is in (`load_bytes`; tensors by `torch.load`, narrowed to the
requested chunk and copied into `resolve_tensor`'s target).  What it read
is in `last_read` (items, runs, requests, bytes).

A save into the directory a load is reading is not isolated from it (as
with DCP's own file system): save each step into a directory of its own.
"""

from __future__ import annotations

import collections
import io
import pickle
import uuid
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from typing import IO, NamedTuple, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from dlfs import limits
from dlfs.client import Client, Space
from dlfs.errors import InvalidArgument, NotFound
from dlfs.torch.checkpoint.checkpoint_ids import CheckpointStorage
from dlfs.torch.checkpoint.dcp_writer import METADATA_NAME
from dlfs.torch.checkpoint.read_runs import PiecesReader, ReadRun, pieces, plan_runs

READ_THREADS_DEFAULT = 4  # data-path reads in flight at once
READ_THREADS_MAX = 64
# One request's bytes: large enough that the round trip is small beside the
# transfer, small enough that a large tensor still comes in several at once.
PIECE_BYTES = limits.data_path_chunks_bytes_max
# Neighbouring items closer than this are read as one run, the gap dropped.
GAP_BYTES_MAX = 256 * limits.KiB
# Bytes received but not yet handed to the planner: the read-ahead's memory.  A
# few pieces per thread: the client's reply buffers are recycled, not faulted in
# anew for every piece of a large restore.
INFLIGHT_BYTES_MAX = 64 * limits.MiB


class ReadStats(NamedTuple):
    """One `read_data`: plan items, runs they were joined into, data-path requests,
    bytes received (gaps included)."""

    items: int
    runs: int
    requests: int
    bytes: int


class DLFSReader(CheckpointStorage, StorageReader):
    """Load a checkpoint that `DLFSWriter` saved (see the module).

    `checkpoint_id`: `dlfs://HOST:PORT/SPACE/DIR` (None: the id `dcp.load` is
    given); `client`: a `Client` of that daemon (default: one per process and
    address); `read_threads`: requests in flight at once.
    """

    def __init__(self, checkpoint_id=None, *, client: Client | None = None,
                 read_threads: int = READ_THREADS_DEFAULT):
        super().__init__()
        if not 1 <= read_threads <= READ_THREADS_MAX:
            raise InvalidArgument(f"read_threads {read_threads} is not in 1..{READ_THREADS_MAX}")
        self.use_client(client)
        self.read_threads = read_threads
        self.storage_data: dict = {}
        self.load_id = uuid.uuid4().hex
        self.last_read: ReadStats | None = None
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def reset(self, checkpoint_id=None) -> None:
        self.locate(checkpoint_id)
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **kwargs) -> Metadata:
        """The checkpoint's `.metadata` (`__{rank}.metadata` with `rank`: a save without
        collectives); NotFound when the directory holds no finished checkpoint."""
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        space = self._space()
        try:
            metadata = pickle.loads(space.read(self.located().path(name)))
        except NotFound:
            raise NotFound(f"{self.checkpoint_id} holds no finished checkpoint: it has no "
                           f"{name} (a save that did not reach its finish leaves none); "
                           "load the last step that finished") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        if metadata.storage_data is None:
            raise InvalidArgument(f"{self.checkpoint_id}'s metadata names no storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item of `plan` (sorted, joined, in parallel: see the module) and
        hand each to `planner`; the Future is done when this returns."""
        items = plan.items
        spans = [self._span(item) for item in items]
        runs = plan_runs(spans, gap_bytes_max=GAP_BYTES_MAX, run_bytes_max=PIECE_BYTES)
        space = self._space()
        entries = {file: space.stat(self.located().path(file))
                   for file in {run.file for run in runs}}
        requests = received = 0
        waiting: collections.deque[tuple[ReadRun, list[ThreadFuture]]] = collections.deque()
        ahead, todo = 0, collections.deque(runs)
        with ThreadPoolExecutor(self.read_threads, thread_name_prefix="dlfs-dcp-read") as pool:
            try:
                while todo or waiting:
                    while todo and (not waiting or ahead + todo[0].length <= INFLIGHT_BYTES_MAX):
                        run = todo.popleft()
                        path, entry = self.located().path(run.file), entries[run.file]
                        asked = pieces(run, PIECE_BYTES)
                        waiting.append((run, [pool.submit(space.read, path, offset, length,
                                                          entry=entry)
                                              for offset, length in asked]))
                        ahead += run.length
                        requests += len(asked)
                    run, futures = waiting.popleft()
                    views = [f.result() for f in futures]
                    ahead -= run.length
                    received += sum(len(v) for v in views)
                    for index, start, length in run.items:
                        _deliver(planner, items[index], PiecesReader(views, start, length))
            except BaseException:
                for _, futures in waiting:
                    for f in futures:
                        f.cancel()
                raise
        self.last_read = ReadStats(len(items), len(runs), requests, received)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _span(self, item: ReadItem) -> tuple[str, int, int]:
        info = self.storage_data[item.storage_index]
        if getattr(info, "transform_descriptors", None):
            raise InvalidArgument(f"{self.checkpoint_id} was saved with stream transforms "
                                  f"{info.transform_descriptors}: DLFSReader reads plain "
                                  "DCP files only")
        return info.relative_path, info.offset, info.length

    def _space(self) -> Space:
        return self.daemon_client().space(self.located().space)


def _deliver(planner: LoadPlanner, item: ReadItem, data: PiecesReader) -> None:
    """One item's bytes to the planner, as DCP's file system reader hands them."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data.read()))
        return
    tensor = torch.load(cast(IO[bytes], data), map_location="cpu", weights_only=True)
    for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise InvalidArgument(f"checkpoint item {item.storage_index} is {tuple(tensor.size())}"
                              f" but the state dict's is {tuple(target.size())}")
    target.copy_(tensor)
    planner.commit_tensor(item, target)
