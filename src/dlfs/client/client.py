"""The thin client: `Client` talks to a daemon, `Dataset` is one dataset on it.

Every call carries a deadline.  Failures raise the typed errors of
`dlfs.errors`; calls that only read are retried on UNAVAILABLE for up to
`reconnect_timeout_s` (a restarting daemon is waited for, a dead one is
reported with its address).

Samples come back as read-only `memoryview`s into the reply's payload: no
client-side copy, buffer protocol (``np.frombuffer``, ``io.BytesIO``,
``bytes(sample)``).  All samples of one batch share one payload buffer,
which lives as long as any of them does.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Iterable, Iterator, Sequence

import grpc

from dlfs import limits, logs
from dlfs.client import convert
from dlfs.client.channel import open_channel
from dlfs.client.convert import DatasetInfo, Entry
from dlfs.client.dataset import Dataset
from dlfs.client.errors import from_rpc_error
from dlfs.client.reads import SampleKey, fetch_batch
from dlfs.errors import DlfsError, InvalidArgument, NotFound, Unavailable
from dlfs.paths import check_dataset_name, normalize_dir_path
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc

_RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


class Client:
    """Connection to a DLFS daemon.

    `address` is ``HOST:PORT``, or several (a list, or one string separated
    by ','): then datasets striped over those daemons are read from all of
    them, each sample from a live holder, with failover to replicas (see
    `dlfs.client.cluster`).  The client is thread-safe; after `os.fork` make
    a new one in the child.

    `token` (default: $DLFS_TOKEN) authenticates to a daemon started with
    --tokens-file; `tls_ca` (default: $DLFS_TLS_CA) is the CA file that
    signed the daemon's certificate and turns TLS on; `tls_cert`/`tls_key`
    present a client certificate to a daemon that requires one.

    With `direct=True` the client must run on the daemon's host with read
    access to its data dir: batches are then served from the extent files
    mapped into this process, as views of the page cache (see
    `dlfs.client.direct`); metadata still comes from the daemon.
    FailedPrecondition is raised at the first batch otherwise.
    """

    def __init__(self, address: str | Sequence[str], *,
                 timeout_s: float = limits.metadata_timeout_s_default,
                 batch_timeout_s: float = limits.batch_timeout_s_default,
                 reconnect_timeout_s: float = limits.reconnect_timeout_s_default,
                 direct: bool = False, token: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None):
        addresses = [address] if isinstance(address, str) else list(address)
        addresses = list(dict.fromkeys(a.strip() for part in addresses for a in part.split(",")
                                       if a.strip()))
        if not addresses:
            raise InvalidArgument("no daemon address given (HOST:PORT, or several separated by ',')")
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self._cluster = None
        if len(addresses) > 1:
            if direct:
                raise InvalidArgument("direct=True reads one daemon's files; give one address")
            from dlfs.client.cluster import ClusterRouter

            member_options = dict(timeout_s=timeout_s, batch_timeout_s=batch_timeout_s,
                                  reconnect_timeout_s=min(reconnect_timeout_s,
                                                          limits.failover_timeout_s),
                                  token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
            self.address = ",".join(addresses)
            self._cluster = ClusterRouter(lambda a: Client(a, **member_options), addresses)
            self._channel = self._stub = None
            self._raw_reads: dict = {}
        else:
            self.address = addresses[0]
            self._channel = open_channel(self.address, token=token, tls_ca=tls_ca,
                                         tls_cert=tls_cert, tls_key=tls_key)
            self._stub = dlfs_pb2_grpc.DlfsStub(self._channel)
            # The read RPCs hand the raw reply to dlfs.wire, which slices the payload without copying.
            self._raw_reads = {
                name: self._channel.unary_stream(f"/dlfs.v1.Dlfs/{name}",
                                                 request_serializer=request_type.SerializeToString,
                                                 response_deserializer=None)
                for name, request_type in (("GetBatch", pb.GetBatchRequest),
                                           ("ReadRange", pb.ReadRangeRequest))
            }
            self._raw_reads["GetSmallBatch"] = self._channel.unary_unary(
                "/dlfs.v1.Dlfs/GetSmallBatch",
                request_serializer=pb.GetBatchRequest.SerializeToString,
                response_deserializer=None)
        # False once the daemon answered UNIMPLEMENTED (older than GetSmallBatch).
        self._small_batches = True
        self.direct = direct
        self._direct_readers: dict = {}
        self._direct_lock = threading.Lock()

    def close(self) -> None:
        with self._direct_lock:
            readers, self._direct_readers = list(self._direct_readers.values()), {}
        for reader in readers:
            reader.close()
        if self._cluster is not None:
            self._cluster.close()
        else:
            self._channel.close()

    def _direct_reader(self, dataset: str):
        """The co-located reader of `dataset` (created on first use)."""
        with self._direct_lock:
            reader = self._direct_readers.get(dataset)
            if reader is None:
                from dlfs.client.direct import DirectReader

                reader = self._direct_readers[dataset] = DirectReader(self, dataset)
            return reader

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"

    # --- calls --------------------------------------------------------------

    def _call(self, method: str, request, *, timeout_s: float | None = None, retry: bool = True):
        """Unary call with deadline, typed errors and retry on UNAVAILABLE.

        Several daemons: the first member that answers (see ClusterRouter.call_any).
        """
        if self._cluster is not None:
            return self._cluster.call_any(
                lambda member: member._call(method, request, timeout_s=timeout_s, retry=retry))
        stub_method = getattr(self._stub, method)
        give_up = time.monotonic() + (self.reconnect_timeout_s if retry else 0.0)
        for attempt in range(1 << 30):
            try:
                return stub_method(request, timeout=timeout_s or self.timeout_s,
                                   metadata=logs.outgoing_metadata())
            except grpc.RpcError as exc:
                if not self._should_retry(exc, attempt, give_up):
                    raise from_rpc_error(exc, self.address) from None

    def _should_retry(self, exc: grpc.RpcError, attempt: int, give_up: float) -> bool:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return False
        pause = _RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)]
        if time.monotonic() + pause > give_up:
            return False
        time.sleep(pause)
        return True

    # --- datasets -------------------------------------------------------------

    def datasets(self) -> list[str]:
        """Names of the sealed datasets, sorted."""
        return [info.name for info in self.dataset_infos() if info.sealed]

    def dataset_infos(self) -> list[DatasetInfo]:
        """Summaries of all datasets, including ingests in progress (sealed=False).

        Several daemons: the union over the members that answer.
        """
        if self._cluster is None:
            reply = self._call("ListDatasets", pb.ListDatasetsRequest())
            return [convert.dataset_info(d) for d in reply.datasets]
        results = self._cluster.each(lambda member: member.dataset_infos()).values()
        if all(isinstance(r, Exception) for r in results):
            raise Unavailable(f"none of the DLFS daemons {self.address} answers")
        found: dict[str, DatasetInfo] = {}
        for result in results:
            if isinstance(result, list):
                for info in result:
                    if info.name not in found or (info.sealed and not found[info.name].sealed):
                        found[info.name] = info
        return [found[name] for name in sorted(found)]

    def dataset(self, name: str) -> "Dataset":
        """Open dataset `name`.  Raises NotFound, InvalidArgument."""
        check_dataset_name(name)
        info = convert.dataset_info(self._call("GetDataset", pb.GetDatasetRequest(dataset=name)))
        return Dataset(self, info)

    def delete(self, name: str) -> DatasetInfo:
        """Remove dataset `name` and free its space (on every member that has it).

        Raises NotFound; with several daemons, Unavailable when a member that
        may hold part of it does not answer (delete again once it is back).
        """
        check_dataset_name(name)
        request = pb.DeleteDatasetRequest(dataset=name)
        if self._cluster is None:
            return convert.dataset_info(self._call("DeleteDataset", request, retry=False))
        results = self._cluster.each(
            lambda member: convert.dataset_info(member._call("DeleteDataset", request,
                                                             retry=False)))
        deleted = [r for r in results.values() if isinstance(r, DatasetInfo)]
        down = [a for a, r in results.items() if isinstance(r, Unavailable)]
        if down:
            raise Unavailable(f"dataset {name!r} was deleted on {len(deleted)} daemon(s), but "
                              f"{', '.join(down)} did not answer: delete it again once they are back")
        if not deleted:
            raise NotFound(f"no dataset named {name!r} on {self.address}")
        return deleted[0]

    def ingest(self, source_dir: str, name: str, *, replace: bool = False,
               include_hidden: bool = False, follow_symlinks: bool = False,
               progress: bool | None = None, replicas: int = 1) -> DatasetInfo:
        """Upload every regular file below `source_dir` as dataset `name`.

        See `dlfs.client.ingest` for the file selection rules, and `upload`.
        """
        from dlfs.client.ingest import walk_tree

        check_dataset_name(name)
        report = walk_tree(source_dir, include_hidden=include_hidden,
                           follow_symlinks=follow_symlinks)
        return self.upload(report, name, replace=replace, progress=progress, replicas=replicas)

    def upload(self, report, name: str, *, replace: bool = False, progress: bool | None = None,
               replicas: int = 1) -> DatasetInfo:
        """Upload the files of a `walk_tree` report as dataset `name`.

        Several daemons: the dataset is striped over all of them, each sample
        stored on `replicas` of them (docs/cluster.md).
        """
        if self._cluster is None:
            from dlfs.client.ingest import upload

            if replicas != 1:
                raise InvalidArgument(f"--replicas {replicas} needs as many daemons; one was given")
            return upload(self, name, report, replace=replace, progress=progress)
        from dlfs.client.cluster import ingest_striped

        check_dataset_name(name)
        info = ingest_striped(self._cluster, report, name, replace=replace, replicas=replicas,
                              progress=progress)
        self._cluster.forget(name)
        return info

    def rebalance(self, name: str, *, replicas: int | None = None,
                  progress: bool | None = None):
        """Re-place dataset `name` on this client's daemons (e.g. after adding one).

        Only copies whose holder changes cross the network; see
        `dlfs.client.rebalance`.  Returns a `RebalanceReport`.  Raises
        InvalidArgument with a single address, NotFound, Unavailable.
        """
        check_dataset_name(name)
        if self._cluster is None:
            raise InvalidArgument("rebalance places a dataset on several daemons: give the new "
                                  "list of addresses (A,B,C)")
        from dlfs.client.rebalance import rebalance

        return rebalance(self._cluster, name, replicas=replicas, progress=progress)

    def status(self) -> convert.DaemonStatus:
        """The daemon's health and counters (what `dlfs status` prints).

        Several daemons: the first member that answers; see `statuses`.
        """
        if self._cluster is not None:
            return self._cluster.call_any(lambda member: member.status())
        return convert.daemon_status(self.address, self._call("Status", pb.StatusRequest()))

    def statuses(self) -> dict:
        """Per daemon address: its DaemonStatus, or the error that reaching it raised."""
        if self._cluster is None:
            try:
                return {self.address: self.status()}
            except DlfsError as exc:
                return {self.address: exc}
        return self._cluster.each(lambda member: member.status())

    def scrub(self, name: str, *, progress: bool | None = None) -> ScrubReport:
        """Verify every sample of dataset `name` on the daemon; report the damaged ones.

        Streams progress (a bar on a terminal when `progress` is None).
        Raises NotFound.  Damaged samples are in the report, not raised.
        """
        check_dataset_name(name)
        if self._cluster is not None:
            return _merge_scrubs(name, self._cluster.each(
                lambda member: member.scrub(name, progress=False)))
        show = sys.stderr.isatty() if progress is None else progress
        bar = None
        damaged: list[tuple[Entry, str]] = []
        try:
            for update in self._stub.Scrub(pb.ScrubRequest(dataset=name),
                                           timeout=limits.ingest_timeout_s_default):
                if show and bar is None:
                    from tqdm import tqdm

                    bar = tqdm(total=update.bytes_checked if update.done else None, unit="B",
                               unit_scale=True, unit_divisor=1024, desc=f"scrub {name}",
                               file=sys.stderr)
                if bar is not None:
                    bar.update(update.bytes_checked - bar.n)
                damaged.extend(zip(map(convert.entry, update.damaged), update.reasons))
                if update.done:
                    return ScrubReport(update.samples_checked, update.bytes_checked, damaged)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        finally:
            if bar is not None:
                bar.close()
        raise Unavailable(f"the scrub of {name!r} on {self.address} ended early")

    # --- samples --------------------------------------------------------------------

    def get_batch(self, keys: Iterable[SampleKey], *, dataset: str, verify: bool = True,
                  prefetch: Iterable[int] = ()) -> list[memoryview]:
        """Shorthand for ``client.dataset(dataset).get_batch(keys)`` without the lookup."""
        return fetch_batch(self, dataset, keys, verify=verify, prefetch=prefetch)

    def stat(self, dataset: str, path: str) -> Entry:
        """Metadata of a file or directory ("" is the dataset root)."""
        request = pb.StatRequest(dataset=dataset, path=normalize_dir_path(path))
        return convert.entry(self._call("Stat", request))

    def listdir(self, dataset: str, path: str = "", *,
                page_size: int = limits.list_page_entries_default) -> Iterator[Entry]:
        """Entries of a directory in name order, fetched page by page."""
        start_after = ""
        while True:
            entries, more = self.list_page(dataset, path, start_after, page_size)
            yield from entries
            if not more or not entries:
                return
            start_after = entries[-1].name

    def list_page(self, dataset: str, path: str = "", start_after: str = "",
                  page_size: int = limits.list_page_entries_default) -> tuple[list[Entry], bool]:
        """One page of a directory: at most `page_size` entries after name
        `start_after`, in name order, and whether more follow.  One round trip."""
        reply = self._call("ListDir", pb.ListDirRequest(
            dataset=dataset, path=normalize_dir_path(path), start_after=start_after,
            page_size=page_size))
        return [convert.entry(e) for e in reply.entries], reply.more


@dataclasses.dataclass(frozen=True)
class ScrubReport:
    samples: int
    bytes: int
    damaged: list  # (Entry, reason) of each sample that failed its checksum


def _merge_scrubs(name: str, results: dict) -> ScrubReport:
    """One report from every member's scrub of its own samples."""
    reports = [r for r in results.values() if isinstance(r, ScrubReport)]
    down = [a for a, r in results.items() if isinstance(r, Unavailable)]
    if down:
        raise Unavailable(f"cannot scrub {name!r} on {', '.join(down)}: not answering")
    if not reports:
        raise NotFound(f"no dataset named {name!r} on any daemon")
    return ScrubReport(sum(r.samples for r in reports), sum(r.bytes for r in reports),
                       [d for r in reports for d in r.damaged])
