"""One change of a striped dataset, decided by one etcd transaction.

Every striped ingest, replace, rebalance and delete runs as a
`ClusterChange`:

1. `begin`: read the dataset's record (its mod revision R: 0 when there
   is none), take a lease of `limits.coordinator_lease_ttl_s` (kept alive
   from a thread) and create `intents/NAME` on it, only if no other change
   of NAME holds it (one change per name at a time);
2. the caller streams to the members, which prepare (durable, unpublished)
   only while the intent names their generation;
3. `commit`: one transaction: if the record's mod revision is still R and
   the intent is still ours, write the new record (or delete it) and the
   intent in one revision.  That is the decision; the members watch etcd
   and publish (or delete) what it says.  An answer lost on the way (etcd's
   leader killed, a timeout) is retried, and the record read back, for at
   most `limits.etcd_commit_retry_s`;
4. `abort` (or the client dying, which lets the lease expire): the intent
   goes, and every member discards what it prepared.

Nobody waits for a member that is gone: a member that is down at the
commit applies etcd's decision when it starts again.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from dlfs import limits
from dlfs.coord import cluster_keys as keys
from dlfs.coord.etcd_grpc import Compare, Delete, LeaseKeeper, Put
from dlfs.errors import AlreadyExists, DlfsError, FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)


class ClusterChange:
    """A change of dataset `name` in flight (see the module doc); `view` is the
    client's ClusterView.  Use as a context manager: leaving it without a
    commit aborts."""

    def __init__(self, view, name: str, kind: str, generation: int, members, replicas: int):
        self.view = view
        self.name = name
        self.intent = keys.IntentRecord(generation, kind, tuple(members), replicas,
                                        f"{socket.gethostname()} pid {os.getpid()}")
        self.record_key = keys.dataset_key(view.prefix, name)
        self.intent_key = keys.intent_key(view.prefix, name)
        self.previous: keys.DatasetRecord | None = None  # the record it replaces
        self._revision = 0  # the record's mod revision when it began (0: none)
        self._intent_revision = 0
        self._keeper: LeaseKeeper | None = None
        self.committed = False

    def __enter__(self) -> "ClusterChange":
        return self

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self.abort()

    def begin(self, *, replace: bool = True, must_exist: bool = False) -> "ClusterChange":
        """Read the record, take the lease, write the intent.

        Raises AlreadyExists (a record exists and not `replace`; or another
        change of the name holds the intent), NotFound (no record and
        `must_exist`), Unavailable (etcd does not answer).
        """
        etcd = self.view.etcd
        found = etcd.get(self.record_key)
        if found is not None and not replace:
            raise AlreadyExists(f"dataset {self.name!r} exists in the cluster; pass --replace "
                                "(replace=True) to replace it, or choose another name")
        if found is None and must_exist:
            raise NotFound(f"no dataset named {self.name!r} in cluster {self.view.cluster!r}")
        self._revision = found.mod_revision if found is not None else 0
        self.previous = keys.decode(keys.DatasetRecord, found.value) if found else None
        lease = etcd.grant_lease(limits.coordinator_lease_ttl_s)
        self._keeper = LeaseKeeper(etcd, lease, limits.coordinator_lease_ttl_s)
        held, revision = etcd.txn([Compare(self.intent_key, "version", "==", 0)],
                                  [Put(self.intent_key, keys.encode(self.intent), lease)])
        other = None if held else etcd.get(self.intent_key)
        if other is not None and other.lease == lease:
            # An attempt whose answer was lost had written it: the intent is ours.
            held, revision = True, other.create_revision
        if not held:
            self._release()
            who = keys.decode(keys.IntentRecord, other.value) if other is not None else None
            raise AlreadyExists(
                f"dataset {self.name!r} is being changed by another client"
                f"{f' ({who.coordinator}, a {who.kind})' if who else ''}; wait for it, or if "
                f"that client died, its change is dropped within "
                f"{limits.coordinator_lease_ttl_s} s (its lease in etcd)")
        self._intent_revision = revision
        return self

    def commit(self, record: keys.DatasetRecord | None) -> int:
        """Decide: write `record` (None: delete the dataset) if nothing changed since
        `begin` and the intent is still ours.  The revision of the decision.

        Raises FailedPrecondition (the dataset changed meanwhile, or our
        lease expired and the members aborted: nothing was kept) or
        Unavailable (etcd did not answer within `limits.etcd_commit_retry_s`;
        the outcome is then read back by the members themselves).
        """
        assert self._keeper is not None, "begin first"
        if self._keeper.lost.is_set():
            raise FailedPrecondition(f"the change of dataset {self.name!r} lost its lease in "
                                     "etcd before its commit; the members discarded it")
        compares = [Compare(self.record_key, "mod", "==", self._revision),
                    Compare(self.intent_key, "create", "==", self._intent_revision)]
        success = [Put(self.record_key, keys.encode(record)) if record is not None
                   else Delete(self.record_key), Delete(self.intent_key)]
        deadline = time.monotonic() + limits.etcd_commit_retry_s
        last: DlfsError | None = None
        while time.monotonic() < deadline:
            try:
                succeeded, revision = self.view.etcd.txn(compares, success)
            except Unavailable as exc:  # may have been applied: read back below
                last = exc
                succeeded, revision = False, 0
            if succeeded:
                self.committed = True
                self._release()
                return revision
            try:
                outcome = self._read_back(record)
            except Unavailable as exc:
                last = exc
                time.sleep(limits.etcd_reconnect_pause_s)
                continue
            if outcome is not None:
                self.committed = outcome > 0
                self._release()
                if self.committed:
                    return outcome
                raise FailedPrecondition(
                    f"dataset {self.name!r} changed in etcd during this change, or its lease "
                    "expired: nothing was kept; run it again")
            time.sleep(limits.etcd_reconnect_pause_s)  # the intent is ours: try again
        raise Unavailable(f"etcd did not answer the commit of dataset {self.name!r} within "
                          f"{limits.etcd_commit_retry_s:.0f} s ({last}); the members apply "
                          "whatever etcd decided once it answers")

    def _read_back(self, record: keys.DatasetRecord | None) -> int | None:
        """After a commit that did not say it succeeded: its revision (> 0) if it was
        applied, -1 if it can no longer be, None if it may still be tried."""
        etcd = self.view.etcd
        found = etcd.get(self.record_key)
        if record is not None and found is not None:
            current = keys.decode(keys.DatasetRecord, found.value)
            if current.generation == record.generation:
                return found.mod_revision
        intent = etcd.get(self.intent_key)
        mine = intent is not None and intent.create_revision == self._intent_revision
        if record is None and found is None and not mine:
            return max(1, self._intent_revision)  # deleted, and our intent went with it
        return None if mine and (found.mod_revision if found else 0) == self._revision else -1

    def abort(self) -> None:
        """Drop the intent (if still ours): the members discard what they prepared.  Never
        raises (an unreachable etcd lets the lease expire, with the same effect)."""
        if self._keeper is None:
            return
        try:
            self.view.etcd.txn([Compare(self.intent_key, "create", "==", self._intent_revision)],
                               [Delete(self.intent_key)])
        except DlfsError as exc:
            log.warning("could not drop the change of %r in etcd (%s); its lease ends it "
                        "within %d s", self.name, exc, limits.coordinator_lease_ttl_s)
        self._release()

    def _release(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
            self.view.etcd.revoke_lease(keeper.lease_id)
