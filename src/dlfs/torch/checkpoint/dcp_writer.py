"""`DLFSWriter`: torch.distributed.checkpoint's StorageWriter for checkpoint spaces.

Every rank writes its share of the state dict as `__{rank}_{n}.distcp`
files in the checkpoint's directory, `thread_count` files at once, each
over a data-path connection of its own (`Space.open(path, "wb")`); each
file is durable and whole when its close returns.  The coordinator's
`finish` then writes `.metadata.tmp`, closes it and renames it to
`.metadata` (atomic, replacing an older one): the checkpoint exists from
that rename on, whole.  The files are DCP's own format (each tensor a
`torch.save`, each byte item as given, the `.metadata` a pickled
`Metadata` whose storage data are DCP's `_StorageInfo` records), so
DCP's `FileSystemReader` reads them through a mount too.

Overwriting (`overwrite=True`, the default): the coordinator removes the
directory's old `.metadata` in `prepare_global_plan`, before any rank
writes a data file, so readers see the old checkpoint whole, then none,
then the new one whole, never a mix.  With `overwrite=False` a directory
that holds a checkpoint raises AlreadyExists before anything is written.

`async_save` works with either executor: staging is DCP's
`BlockingAsyncStager` (a CPU copy of the state dict, as `FileSystemWriter`
does); for the process-based executor the writer is pickled without its
client and makes one in the checkpoint process (`shared_client`, with
the options of the client it was given).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from dlfs import limits
from dlfs.client import Client, Space
from dlfs.errors import AlreadyExists, InvalidArgument, NotFound
from dlfs.torch.checkpoint.checkpoint_ids import CheckpointStorage

METADATA_NAME = ".metadata"  # the commit: a checkpoint exists once this file does
DATA_SUFFIX = ".distcp"
THREADS_DEFAULT = 2  # files one rank writes at once (each a connection and a daemon draft)
THREADS_MAX = 64
# What a data file's writes are gathered into before they go to the daemon: the
# many small writes of a torch.save record become one frame.
WRITE_BUFFER_BYTES = 4 * limits.MiB


class DLFSWriter(CheckpointStorage, StorageWriter, BlockingAsyncStager):
    """Save a checkpoint into a DLFS checkpoint space (see the module).

    `checkpoint_id`: `dlfs://HOST:PORT/SPACE/DIR` (None: the id `dcp.save` is
    given); the space and directories are created when missing.  `client`: a
    `Client` of that daemon (default: one per process and address).
    `thread_count`: data files per rank, written at once.  Raises what the
    client raises (InvalidArgument for a bad id, AlreadyExists with
    `overwrite=False`, StorageFull, Unavailable, ...).
    """

    def __init__(self, checkpoint_id=None, *, client: Client | None = None,
                 thread_count: int = THREADS_DEFAULT, overwrite: bool = True,
                 cache_staged_state_dict: bool = False):
        StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if not 1 <= thread_count <= THREADS_MAX:
            raise InvalidArgument(f"thread_count {thread_count} is not in 1..{THREADS_MAX}")
        self.use_client(client)
        self.thread_count = thread_count
        self.overwrite = overwrite
        self.rank = 0
        self.is_coordinator = True
        self.use_collectives = True
        self.save_id = uuid.uuid4().hex
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    # --- StorageWriter ---------------------------------------------------------------

    def reset(self, checkpoint_id=None) -> None:
        self.locate(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank") or 0
        self.use_collectives = kwargs.get("use_collectives", True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        space = self._space(create=True)
        if not self.overwrite and space.exists(self._metadata_path()):
            raise AlreadyExists(f"{self.checkpoint_id} holds a checkpoint already (its "
                                f"{self._metadata_name()}); save elsewhere, or pass "
                                "overwrite=True")
        if not self.use_collectives:  # no global plan: each rank names its own files
            plan = dataclasses.replace(plan, storage_data=f"__{self.rank}_")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Before any rank writes: the old checkpoint stops existing whole.
        try:
            self._space().remove(self._metadata_path())
        except NotFound:
            pass
        return [plan if plan.storage_data is not None else
                dataclasses.replace(plan, storage_data=f"__{rank}_")
                for rank, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items into `thread_count` files at once; the Future is done
        (every file durable and whole) when this returns."""
        prefix: str = plan.storage_data
        buckets = [b for b in split_items(plan.items, self.thread_count) if b]
        space = self._space()
        names = [f"{prefix}{n}{DATA_SUFFIX}" for n in range(len(buckets))]
        with ThreadPoolExecutor(max(1, len(buckets)), thread_name_prefix="dlfs-dcp") as pool:
            done = list(pool.map(lambda name, items: self._write_file(space, name, items,
                                                                      planner),
                                 names, buckets))
        future: Future[list[WriteResult]] = Future()
        future.set_result([result for results in done for result in results])
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit: `.metadata` written aside, then renamed into place."""
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        space, final = self._space(), self._metadata_path()
        temporary = final + ".tmp"
        with space.open(temporary, "wb") as f:
            f.write(pickle.dumps(metadata))
        self._publish(space, temporary, final)

    # --- the rest ----------------------------------------------------------------

    def _publish(self, space: Space, temporary: str, final: str) -> None:
        space.rename(temporary, final)

    def _write_file(self, space: Space, name: str, items: list[WriteItem],
                    planner: SavePlanner) -> list[WriteResult]:
        """One data file: byte items first, then tensors; committed by its close."""
        results = []
        raw = space.open(self.located().path(name), "wb")
        stream = io.BufferedWriter(raw, WRITE_BUFFER_BYTES)
        try:
            for item in sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO):
                offset = stream.tell()
                data = planner.resolve_data(item)  # BytesIO for BYTE_IO items, else a Tensor
                if isinstance(data, io.BytesIO):
                    stream.write(data.getbuffer())
                else:
                    torch.save(_saveable(data), stream)
                length = stream.tell() - offset
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=_StorageInfo(name, offset, length)))
            stream.flush()
        except BaseException:
            raw.discard()
            raise
        raw.close()
        return results

    def _metadata_name(self) -> str:
        return METADATA_NAME if self.use_collectives else f"__{self.rank}{METADATA_NAME}"

    def _metadata_path(self) -> str:
        return self.located().path(self._metadata_name())

    def _space(self, create: bool = False) -> Space:
        location, client = self.located(), self.daemon_client()
        if create:
            try:
                space = client.create_space(location.space)
            except AlreadyExists:
                space = client.space(location.space)  # NotFound if it is a dataset
            if location.directory:
                space.mkdir(location.directory, parents=True, exist_ok=True)
            return space
        return client.space(location.space)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_client"] = None  # the checkpoint process makes its own (shared_client)
        state["state_dict_cache"] = None  # the stager's, of no use to the writing
        return state


def split_items(items: list[WriteItem], bins: int) -> list[list[WriteItem]]:
    """`items` in `bins` lists of about equal bytes: byte items dealt round robin, the
    tensors largest first, each to the lightest list."""
    out: list[list[WriteItem]] = [[] for _ in range(bins)]
    weights = [0] * bins
    blobs = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensors = sorted((i for i in items if i.type != WriteItemType.BYTE_IO),
                     key=lambda i: i.tensor_storage_size() or 0, reverse=True)
    for n, item in enumerate(blobs):
        out[n % bins].append(item)
    for item in tensors:
        lightest = weights.index(min(weights))
        out[lightest].append(item)
        weights[lightest] += item.tensor_storage_size() or 0
    return out


def _saveable(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU, holding only its own elements (torch.save writes a view's
    whole storage)."""
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    return tensor
