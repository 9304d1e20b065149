"""Every bound DLFS enforces, in one place, each with the reason it exists.

Names put the unit last (`*_bytes_max`, `*_s`).  Server-side values that an
operator may tune are the defaults of `dlfs.server.config.ServerConfig`;
the rest are protocol constants that server, client and FUSE layer agree on.
The asserts at the bottom state how the limits relate; they run at import.
"""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# --- names and paths -------------------------------------------------------
# Dataset names appear in CLI arguments, file names of the data dir and mount
# points, so they are short and drawn from a portable alphabet.
dataset_name_bytes_max = 128
# Same bound as Linux PATH_MAX, so every sample path is reachable through FUSE.
path_bytes_max = 4096
# Same bound as Linux NAME_MAX for one path component.
path_component_bytes_max = 255

# --- batches and messages ---------------------------------------------------
# Samples per get_batch call.  Large enough for any training batch; small
# enough that a single request's plan (a few arrays of this length) is cheap.
batch_ids_max_default = 65536
# Bytes a single get_batch may return.  Bounds what one client can make the
# daemon read for one call; larger reads go through several calls.
batch_bytes_max_default = 2 * GiB
# Payload bytes carried by one streamed response message.  Several MiB keeps
# per-message overhead negligible (DESIGN.md: streaming 4 MiB messages is the
# fastest gRPC shape in Python).
chunk_bytes_default = 4 * MiB
# gRPC message ceiling on both sides: a chunk plus its id/offset arrays and
# framing.  Raised deliberately from gRPC's 4 MiB default.
message_bytes_max = 64 * MiB
# Paths per lookup / per page of a listing.
lookup_items_max = 65536
list_page_entries_max = 10000
list_page_entries_default = 1000

# --- storage -----------------------------------------------------------------
# Extent files are large so that a dataset has few of them (few open handles,
# few inodes) but bounded so that one lost file loses a bounded amount.
extent_bytes_max_default = 1 * GiB
# One sample never spans extents; a sample larger than the extent size gets
# an extent of its own.  This bounds what one ingested file may be.
sample_bytes_max = 64 * GiB
# Open extent file handles the daemon keeps cached (LRU).
open_extents_max_default = 512
# Catalog record payload ceiling: a torn length field must not make replay
# allocate gigabytes.
catalog_record_bytes_max = 64 * MiB
# Sample entries buffered before they are appended to the catalog as one record.
catalog_samples_per_record = 16384

# --- read engine -------------------------------------------------------------
# Long-lived reader threads.  The device queue depth comes from WILLNEED
# advice submitting a whole window's reads at once, not from thread count;
# more threads than this only add GIL hand-offs on a small machine (32
# threads measured 30-40% slower than 8 for cold 4 KiB batches on 2 cores).
reader_threads_default = 8
reader_threads_max = 1024
# Adjacent samples separated by at most this many unused bytes are read as
# one range (one pread instead of two; the gap is never sent to the client).
coalesce_gap_bytes_default = 0
# A coalesced range never exceeds this, so one range does not serialize a
# whole window onto a single reader thread.
range_bytes_max = 1 * MiB
# Below this many ranges a window is read inline by the RPC thread: handing
# two preads to the pool costs more than doing them.
inline_ranges_max = 2
# Windows of one get_batch stream read ahead of the one being sent.
read_ahead_windows = 2
# Prefetch hints waiting for the prefetch thread; more are refused (a hint
# that cannot be queued is dropped, never waited for).
prefetch_queue_max = 64

# --- daemon --------------------------------------------------------------------
# Concurrent RPCs the daemon admits; more are refused with RESOURCE_EXHAUSTED.
rpcs_concurrent_max_default = 256
# Threads serving RPCs (gRPC's server executor).
rpc_threads_default = 32
# Concurrent ingest sessions (each holds one open extent and buffers entries).
ingests_concurrent_max_default = 8
# Ingest stream: bytes per client message.
ingest_message_bytes = 1 * MiB

# --- client ---------------------------------------------------------------------
# Default deadline of a metadata call and of a get_batch call.
metadata_timeout_s_default = 30.0
batch_timeout_s_default = 120.0
# Ingest and delete may legitimately take long (a whole dataset).
ingest_timeout_s_default = 24 * 3600.0

assert chunk_bytes_default + 16 * MiB <= message_bytes_max
assert range_bytes_max <= chunk_bytes_default
assert ingest_message_bytes + 1 * MiB <= message_bytes_max
assert list_page_entries_default <= list_page_entries_max
assert reader_threads_default <= reader_threads_max
assert path_component_bytes_max < path_bytes_max
assert extent_bytes_max_default <= sample_bytes_max
