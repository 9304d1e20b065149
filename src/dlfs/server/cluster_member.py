"""This daemon as a member of a cluster whose control plane is etcd (`dlfs-server --etcd`).

What it does (docs/cluster.md has the protocol):

- registers the daemon under `members/ADDRESS`, attached to a lease of
  `--member-lease-ttl-s` kept alive every third of it; a daemon killed
  without a goodbye leaves the member list when the lease expires, a
  clean stop revokes it at once;
- makes the daemon publish exactly what etcd says: every change under the
  cluster's prefix (a watch) makes it read the cluster's state and apply
  it (`reconcile`): a prepared generation is committed when
  `datasets/NAME` names it, aborted once `intents/NAME` no longer does
  (the coordinator aborted, or died and its lease took the intent); a
  striped dataset whose record is gone, or whose member list no longer
  names this daemon, is deleted here.  The same read runs every
  `limits.cluster_reconcile_interval_s` as a safety net, and after a
  restart before anything else;
- votes no (the ingest machine's `prepare_gate`) when it cannot reach
  etcd or the change's intent is gone: a member cut off from etcd keeps
  serving the generations it has and takes no new commits;
- refuses a call to this daemon alone that would replace or delete a
  striped dataset etcd places here (`change_gate`): members never
  disagree by a change etcd did not decide.

It never acts on a state read from another cluster: the cluster's `id` key
is remembered in the data dir (`cluster-id`) at the first join, and a
daemon whose etcd holds another id, or none, refuses to start.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import threading
import time

from dlfs import limits
from dlfs.coord import cluster_keys as keys
from dlfs.coord.etcd_grpc import Compare, EtcdClient, LeaseKeeper, Put
from dlfs.errors import DlfsError, FailedPrecondition, NotFound, Unavailable
from dlfs.server.config import ServerConfig
from dlfs.version import __version__

log = logging.getLogger(__name__)

CLUSTER_ID_FILE = "cluster-id"


class ClusterMember:
    """The daemon's membership and its follower of etcd's decisions.  Thread-safe.

    `store` is the daemon's Store, `address` the gRPC HOST:PORT others reach
    it at (its identity in placements), `data_port` its data path's TCP
    port (0: none).  `join` starts it, `leave` ends it.
    """

    def __init__(self, store, address: str, data_port: int, config: ServerConfig):
        self.store = store
        self.address = address
        self.data_port = data_port
        self.config = config
        self.prefix = keys.cluster_prefix(config.cluster)
        self.etcd = EtcdClient(config.etcd)
        self.cluster_id = ""
        self._keeper: LeaseKeeper | None = None
        self._watch = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._reconcile_lock = threading.Lock()
        self._etcd_reachable = True
        self._warned_stale: set[tuple[str, int]] = set()
        self._thread = threading.Thread(target=self._run, name="dlfs-cluster-member",
                                        daemon=True)

    # --- joining and leaving -------------------------------------------------------------

    def join(self) -> None:
        """Check the cluster's id, register, apply etcd's state once, then follow it.

        Raises Unavailable (etcd does not answer) and FailedPrecondition
        (the data dir belongs to another cluster).  Cost: a few round trips.
        """
        self.cluster_id = self._check_cluster_id()
        self._register()
        ingests = self.store.ingests
        ingests.prepare_gate = self.admit_prepare
        ingests.on_prepared = lambda _name, _generation: self._wake.set()
        ingests.change_gate = self.refuse_local_change
        self.reconcile()
        self._watch = self.etcd.watch(self.prefix, self._changed, self._broken)
        self._thread.start()
        log.info("joined cluster %r at %s as %s (lease TTL %d s)", self.config.cluster,
                 ",".join(self.etcd.endpoints), self.address, self.config.member_lease_ttl_s)

    def leave(self) -> None:
        """Stop following etcd and end the lease (the member leaves the list at once).
        Prepared ingests stay prepared on disk: the next start applies etcd's
        decision.  Never raises."""
        self._stopped.set()
        self._wake.set()
        ingests = self.store.ingests
        ingests.prepare_gate = None
        ingests.on_prepared = None
        ingests.change_gate = None
        if self._watch is not None:
            self._watch.stop()
        if self._thread.is_alive():
            self._thread.join(limits.etcd_call_timeout_s)
        keeper = self._keeper
        if keeper is not None:
            keeper.stop()
            self.etcd.revoke_lease(keeper.lease_id)
        self.etcd.close()

    def _check_cluster_id(self) -> str:
        """The cluster's id, created in etcd by the first member; checked against
        the data dir's (written at the first join)."""
        path = os.path.join(self.config.data_dir, CLUSTER_ID_FILE)
        remembered = ""
        if os.path.exists(path):
            with open(path) as f:
                remembered = f.read().strip()
        id_key = keys.id_key(self.prefix)
        found = self.etcd.get(id_key)
        if found is None and not remembered:
            created = secrets.token_hex(8)
            self.etcd.txn([Compare(id_key, "version", "==", 0)], [Put(id_key, created.encode())])
            found = self.etcd.get(id_key)
        current = found.value.decode() if found is not None else ""
        if remembered and current != remembered:
            raise FailedPrecondition(
                f"this data dir belongs to DLFS cluster {self.config.cluster!r} with id "
                f"{remembered}, but etcd at {','.join(self.etcd.endpoints)} holds "
                f"{'id ' + current if current else 'no such cluster'}: another or an emptied "
                "etcd.  Point --etcd at the cluster's etcd (a restored one keeps the id), or "
                f"start over with an empty --data-dir (or remove {path} to join this etcd "
                "with what the data dir holds)")
        if not remembered:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(current + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        return current

    def _register(self) -> None:
        """A new lease and the member record attached to it; a keeper renews it."""
        ttl = self.config.member_lease_ttl_s
        lease = self.etcd.grant_lease(ttl)
        disk = os.statvfs(self.config.data_dir)
        record = keys.MemberRecord(
            address=self.address, data_port=self.data_port,
            capacity_bytes=disk.f_blocks * disk.f_frsize, free_bytes=disk.f_bavail * disk.f_frsize,
            version=__version__, started_unix_ns=time.time_ns(), lease_ttl_s=int(ttl))
        self.etcd.put(keys.member_key(self.prefix, self.address), keys.encode(record), lease)
        self._keeper = LeaseKeeper(self.etcd, lease, ttl, on_lost=self._wake.set)

    # --- following etcd ---------------------------------------------------------------

    def _changed(self, _revision: int) -> None:
        self._wake.set()

    def _broken(self, error: Exception) -> None:
        if self._etcd_reachable:
            log.warning("lost the watch on etcd (%s); serving what this daemon has, taking "
                        "no new commits until etcd answers again", error)
        self._etcd_reachable = False

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(limits.cluster_reconcile_interval_s)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                if self._keeper is not None and self._keeper.lost.is_set():
                    log.warning("the member's lease was lost; registering again")
                    self._register()
                self.reconcile()
            except DlfsError as exc:
                if self._etcd_reachable:
                    log.warning("cannot read the cluster's state from etcd (%s); trying "
                                "again in %.0f s", exc, limits.cluster_reconcile_interval_s)
                self._etcd_reachable = False
            except Exception:  # noqa: BLE001 - the follower must outlive a bug in one round
                log.exception("applying etcd's state failed; trying again")

    def reconcile(self) -> None:
        """Read the cluster's state from etcd and apply it here (see the module doc).

        Raises Unavailable when etcd does not answer (nothing changes
        then).  Cost: one Range of the cluster's keys, plus the commits,
        aborts and deletes it applies.  Serialised: one at a time.
        """
        with self._reconcile_lock:
            kvs, revision = self.etcd.get_prefix(self.prefix)
            if not self._etcd_reachable:
                log.info("etcd answers again")
            self._etcd_reachable = True
            state = keys.ClusterState.parse(self.prefix, kvs, revision)
            if state.cluster_id != self.cluster_id:
                log.error("etcd now holds cluster id %r, not %r: applying nothing from it",
                          state.cluster_id, self.cluster_id)
                return
            self._apply_prepared(state)
            self._apply_published(state)

    def _apply_prepared(self, state: keys.ClusterState) -> None:
        ingests = self.store.ingests
        for name, generation in ingests.prepared():
            record, intent = state.dataset(name), state.intent(name)
            try:
                if record is not None and record.generation == generation:
                    ingests.commit_prepared(name, generation)
                    log.info("dataset %r generation %d: committed in etcd; published here",
                             name, generation)
                elif intent is None or intent.generation != generation:
                    ingests.abort_prepared(name, generation)
                    log.info("dataset %r generation %d: its change is gone from etcd "
                             "(aborted, or its coordinator's lease expired); discarded here",
                             name, generation)
            except NotFound:
                pass  # decided meanwhile by another round
            except (DlfsError, OSError) as exc:
                log.warning("could not apply etcd's decision on dataset %r generation %d: %s; "
                            "trying again", name, generation, exc)

    def _apply_published(self, state: keys.ClusterState) -> None:
        """Delete striped datasets etcd no longer places here."""
        for dataset in self.store.directory.all():
            cluster = dataset.cluster
            if cluster is None or dataset.generation < limits.cluster_generation_min:
                continue  # this daemon's own dataset: not the cluster's to decide
            record = state.dataset(dataset.name)
            if record is None or self.address not in record.members:
                why = ("deleted from the cluster" if record is None
                       else f"placed on {len(record.members)} other members")
                try:
                    self.store.delete(dataset.name)
                    log.info("dataset %r generation %d: %s in etcd; removed here",
                             dataset.name, dataset.generation, why)
                except (DlfsError, OSError) as exc:
                    log.warning("could not remove dataset %r (%s in etcd): %s", dataset.name,
                                why, exc)
            elif record.generation != dataset.generation:
                stale = (dataset.name, dataset.generation)
                if stale not in self._warned_stale:
                    self._warned_stale.add(stale)
                    log.warning("dataset %r: this member serves generation %d, etcd says %d "
                                "and holds no prepared copy of it here; readers use the "
                                "other replicas", dataset.name, dataset.generation,
                                record.generation)

    # --- the ingest machine's gate ---------------------------------------------------

    def admit_prepare(self, name: str, generation: int) -> None:
        """Pass if etcd holds the intent to change `name` to `generation` now.

        Raises Unavailable (etcd does not answer: a member cut off from etcd
        takes no new commits) or FailedPrecondition (the intent is gone: the
        coordinator aborted or died).  One round trip.
        """
        try:
            found = self.etcd.get(keys.intent_key(self.prefix, name))
        except Unavailable as exc:
            raise Unavailable(f"this member ({self.address}) cannot reach etcd, so it takes no "
                              f"new commits: {exc.message}") from None
        intent = keys.decode(keys.IntentRecord, found.value) if found is not None else None
        if intent is None or intent.generation != generation:
            raise FailedPrecondition(
                f"etcd holds no change of dataset {name!r} to generation {generation} (its "
                "coordinator stopped, or its lease expired); nothing was kept")

    def refuse_local_change(self, name: str, change: str) -> None:
        """Refuse to let dataset `name` be `change`d ("replaced", "deleted") by a call to
        this daemon alone while etcd places its striped version here: readers resolve
        it from etcd, so only a change etcd decides may touch it.

        Raises FailedPrecondition (with the command that changes it through the
        cluster) or Unavailable (etcd does not answer).  Free for a name that is
        not a striped dataset here; else one round trip.
        """
        dataset = self.store.directory.find(name)
        if dataset is None or dataset.cluster is None \
                or dataset.generation < limits.cluster_generation_min:
            return
        try:
            found = self.etcd.get(keys.dataset_key(self.prefix, name))
        except Unavailable as exc:
            raise Unavailable(f"dataset {name!r} is striped over cluster "
                              f"{self.config.cluster!r} and etcd does not answer, so it cannot "
                              f"be {change} here: {exc.message}") from None
        record = keys.decode(keys.DatasetRecord, found.value) if found is not None else None
        if record is None or self.address not in record.members:
            return  # etcd no longer places it here: this daemon's to remove
        urls = ",".join(self.etcd.endpoints)
        rm = shlex.join(["dlfs", "--etcd", urls, "--cluster", self.config.cluster, "rm", name])
        raise FailedPrecondition(
            f"dataset {name!r} is striped over cluster {self.config.cluster!r} (etcd holds its "
            f"version {record.generation}); it cannot be {change} on one member: change it "
            f"through the cluster (dlfs --etcd {urls} --cluster {self.config.cluster} ingest "
            f"--replace ..., or `{rm}`)")

    def before_ingest(self, name: str, generation: int) -> None:
        """A stream for `generation` of `name` arrives: apply etcd's decision now on
        an older prepared ingest of `name` (its intent is gone, or the new one could
        not exist), so that it does not hold the name.  Never raises."""
        if any(n == name and g != generation for n, g in self.store.ingests.prepared()):
            try:
                self.reconcile()
            except DlfsError as exc:
                log.warning("cannot apply etcd's state before an ingest of %r: %s", name, exc)
