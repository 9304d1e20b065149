"""The training floor: batch pipelines, shuffle-and-shard orders, fixed-size packing, the
timeline profiler. Uses only the client's public API.
"""
