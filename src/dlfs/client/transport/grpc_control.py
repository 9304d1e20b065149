"""`GrpcControl`: one daemon's control calls over its gRPC service.

The `contract.DaemonControl` of every one-daemon transport: metadata,
datasets, status, warm-ups, scrubs, the index, ingest streams and the
two-phase commit's calls.  Each call carries the metadata deadline and the
request id, converts gRPC's failures into typed errors inside its attempt
(`grpc_errors.typed`) and runs under the client's call policy (`call_policy`:
retried where the contract says so, one deadline as a whole).  Requests and answers are converted in `grpc_messages`.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import grpc
import numpy as np

from dlfs import limits, logs
from dlfs.client.transport import grpc_ingest
from dlfs.client.transport import grpc_messages as convert
from dlfs.client.transport.grpc_channel import DaemonChannel
from dlfs.client.transport.grpc_errors import from_rpc_error, typed
from dlfs.client.transport.ingest_requests import IngestPiece, IngestStart
from dlfs.client.transport.control_replies import (DataPathOffer, SampleLocations, ScrubUpdate,
                                                    UnsealedIngest)
from dlfs.client.transport.call_policy import Call, time_left
from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DaemonStatus, DatasetInfo, Entry, WarmInfo


class GrpcControl:
    """One daemon's control calls (`contract.DaemonControl`).  Thread-safe.

    `timeout_s` is the deadline of each call, `reconnect_timeout_s` how long
    a retried call waits out Unavailable.  The channel opens at the first call.
    """

    def __init__(self, channel: DaemonChannel, *, timeout_s: float, reconnect_timeout_s: float):
        self.address = channel.address
        self.channel = channel
        self.timeout_s = timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s

    def __repr__(self) -> str:
        return f"GrpcControl({self.address!r})"

    def _call(self, method: str, request, *, timeout_s: float | None = None,
              retry: bool = True):
        """Unary call `method`: one round trip, the typed error of its failure."""
        stub_method = getattr(self.channel.stub, method)
        timeout_s = timeout_s or self.timeout_s

        def attempt():
            return typed(lambda: stub_method(request, timeout=time_left(timeout_s),
                                             metadata=logs.outgoing_metadata()), self.address)

        return self.call(timeout_s, retry=retry).run(attempt)

    def call(self, timeout_s: float, *, retry: bool = True) -> Call:
        """A call to this daemon under the policy: deadline `timeout_s` as a whole."""
        return Call(self.address, timeout_s=timeout_s,
                    reconnect_timeout_s=self.reconnect_timeout_s, retry=retry)

    # --- datasets and metadata ----------------------------------------------------------

    def list_datasets(self) -> list[DatasetInfo]:
        reply = self._call("ListDatasets", pb.ListDatasetsRequest())
        return [convert.dataset_info(d) for d in reply.datasets]

    def get_dataset(self, dataset: str, *, retry: bool = True) -> DatasetInfo:
        return convert.dataset_info(self._call("GetDataset", pb.GetDatasetRequest(
            dataset=dataset), retry=retry))

    def delete_dataset(self, dataset: str) -> DatasetInfo:
        return convert.dataset_info(self._call("DeleteDataset", pb.DeleteDatasetRequest(
            dataset=dataset), retry=False))

    def discard_ingest(self, dataset: str) -> DatasetInfo:
        return convert.dataset_info(self._call("DiscardIngest", pb.DeleteDatasetRequest(
            dataset=dataset), retry=False))

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        return convert.entry(self._call("Stat", pb.StatRequest(dataset=dataset, path=path,
                                                               generation=generation)))

    # --- checkpoint spaces (not retried: each is a change) -------------------------------

    def create_space(self, name: str) -> DatasetInfo:
        return convert.dataset_info(self._call("CreateSpace", pb.CreateSpaceRequest(name=name),
                                               retry=False))

    def make_dir(self, space: str, path: str, mode: int = 0o755) -> Entry:
        return convert.entry(self._call("MakeDir", pb.SpacePathRequest(
            space=space, path=path, mode=mode), retry=False))

    def remove(self, space: str, path: str, *, directory: bool = False) -> None:
        self._call("Remove", pb.SpacePathRequest(space=space, path=path, directory=directory),
                   retry=False)

    def rename(self, space: str, path: str, target: str) -> None:
        self._call("Rename", pb.SpacePathRequest(space=space, path=path, target=target),
                   retry=False)

    def list_page(self, dataset: str, path: str, start_after: str,
                  page_size: int, generation: int) -> tuple[list[Entry], bool]:
        reply = self._call("ListDir", pb.ListDirRequest(
            dataset=dataset, path=path, start_after=start_after, page_size=page_size,
            generation=generation))
        return [convert.entry(e) for e in reply.entries], reply.more

    def lookup(self, dataset: str, *, ids: np.ndarray | None = None,
               paths: Sequence[str] | None = None, retry: bool = True) -> list[Entry]:
        reply = self._call("Lookup", convert.lookup_message(dataset, ids, paths), retry=retry)
        return [convert.entry(e) for e in reply.entries]

    def index(self, dataset: str) -> SampleLocations:
        def attempt():
            return typed(lambda: list(self.channel.stub.GetIndex(
                pb.GetIndexRequest(dataset=dataset), timeout=time_left(self.timeout_s),
                metadata=logs.outgoing_metadata())), self.address)

        return convert.sample_locations(self.call(self.timeout_s).run(attempt))

    # --- the daemon ---------------------------------------------------------------------

    def status(self, *, retry: bool = True) -> DaemonStatus:
        return convert.daemon_status(self.address, self._call("Status", pb.StatusRequest(),
                                                              retry=retry))

    def warm(self, dataset: str, *, status_only: bool = False) -> WarmInfo:
        reply = self._call("Warm", pb.WarmRequest(dataset=dataset, status_only=status_only),
                           retry=False)
        return convert.warm_info(self.address, reply)

    def scrub(self, dataset: str) -> Iterator[ScrubUpdate]:
        try:
            for update in self.channel.stub.Scrub(pb.ScrubRequest(dataset=dataset),
                                                  timeout=limits.ingest_timeout_s_default,
                                                  metadata=logs.outgoing_metadata()):
                yield convert.scrub_update(update)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None

    def data_path_offer(self) -> DataPathOffer:
        return convert.data_path_offer(self._call("GetDataPath", pb.GetDataPathRequest()))

    # --- ingest ---------------------------------------------------------------------------

    def ingest(self, start: IngestStart, pieces: Iterable[IngestPiece]) -> DatasetInfo:
        return convert.dataset_info(grpc_ingest.send(self.channel, start, pieces))

    def ingest_progress(self, dataset: str, *, timeout_s: float | None = None,
                        retry: bool = True) -> UnsealedIngest:
        return convert.unsealed_ingest(self._call(
            "GetIngestProgress", pb.GetIngestProgressRequest(dataset=dataset),
            timeout_s=timeout_s, retry=retry))
