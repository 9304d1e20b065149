"""A cluster of daemons found in etcd: its view, routing by placement, striped
ingest, rebalance, and the etcd transaction that commits each change."""
