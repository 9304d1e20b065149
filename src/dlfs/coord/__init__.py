"""The cluster's control plane in etcd: the floor both the daemon and the client stand on.

Above the shared vocabulary and the byte formats, below the server and the
client (tests/test_layering.py: "coordination"): what both sides say to
etcd and how they read it, once.

- `etcd_grpc`: the etcd v3 client (KV, Watch, Lease over the stubs that
  scripts/gen_proto.py generates from dlfs/proto/etcd_api.proto); the only
  module here that imports grpc, and protobuf stops in it;
- `cluster_keys`: the key schema and the records under it (members,
  dataset generations, intents), and `ClusterState`, one consistent read
  of them.

Control state only: members, dataset generations with their member lists
and placement parameters, and the intents of running changes.  Per-sample
metadata (the sample directory, which member holds which sample) stays on
the daemons.  See docs/cluster.md.
"""
