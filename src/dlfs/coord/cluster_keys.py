"""The cluster's keys in etcd, the records under them, and one consistent read of them.

Under `/dlfs/CLUSTER/` (CLUSTER: `--cluster`, default "default"):

    id                  the cluster's identity (a random hex string, written once):
                        a daemon remembers it in its data dir and refuses an etcd
                        that holds another (or none), so an emptied etcd never
                        makes members delete what they store
    members/ADDRESS     a `MemberRecord`, attached to the member's lease: it
                        vanishes TTL seconds after the daemon stops renewing it
    datasets/NAME       a `DatasetRecord`: the committed generation of a striped
                        dataset, its member list (placement order) and replicas;
                        its mod revision is what the next change compares
    intents/NAME        an `IntentRecord`, attached to the coordinating client's
                        lease: a change of NAME in flight (one at a time per
                        name); it goes with the commit, or with the lease when
                        the client dies

Values are JSON (a few hundred bytes; a dataset's member list at most
`limits.members_max` addresses).  Everything per sample stays on the daemons.
"""

from __future__ import annotations

import dataclasses
import json

from dlfs.coord.etcd_grpc import KeyValue
from dlfs.errors import InvalidArgument

ROOT = "/dlfs/"
CLUSTER_DEFAULT = "default"


def cluster_prefix(cluster: str) -> str:
    """"/dlfs/CLUSTER/"; raises InvalidArgument for an empty name or one with '/'."""
    if not cluster or "/" in cluster or len(cluster) > 64:
        raise InvalidArgument(f"cluster name {cluster!r}: 1..64 characters, no '/'")
    return f"{ROOT}{cluster}/"


def id_key(prefix: str) -> str:
    return prefix + "id"


def member_key(prefix: str, address: str) -> str:
    return f"{prefix}members/{address}"


def dataset_key(prefix: str, name: str) -> str:
    return f"{prefix}datasets/{name}"


def intent_key(prefix: str, name: str) -> str:
    return f"{prefix}intents/{name}"


@dataclasses.dataclass(frozen=True)
class MemberRecord:
    """A daemon in the cluster, as it registered itself."""

    address: str  # its gRPC HOST:PORT: the member's identity in placements
    data_port: int  # its data path's TCP port on the same host (0: none)
    capacity_bytes: int  # size of the file system of its data dir
    free_bytes: int  # free there when it registered
    version: str  # dlfs version
    state: str = "serving"
    started_unix_ns: int = 0
    # Its lease's TTL (--member-lease-ttl-s): killed without a goodbye, it leaves the
    # member list at most this long after its last keepalive.
    lease_ttl_s: int = 0


@dataclasses.dataclass(frozen=True)
class DatasetRecord:
    """The committed version of a striped dataset: what readers resolve and members publish."""

    generation: int
    members: tuple[str, ...]  # placement order: holders are indices into it
    replicas: int
    samples: int
    bytes: int
    committed_unix_ns: int = 0


@dataclasses.dataclass(frozen=True)
class IntentRecord:
    """A change of a dataset in flight, held by one client until it commits or dies."""

    generation: int  # the version it prepares (0 for a delete)
    kind: str  # "ingest", "replace", "rebalance" or "delete"
    members: tuple[str, ...]
    replicas: int
    coordinator: str  # who runs it ("host pid N"), for messages


def encode(record) -> bytes:
    """A record as the JSON etcd holds."""
    return json.dumps(dataclasses.asdict(record), separators=(",", ":")).encode()


def decode(kind: type, value: bytes):
    """A record of dataclass `kind` from its JSON; unknown fields (a newer writer) are
    ignored.  Raises InvalidArgument for JSON that is not such a record."""
    try:
        fields = json.loads(value)
        known = {f.name for f in dataclasses.fields(kind)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()
                  if k in known}
        return kind(**values)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"a {kind.__name__} in etcd is damaged ({exc}): {value[:200]!r}")


@dataclasses.dataclass(frozen=True)
class ClusterState:
    """Everything under one cluster's prefix, read at one `revision`.

    `datasets`: name -> (record, its mod revision); `intents`: name ->
    (record, its create revision).  Cost to build: O(keys).
    """

    revision: int
    cluster_id: str
    members: dict[str, MemberRecord]
    datasets: dict[str, tuple[DatasetRecord, int]]
    intents: dict[str, tuple[IntentRecord, int]]

    @classmethod
    def parse(cls, prefix: str, kvs: list[KeyValue], revision: int) -> "ClusterState":
        members, datasets, intents = {}, {}, {}
        cluster_id = ""
        for kv in kvs:
            rest = kv.key[len(prefix):]
            kind, _, name = rest.partition("/")
            if rest == "id":
                cluster_id = kv.value.decode()
            elif kind == "members" and name:
                members[name] = decode(MemberRecord, kv.value)
            elif kind == "datasets" and name:
                datasets[name] = (decode(DatasetRecord, kv.value), kv.mod_revision)
            elif kind == "intents" and name:
                intents[name] = (decode(IntentRecord, kv.value), kv.create_revision)
        return cls(revision, cluster_id, members, datasets, intents)

    def dataset(self, name: str) -> DatasetRecord | None:
        found = self.datasets.get(name)
        return None if found is None else found[0]

    def intent(self, name: str) -> IntentRecord | None:
        found = self.intents.get(name)
        return None if found is None else found[0]
