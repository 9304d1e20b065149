"""The thin client: `Client` talks to DLFS daemons, `Dataset` is one dataset.

Every call carries one deadline as a whole (`timeout_s` for metadata,
`batch_timeout_s` for reads).  Failures raise the typed errors of
`dlfs.errors`; what calls that only read do after a failure is the one call
policy (`transport.call_policy`): a lost connection (a data path worker that
died or hung) goes on at once on a new one, an unreachable daemon is waited
for up to `reconnect_timeout_s` (a restarting daemon is waited for, a dead
one is reported with its address and what was tried).

Samples come back as read-only `memoryview`s into the reply's payload: no
client-side copy, buffer protocol (``np.frombuffer``, ``io.BytesIO``,
``bytes(sample)``).  All samples of one batch share one payload buffer,
which lives as long as any of them does.

A client holds one transport (`dlfs.client.transport.contract.Transport`):
a single daemon over its data path or over gRPC, a co-located daemon whose
extent files it reads itself, or a router over a cluster's members, found
in etcd (`Client(etcd=...)`).  They answer the same calls, so nothing here
depends on which, but for changes: one daemon gets one ingest stream
(`ingest_upload`); a cluster gets a striped ingest, rebalance or delete
decided by one etcd transaction (`cluster.striped_ingest`,
`cluster.etcd_commit`).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, Sequence

from dlfs import limits
from dlfs.client import metadata
from dlfs.client.addresses import daemon_addresses
from dlfs.client import warm_calls as warmups
from dlfs.client.cluster.cluster_view import ClusterView
from dlfs.client.cluster.etcd_commit import ClusterChange
from dlfs.client.cluster.rebalance import RebalanceReport, rebalance
from dlfs.client.cluster.router import ClusterRouter
from dlfs.client.cluster.striped_ingest import ingest_striped
from dlfs.client.dataset import Dataset
from dlfs.client.ingest_upload import upload as upload_one
from dlfs.client.metadata import cluster_listing, merged_listings
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.scrub_report import ScrubReport, scrub_member, summed
from dlfs.client.transport.contract import DaemonTransport, Transport
from dlfs.client.transport.datapath_transport import DataPathTransport
from dlfs.client.transport.direct_reader import DirectReader
from dlfs.client.transport.direct_transport import DirectTransport
from dlfs.client.transport.grpc_transport import GrpcTransport
from dlfs.client.transport.read_requests import SampleKey, batch_request, range_request
from dlfs.coord.cluster_keys import CLUSTER_DEFAULT
from dlfs.errors import DlfsError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from dlfs.paths import check_dataset_name
from dlfs.staging.progress import IngestStats
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.staging.source_set import open_sources
from dlfs.client.spaces import Space
from dlfs.types import DaemonStatus, DatasetInfo, Entry, WarmInfo


class Client:
    """Connection to DLFS daemons.

    `address` is one daemon's ``HOST:PORT`` (``HOST`` alone: port 7010).  A
    cluster of daemons is found through its etcd instead: `etcd`
    ("http://HOST:2379", several separated by ','; default $DLFS_ETCD when no
    `address` is given) and `cluster` (its name there; default $DLFS_CLUSTER,
    else "default").  Then datasets are striped over the live members, each
    sample read from a live holder with failover to replicas (see
    `dlfs.client.cluster.router`); a member whose lease in etcd expired is not
    asked at all.  The client is thread-safe; after `os.fork` make a new one
    in the child.

    `token` (default: $DLFS_TOKEN) authenticates to a daemon started with
    --tokens-file; `tls_ca` (default: $DLFS_TLS_CA) is the CA file that
    signed the daemon's certificate and turns TLS on; `tls_cert`/`tls_key`
    present a client certificate to a daemon that requires one.

    Reads take the daemon's data path (`dlfs/proto/datapath.md`): sample
    bytes are received straight into a reply buffer or the caller's `out`,
    and checked against their CRC32C here: over the daemon's Unix socket
    when this host reaches it, else TCP (`data_path="tcp"` or `"unix"`
    picks one).  `data_path=False`, a daemon serving TLS, or one without a
    data path: reads go through gRPC.  Replies that come without an `out`
    land in `reply_buffers` (a `BufferPool`, recycled once nothing
    references them; None without a data path).

    With `direct=True` the client must run on the daemon's host: the daemon
    passes its extent files over its Unix socket and batches are served
    from them, mapped into this process, as views of the page cache (see
    `dlfs.client.transport.direct_transport`); metadata still comes from the daemon.
    FailedPrecondition is raised at the first batch otherwise.

    `data_path_hints` ({address: where its data path listens}) is what a
    `Dataset.ticket` hands a child process, so it reads without asking.
    """

    def __init__(self, address: str | Sequence[str] | None = None, *,
                 etcd: str | Sequence[str] | None = None, cluster: str | None = None,
                 timeout_s: float = limits.metadata_timeout_s_default,
                 batch_timeout_s: float = limits.batch_timeout_s_default,
                 reconnect_timeout_s: float = limits.reconnect_timeout_s_default,
                 direct: bool = False, data_path: bool | str = True, token: str | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, data_path_hints: dict | None = None):
        if address is None and not etcd:
            etcd = os.environ.get("DLFS_ETCD") or None
        if etcd and address:
            raise InvalidArgument("give one daemon's address or a cluster's etcd, not both")
        if not etcd and not address:
            raise InvalidArgument("no daemon address given (HOST:PORT), and no etcd of a "
                                  "cluster (etcd=URL, or $DLFS_ETCD)")
        addresses = [] if etcd else daemon_addresses(address)
        if len(addresses) > 1:
            raise InvalidArgument(
                f"several daemons ({', '.join(addresses)}) form a cluster through etcd: start "
                "them with --etcd URL and use Client(etcd=URL) (docs/cluster.md)")
        if direct and etcd:
            raise InvalidArgument("direct=True reads one daemon's files; give its address")
        cluster = cluster or os.environ.get("DLFS_CLUSTER") or CLUSTER_DEFAULT
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.direct = direct
        self.addresses = tuple(addresses)
        # The keyword arguments that make another client like this one (Dataset.ticket).
        self.options = dict(timeout_s=timeout_s, batch_timeout_s=batch_timeout_s,
                            reconnect_timeout_s=reconnect_timeout_s, direct=direct,
                            etcd=etcd, cluster=cluster,
                            data_path=data_path, token=token, tls_ca=tls_ca, tls_cert=tls_cert,
                            tls_key=tls_key)
        options = dict(timeout_s=timeout_s, batch_timeout_s=batch_timeout_s,
                       reconnect_timeout_s=reconnect_timeout_s, token=token, tls_ca=tls_ca,
                       tls_cert=tls_cert, tls_key=tls_key)
        hints = dict(data_path_hints or {})
        # Where data-path replies land (None without a data path): one pool per
        # client, every member's replies recycle into it.
        self.reply_buffers: BufferPool | None = None
        if data_path:
            pool = self.reply_buffers = BufferPool()
            socket = "auto" if data_path is True else data_path

            def daemon(address: str) -> DaemonTransport:
                return DataPathTransport(address, pool=pool, socket=socket,
                                         hint=hints.get(address), **options)
        else:
            def daemon(address: str) -> DaemonTransport:
                return GrpcTransport(address, **options)
        self.transport: Transport
        if etcd:
            # A member that does not answer is failed over to a replica quickly.
            options["reconnect_timeout_s"] = min(reconnect_timeout_s, limits.failover_timeout_s)
            self.transport = ClusterRouter(daemon, ClusterView(etcd, cluster))
        elif direct:
            self.transport = DirectTransport(addresses[0], hint=hints.get(addresses[0]),
                                             **options)
        else:
            self.transport = daemon(addresses[0])
        self.address = self.transport.address

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"

    # --- datasets -------------------------------------------------------------

    def datasets(self) -> list[str]:
        """Names of the sealed datasets, sorted."""
        return [info.name for info in self.dataset_infos() if info.sealed]

    def dataset_infos(self) -> list[DatasetInfo]:
        """Summaries of all datasets, including ingests in progress (sealed=False).

        A cluster: the datasets etcd holds (with the changes in flight as
        unsealed), each saying which live members do not publish its version.
        """
        if isinstance(self.transport, ClusterRouter):
            state = self.transport.view.refresh()
            listings = self.transport.each(lambda member: member.control.list_datasets())
            if all(isinstance(r, DlfsError) for r in listings.values()):
                raise Unavailable(f"none of the DLFS daemons of {self.address} answers "
                                  f"({len(listings)} hold a lease in etcd)")
            return cluster_listing(state, listings)
        results = _sole_failure_raised(self.transport.each(
            lambda member: member.control.list_datasets()))
        if all(isinstance(r, DlfsError) for r in results.values()):
            raise Unavailable(f"none of the DLFS daemons {self.address} answers")
        return merged_listings(results)

    def dataset(self, name: str) -> Dataset:
        """Open dataset `name`.  Raises NotFound, InvalidArgument."""
        check_dataset_name(name)
        return Dataset(self, self.transport.dataset_info(name))

    def create_space(self, name: str) -> Space:
        """Create checkpoint space `name` (a tree of files programs write, durable when
        this returns) and return it.  Raises AlreadyExists (a dataset or space has the
        name), InvalidArgument, PermissionDenied (no admin token)."""
        space = Space(self, name)
        space._daemon().control.create_space(name)
        return space

    def space(self, name: str) -> Space:
        """Checkpoint space `name` (`dlfs.client.spaces`); NotFound if there is none."""
        space = Space(self, name)
        info = space.info()
        if info.kind != "space":
            raise NotFound(f"{name!r} is a dataset, not a checkpoint space (datasets are "
                           "read-only): `Client.create_space` makes one")
        return space

    def delete(self, name: str) -> DatasetInfo:
        """Remove the sealed dataset `name`, or checkpoint space `name` with every file in
        it, and free its space (on every member that has
        it), and nothing else: a parked ingest of the same name stays
        (`discard_ingest` ends it).

        A cluster: one etcd transaction deletes its record; every member
        removes its copy as it reads that (one that is down, when it starts
        again).  Raises NotFound, AlreadyExists (another change of it is in
        flight), Unavailable.  One daemon: raises NotFound (the daemon's
        message names an unsealed ingest of the name, if there is one).
        """
        check_dataset_name(name)
        if isinstance(self.transport, ClusterRouter):
            router = self.transport
            record = router.record(name)
            with ClusterChange(router.view, name, "delete", 0, record.members,
                               record.replicas) as change:
                change.begin(must_exist=True)
                change.commit(None)
            router.forget(name)
            router.view.refresh()
            return DatasetInfo(name, record.samples, record.bytes, True,
                               record.committed_unix_ns, 0, record.members, record.replicas,
                               generation=record.generation)
        return self._on_every_member(name, "deleted", lambda control: control.delete_dataset(name))

    def discard_ingest(self, name: str) -> DatasetInfo:
        """End the parked (broken-off, resumable) ingest of `name` and free its space, on
        every member that holds part of it, and nothing else: a sealed dataset of
        the same name stays.  Returns what it held (on one member).

        A cluster: every live member discards its part (a parked striped ingest
        is no change etcd decides).  Raises NotFound (no unsealed ingest of that
        name), FailedPrecondition (it is receiving or prepared: the message says
        what ends it), and Unavailable (a member did not answer: run it again
        once it is back).
        """
        check_dataset_name(name)
        return self._on_every_member(name, "discarded",
                                     lambda control: control.discard_ingest(name))

    def _on_every_member(self, name: str, done: str, call) -> DatasetInfo:
        """`call(control)` on every member; the first summary.  Members that hold nothing
        of `name` answer NotFound; the call raises the first other refusal, the
        daemons' NotFound when none holds anything, Unavailable when one did not
        answer."""
        results = _sole_failure_raised(self.transport.each(lambda member: call(member.control)))
        refused = [r for r in results.values()
                   if isinstance(r, DlfsError) and not isinstance(r, (NotFound, Unavailable))]
        if refused:
            raise refused[0]
        answered = [r for r in results.values() if isinstance(r, DatasetInfo)]
        down = [a for a, r in results.items() if isinstance(r, Unavailable)]
        if down:
            raise Unavailable(f"{name!r} was {done} on {len(answered)} daemon(s), but "
                              f"{', '.join(down)} did not answer: run it again once they are "
                              "back")
        if not answered:
            raise next(r for r in results.values() if isinstance(r, NotFound))
        return answered[0]

    def warm(self, name: str, *, wait: bool = False, timeout_s: float | None = None
             ) -> list[WarmInfo]:
        """Have every daemon holding dataset `name` read it into its page cache in the
        background (within its --warm-memory-share); one status per daemon.

        With `wait`, returns once every warm-up is done (or `timeout_s`
        passed).  A status with `fits` False says the dataset is larger than
        that daemon's budget (it is warmed up to it).  Raises NotFound.
        """
        check_dataset_name(name)
        infos = warmups.warm(self.transport, name)
        if wait:
            infos = warmups.wait(self.transport, name, timeout_s=timeout_s)
        return infos

    def warm_status(self, name: str) -> list[WarmInfo]:
        """The latest warm-up of dataset `name` on every daemon (state "none": never)."""
        check_dataset_name(name)
        return warmups.warm(self.transport, name, status_only=True)

    def ingest(self, source, name: str, *, replace: bool = False,
               include_hidden: bool = False, follow_symlinks: bool = False,
               skip_unreadable: bool = False,
               progress: bool | str | None = None, replicas: int = 1, archives: bool = False,
               readers: int = READERS_DEFAULT, resumable: bool = False, resume: bool = False,
               via: str = "auto", stats: IngestStats | None = None,
               max_rate: int | None = None) -> DatasetInfo:
        """Upload `source` as dataset `name`: a directory tree, a tar archive (plain or
        compressed; WebDataset shards too), a glob of archives, or a list of these.

        `archives`: directories name directories of archives.  `skip_unreadable`:
        leave out the files and directories of trees that cannot be read (else
        PermissionDenied, before anything is sent for a directory; for a file
        whose turn came, with the ingest parked when resumable).  `readers`:
        files read at once.  `resumable`: a broken-off ingest is kept on the
        daemon for `resume=True`.  `max_rate`: send at most so many bytes a
        second (None: as fast as it goes).  File selection rules: `dlfs.staging.tree_walk`
        and `dlfs.staging.tar_archive`; see also `upload`.
        """
        check_dataset_name(name)
        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        sources = open_sources([os.fspath(p) for p in paths], archives=archives,
                               include_hidden=include_hidden, follow_symlinks=follow_symlinks,
                               skip_unreadable=skip_unreadable)
        return self.upload(sources, name, replace=replace, progress=progress, replicas=replicas,
                           readers=readers, resumable=resumable, resume=resume, via=via,
                           stats=stats, max_rate=max_rate)

    def upload(self, source, name: str, *, replace: bool = False,
               progress: bool | str | None = None, replicas: int = 1,
               readers: int = READERS_DEFAULT, resumable: bool = False, resume: bool = False,
               via: str = "auto", stats: IngestStats | None = None,
               max_rate: int | None = None) -> DatasetInfo:
        """Upload a `walk_tree` report or a `dlfs.staging.source_set.SourceSet` as `name`.

        A cluster: the dataset is striped over its live members, each sample
        stored on `replicas` of them, committed by one etcd transaction
        (docs/cluster.md).
        """
        check_dataset_name(name)
        options = dict(progress=progress, readers=readers, resumable=resumable, resume=resume,
                       via=via, stats=stats, max_rate=max_rate)
        if isinstance(self.transport, ClusterRouter):
            try:
                return ingest_striped(self.transport, source, name, replace=replace,
                                      replicas=replicas, **options)
            finally:
                self.transport.forget(name)
        if replicas != 1:
            raise InvalidArgument(f"--replicas {replicas} needs as many daemons in a cluster "
                                  "(--etcd); one daemon was given")
        return upload_one(self.transport, name, source, replace=replace, **options)

    def rebalance(self, name: str, *, replicas: int | None = None,
                  progress: bool | None = None, members: Sequence[str] | None = None,
                  source: str | None = None) -> RebalanceReport:
        """Re-place dataset `name` on the cluster's live members, or on `members` (some of
        them), e.g. after adding or before removing one.

        Only copies whose holder changes cross the network; see
        `dlfs.client.cluster.rebalance`.  `source`: the address of a daemon
        holding a one-daemon dataset `name`, to stripe it over the cluster.
        Returns a `RebalanceReport`.  Raises InvalidArgument without a
        cluster, NotFound, Unavailable, AlreadyExists (another change of it
        is in flight).
        """
        check_dataset_name(name)
        if not isinstance(self.transport, ClusterRouter):
            raise InvalidArgument("rebalance places a dataset on a cluster's members: give the "
                                  "cluster's etcd (Client(etcd=URL), dlfs --etcd URL)")
        return rebalance(self.transport, name, replicas=replicas, progress=progress,
                         members=members, source=source)

    def status(self) -> DaemonStatus:
        """The daemon's health and counters (what `dlfs status` prints).

        A cluster: the first member that answers; see `statuses` and `members`.
        """
        return self.transport.call_any(lambda member: member.control.status())

    def statuses(self) -> dict:
        """Per daemon address: its DaemonStatus, or the error that reaching it raised
        (a cluster: every member registered in etcd)."""
        return self.transport.each(lambda member: member.control.status())

    def members(self) -> list:
        """A cluster's members as they registered in etcd (`MemberRecord`s: address,
        data port, capacity, version, state), sorted by address; [] for one daemon."""
        if not isinstance(self.transport, ClusterRouter):
            return []
        state = self.transport.view.refresh()
        return [state.members[address] for address in sorted(state.members)]

    def scrub(self, name: str, *, progress: bool | None = None) -> ScrubReport:
        """Verify every sample of dataset `name` on its daemons; report the damaged ones.

        Streams progress (a bar on a terminal when `progress` is None, for
        one daemon).  Raises NotFound.  Damaged samples are in the report,
        not raised.
        """
        check_dataset_name(name)
        show = (sys.stderr.isatty() if progress is None else progress) \
            and not isinstance(self.transport, ClusterRouter)
        results = _sole_failure_raised(self.transport.each(
            lambda member: scrub_member(member, name, show)))
        reports = [r for r in results.values() if isinstance(r, ScrubReport)]
        down = [a for a, r in results.items() if isinstance(r, Unavailable)]
        if down:
            raise Unavailable(f"cannot scrub {name!r} on {', '.join(down)}: not answering")
        if not reports:
            raise NotFound(f"no dataset named {name!r} on any daemon")
        return summed(reports)

    # --- samples --------------------------------------------------------------------

    def get_batch(self, keys: Iterable[SampleKey], *, dataset: str, verify: bool = True,
                  prefetch: Iterable[int] = (), out=None, generation: int = 0
                  ) -> list[memoryview]:
        """``client.dataset(dataset).get_batch(keys)`` without the lookup: samples by ids
        or paths of version `generation` (0: the current one; another version raises
        StaleGeneration, ids are per version).  One round trip; raises as
        `Dataset.get_batch`."""
        return self.transport.get_batch(batch_request(
            dataset, keys, verify=verify, prefetch=prefetch, generation=generation), out)

    def read(self, dataset: str, key: SampleKey, offset: int = 0, length: int = 0, *,
             verify: bool = True, generation: int = 0) -> memoryview:
        """`length` bytes (0: to the end) at `offset` of one sample of version
        `generation` (0: the current one), without the lookup; a whole sample is read
        as a batch of one.  One round trip; raises as `Dataset.read`."""
        if offset == 0 and length == 0:  # the whole sample: as a batch of one (unary call)
            return self.get_batch([key], dataset=dataset, verify=verify,
                                  generation=generation)[0]
        return self.transport.read_range(range_request(dataset, key, offset, length,
                                                       verify=verify, generation=generation))

    def read_chunks(self, dataset: str, key: SampleKey, offset: int = 0, length: int = 0, *,
                    verify: bool = True, generation: int = 0
                    ) -> Iterator[tuple[int, memoryview]]:
        """`Dataset.read_chunks` without the lookup: (position from `offset`, bytes)
        pieces as they arrive, of version `generation` (0: the current one)."""
        request = range_request(dataset, key, offset, length, verify=verify,
                                generation=generation)
        return self.transport.read_chunks(request)

    def extent_reader(self, dataset: str) -> DirectReader:
        """Dataset `dataset`'s extent files, mapped into this process (`direct=True`
        clients only): whole samples, checked parts and extent pieces read without a
        round trip (`DirectReader`).  The first call per dataset asks the daemon for
        them.  Raises FailedPrecondition (not a direct client, or the extents cannot be
        passed here), PermissionDenied, NotFound."""
        if not isinstance(self.transport, DirectTransport):
            raise FailedPrecondition("extent readers map a co-located daemon's extents: make "
                                     "the client with direct=True")
        return self.transport.extent_reader(dataset)

    def stat(self, dataset: str, path: str, *, generation: int = 0) -> Entry:
        """Metadata of a file or directory ("" is the dataset root) of version
        `generation` (0: the current one; another version raises StaleGeneration, as
        the sample id in the entry is only valid within its version)."""
        return metadata.stat(self.transport, dataset, path, generation)

    def listdir(self, dataset: str, path: str = "", *,
                page_size: int = limits.list_page_entries_default) -> Iterator[Entry]:
        """Entries of a directory in name order, fetched page by page."""
        return metadata.listdir(self.transport, dataset, path, page_size=page_size)

    def list_page(self, dataset: str, path: str = "", start_after: str = "",
                  page_size: int = limits.list_page_entries_default, *,
                  generation: int = 0) -> tuple[list[Entry], bool]:
        """One page of a directory: at most `page_size` entries after name
        `start_after`, in name order, and whether more follow, of version `generation`
        (as `stat`).  One round trip."""
        return metadata.list_page(self.transport, dataset, path, start_after, page_size,
                                  generation)


def _sole_failure_raised(results: dict) -> dict:
    """`results` of `transport.each`; raises the error when one daemon was asked and failed.

    With one daemon its own error (its message, its type) says the most;
    with several, the callers sum up who answered.
    """
    if len(results) == 1:
        (result,) = results.values()
        if isinstance(result, DlfsError):
            raise result
    return results
