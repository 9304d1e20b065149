"""Co-located reads: a client on the daemon's host reads extent files itself.

The daemon still owns the directory; the client fetches a dataset's location
arrays once (GetIndex, 24 bytes per sample), then plans and reads batches
with the same planner and reader threads the daemon uses, straight into one
payload buffer: no bytes cross the gRPC channel.  It is allowed only when
the client can read DATA_DIR/daemon-token and finds the token the daemon
reported, i.e. it sees the daemon's own files.

A replaced or deleted dataset removes its extent directory; the reader
checks for it before each batch (one stat), fetches the index again, and
then reads the new dataset (or raises NotFound), as reads through the
daemon would.
"""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np

from dlfs import limits
from dlfs.client.errors import from_rpc_error
from dlfs.errors import DataCorruption, FailedPrecondition, InvalidArgument
from dlfs.proto import dlfs_pb2 as pb
from dlfs.server.extents import ExtentFiles, ExtentStore
from dlfs.server.reader import ReadEngine, plan_batch

TOKEN_FILE = "daemon-token"


class _Index:
    """A dataset's location arrays as fetched from the daemon."""

    def __init__(self, client, dataset: str):
        chunks = []
        try:
            for chunk in client._stub.GetIndex(pb.GetIndexRequest(dataset=dataset),
                                               timeout=client.timeout_s):
                chunks.append(chunk)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, client.address) from None
        first = chunks[0]
        self.dataset_id = first.dataset_id
        self.data_dir = first.data_dir
        self.samples = first.samples
        self.extent = np.frombuffer(b"".join(c.extent for c in chunks), "<u4")
        self.offset = np.frombuffer(b"".join(c.offset for c in chunks), "<u8")
        self.length = np.frombuffer(b"".join(c.length for c in chunks), "<u8")
        self.crc = np.frombuffer(b"".join(c.crc32c for c in chunks), "<u4")
        assert self.extent.size == self.samples, "index chunks do not add up"
        token_path = os.path.join(self.data_dir, TOKEN_FILE)
        try:
            with open(token_path) as f:
                local_token = f.read().strip()
        except OSError as exc:
            raise FailedPrecondition(
                f"direct reads need the daemon's data dir on this host: cannot read {token_path} "
                f"({exc.strerror}); use Client(..., direct=False)") from None
        if local_token != first.daemon_token:
            raise FailedPrecondition(
                f"{token_path} belongs to another daemon than {client.address}; direct reads "
                "need the daemon's own data dir; use Client(..., direct=False)")


class DirectReader:
    """Reads batches of one dataset from its extent files.  Thread-safe."""

    def __init__(self, client, dataset: str, *, threads: int = limits.reader_threads_default):
        self._client = client
        self._dataset = dataset
        self._threads = threads
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        index = _Index(self._client, self._dataset)
        store = ExtentStore(os.path.join(index.data_dir, "extents"))
        files = ExtentFiles(store)
        engine = ReadEngine(files, threads=self._threads)
        with self._lock:
            old = getattr(self, "_engine", None)
            self._index, self._files, self._engine = index, files, engine
            self._dataset_dir = store.dataset_dir(index.dataset_id)
        if old is not None:
            old.close()

    def close(self) -> None:
        self._engine.close()
        self._files.close()

    def get_batch(self, ids, *, verify: bool = True) -> list[memoryview]:
        """Samples `ids` (validated integer ids) as memoryviews into one new buffer."""
        if not os.path.isdir(self._dataset_dir):  # one stat per batch: replaced or deleted?
            self._load()
        try:
            return self._read(ids, verify)
        except DataCorruption as exc:
            if "is missing" not in str(exc):
                raise
            self._load()  # the dataset was replaced or deleted since the index was fetched
            return self._read(ids, verify)

    def _read(self, ids, verify: bool) -> list[memoryview]:
        index, engine = self._index, self._engine
        ids = np.asarray(ids, dtype=np.int64)
        bad = (ids < 0) | (ids >= index.samples)
        if bad.any():
            raise InvalidArgument(
                f"sample id {int(ids[np.argmax(bad)])} is out of range for dataset "
                f"{self._dataset!r}: valid ids are 0..{index.samples - 1}")
        plan = plan_batch(ids, index.extent, index.offset, index.length, index.crc)
        payload = memoryview(np.empty(plan.payload_bytes, dtype=np.uint8)).cast("B")
        engine.read_into(index.dataset_id, plan, payload, verify=verify,
                         describe=lambda i: f"sample {i} of dataset {self._dataset!r}")
        payload = payload.toreadonly()
        return [payload[o:o + n] for o, n in zip(plan.request_offsets.tolist(),
                                                 plan.request_lengths.tolist())]
