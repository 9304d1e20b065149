"""Several daemons: routing by placement, striped ingest, rebalance, settle."""
