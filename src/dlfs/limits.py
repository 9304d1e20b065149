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
# Batches of at most this many samples are first asked for as one unary
# GetSmallBatch call (falling back to the GetBatch stream when the reply
# exceeds one message): per-call overhead dominates such batches.
small_batch_samples_max = 16
# Bytes a Lookup reply's entry takes besides its name and path (an estimate
# on the high side: ids, sizes, modes, times, framing), to refuse a reply
# that would not fit one message before it is built.
entry_reply_bytes = 64
# Samples one dataset (one ingest) may hold: the daemon keeps every sample's
# metadata in memory (about 220 bytes each, so 100 M samples take ~22 GB);
# larger collections are several datasets.
dataset_samples_max = 100_000_000
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
# Samples longer than this get a CRC32C per block of this many bytes (from the
# sample's start) besides the whole-sample one, so a part of a large sample
# (a ReadRange, a FUSE read of a large file) is verified without reading the
# rest.  Equal to the mount's read unit, so every unit it fetches is one block;
# 4 bytes per MiB of metadata (4 KiB per GiB of large samples).
crc_block_bytes = 1 * MiB
# Open extent file handles the daemon keeps cached (LRU).
open_extents_max_default = 512
# Catalog record payload ceiling: a torn length field must not make replay
# allocate gigabytes.
catalog_record_bytes_max = 64 * MiB
# The catalog is compacted at start when records of deleted, replaced or
# aborted datasets exceed both the live records and this many bytes.
catalog_compact_dead_bytes_min = 16 * MiB
# Sample entries buffered before they are appended to the catalog as one record.
catalog_samples_per_record = 16384
# Block CRCs buffered before the entries are appended (a BLOCKS record of
# 4 bytes each must stay far below catalog_record_bytes_max: 1 TiB of large
# samples per record).
catalog_block_crcs_per_record = 1 << 20

# --- checkpoint spaces (dlfs.server.write) ---------------------------------------
# A file of a space is read as a sample, so it is bounded as one.
space_file_bytes_max = sample_bytes_max
# File versions the daemon keeps in all its spaces: each is a one-sample version
# that every data path worker maps (a memfd mapping each, below vm.max_map_count's
# default of 65530 with room for the rest), and a few KiB of the directory.
space_files_max_default = 20000
# Files being written at once in all spaces (each holds two 4 MiB buffers, an
# extent and a connection while it is open).
space_drafts_max_default = 256
# A data path write frame's data at most (the mount's max_write is 1 MiB).
space_write_data_bytes_max = 1 * MiB
# A file open for writing whose connection carries nothing this long is dropped
# (what it received since its last fsync is lost, as for a writer that died).
space_draft_idle_timeout_s = 3600.0
# Entries of a space's directory listed in one page.
space_list_page_entries_max = 4096

# --- warm-up ------------------------------------------------------------------
# Share of the daemon's memory (the machine's, or its cgroup limit) that
# dataset warm-ups may fill with page cache together: most of it, since the
# page cache is what makes the first epoch fast, but not all, so the daemon,
# the training processes and the kernel keep room.  0 turns warm-ups off.
warm_memory_share_default = 0.5
warm_memory_share_max = 0.9
# One warm-up read: large, so the device sees sequential reads of many MiB.
warm_read_bytes = 8 * MiB
# The last bytes before a warm-up's budget ends, read with the kernel's read-ahead off
# (it runs up to two windows, 2 x 8 MiB on a virtio disk, past what is read).
warm_advised_tail_bytes = 32 * MiB
# Warm-ups waiting for the warm-up thread; more are refused (`dlfs warm`) or
# skipped (a first read).
warm_queue_max = 16
# How often `dlfs warm` asks for progress while it waits.
warm_poll_s = 0.1

# --- read engine -------------------------------------------------------------
# Long-lived reader threads: by default one per CPU, within these bounds.  The
# device queue depth comes from WILLNEED advice submitting a whole window's
# reads at once, not from thread count; a reader thread waits for advised
# pages and copies them, so threads beyond the CPUs only add GIL hand-offs
# (docs/DESIGN.md, "Read engine", has the figure).
reader_threads_default_min = 2
reader_threads_default_max = 8
reader_threads_max = 1024
# A window's cold pieces are split among at most one reader thread per this many
# bytes: a share waits for pages the advice already asked for and copies them, so
# a small one costs more in thread wake-ups and GIL hand-offs than it overlaps
# (measured on 2 cores: log-datapath.md).
reader_share_bytes_min = 512 * KiB
# Once a data-path reply's window missed the page cache, the daemon advises
# this many bytes of the reply beyond it, so the device reads ahead while
# windows are sent (a reply is read and sent one window at a time).
datapath_advise_ahead_bytes = 64 * MiB
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
# Bytes of read windows the daemon holds at once over all streams (each
# stream holds up to read_ahead_windows + 1 chunks); beyond it, reads wait.
inflight_bytes_max_default = 1 * GiB
# Longest a read waits for that budget before it is refused (Overloaded).
budget_wait_s_max = 30.0
# HTTP/2 streams (concurrent calls) one client connection may open.
streams_per_connection_max_default = 64
# Kernels read at most their read-ahead size (128 KiB by default) per
# WILLNEED advice call, so larger ranges are advised in pieces of this size.
willneed_chunk_bytes = 128 * KiB
# RWF_NOWAIT probes of a window (daemon) or a batch (co-located client) before
# it is deemed cold: when none of the first this many hit the page cache, the
# rest are not probed one syscall each but advised and read from the device.
nowait_probe_pieces = 16
# Submission slots of a thread's io_uring (dlfs/server/read/uring.py): the reads one system
# call submits at most (a 4 MiB window of 4 KiB samples is 1,024 pieces).  A
# ring costs about 100 KiB of kernel memory (64-byte entries, a completion
# queue twice as long); each thread that reads such windows has one.
uring_entries = 1024
# Windows of fewer pieces are read one preadv per piece: below this the
# submission's fixed cost (its numpy) is more than the per-call costs it
# saves; with four batches in flight the submission also spares the GIL
# hand-offs (docs/DESIGN.md, "One submission per window of small pieces").
uring_pieces_min = 64
# Data path windows sent by sendfile from the page cache (server/read/sendfiles.py,
# --sendfile): pieces must average at least this many bytes (one system
# call per piece; 4 KiB pieces measured slower than one read and one send),
# and a window of more pieces than the bound goes the read path (its
# residency check is one cachestat call per piece).
sendfile_piece_bytes_min = 64 * KiB
sendfile_pieces_max = 256
# Data path windows of small pieces sent from read-only mappings of the extents
# (server/read/mapped_sends.py, --mapped-sends) when every page is cached.  Which
# pages of a mapped extent are cached is scanned again after `mapped_recheck_s`
# (one mincore over the extent), and all scans together
# take at most `mapped_check_share` of the time (bursts of `mapped_check_burst_s`).
mapped_recheck_s = 0.5
# Windows of fewer samples take the read path: a few reads cost little, and mapping
# a whole extent for them (the tail of a reply of large samples) would not pay.
mapped_pieces_min = 16
mapped_check_share = 0.02
mapped_check_burst_s = 0.05
# An extent the page cache holds this share of is mapped with its page tables
# filled at once (reading the rest: at most 1% of 1 GiB).
mapped_cached_share_min = 0.99
# A mapping unused this long is unmapped: pages a process maps count in its RSS
# and survive drop_caches, so an idle daemon must hold none (bench/measure.py
# waits this long, and one sweep more, before it drops the page cache).
extent_map_idle_s = 1.0
# Bytes of extents one process maps at most (its page tables cost about 2 MiB per
# GiB mapped, its scans' answers 1.25 MiB); windows of extents beyond it take
# the read path.
mapped_bytes_max = 16 * GiB
# Prefetch hints waiting for the prefetch thread; more are refused (a hint
# that cannot be queued is dropped, never waited for).
prefetch_queue_max = 64

# --- daemon --------------------------------------------------------------------
# Concurrent RPCs the daemon admits; more are refused with RESOURCE_EXHAUSTED.
rpcs_concurrent_max_default = 256
# Threads serving RPCs (gRPC's server executor).
rpc_threads_default = 32
# Of those, kept for calls that end quickly (metadata, Status, health): long
# calls (streamed reads, ingests) may hold the rest, no more, so a daemon
# whose clients stall still answers probes and lookups.
rpc_threads_reserved = 8
# Long calls one client host may hold at once.
streams_per_client_max_default = 16
# A long gRPC call that sends or receives nothing for this long is cancelled
# (the client stopped reading, or an ingest stopped sending): its thread and
# buffers come back.
stream_stall_timeout_s_default = 60.0
# And a streamed read has a deadline as a whole: the stall timeout plus the
# bytes it sent at this rate (a client that reads a message now and then
# must not keep its thread and ticket for ever).
stream_bytes_per_s_min = 1 * MiB
# A gRPC connection's handshake must be done this soon from its accept: the
# client's HTTP/2 preface and SETTINGS at the daemon's door (server/grpc/door.py),
# and the TLS handshake too, where gRPC does it (gRPC's own default is 120 s).
grpc_handshake_timeout_s = 10.0
# Connections at the gRPC door whose preface and SETTINGS have not arrived (a
# descriptor each, nothing else) have a budget of their own, in all and per client
# host; a new one over either evicts the oldest (of its host, else of all), so an
# idle flood costs itself its slots and never takes one a client needs.
grpc_handshakes_max = 128
grpc_handshakes_per_peer_max = 32
# A client's first SETTINGS frame at most (gRPC's send 6 to 8 settings, 6 bytes each).
grpc_settings_bytes_max = 1 * KiB
# gRPC connections past their handshake (three descriptors and two relay threads
# each) the daemon holds at once; one client host holds at most its share of them
# (--grpc-connections-per-peer-max; datapath_peer_share of them by default).  A new
# one at either bound evicts the oldest that has made no call yet (of its host,
# else of all), else it is refused; one with no call for grpc_connection_idle_s is
# closed by gRPC (clients reconnect at their next call).
grpc_connections_max_default = 1024
grpc_connection_idle_s = 300.0
# A relay thread's buffer (HTTP/2 frames are 16 KiB unless a peer allows more).
grpc_relay_buffer_bytes = 64 * KiB
# The debug text of the GOAWAY that tells a refused client why, at most.
grpc_refusal_text_bytes_max = 512
# How often the watchdog looks for such calls.
call_watchdog_interval_s = 1.0
# Concurrent ingest sessions (each holds one open extent and buffers entries).
ingests_concurrent_max_default = 8
# --- the cluster's control plane in etcd (dlfs.coord, docs/cluster.md) ------------
# A call to etcd gives up (Unavailable) after this long, having tried every
# endpoint in turn, each attempt for at most etcd_attempt_timeout_s: a member
# whose leader was just killed holds a write until its own 5 s timeout, while a
# new leader is elected within a second (etcd's election timeout).
etcd_call_timeout_s = 5.0
etcd_attempt_timeout_s = 1.0
# etcd refuses a request over 1.5 MiB (its --max-request-bytes default); a
# record DLFS writes (a member, a dataset's generation and member list, an
# intent) stays well below, so a transaction of several fits.
etcd_value_bytes_max = 512 * KiB
# A member's lease: a daemon killed without a goodbye leaves etcd this long
# after its last keepalive, and readers route around it at once then.  Its
# keepalives go every third of it (daemon setting --member-lease-ttl-s).
member_lease_ttl_s_default = 5
# A striped ingest or replace that finds a member silent waits at most its lease's
# TTL and this long for it to leave the member list (etcd's expiry runs late by
# about a keepalive's round trip) or answer again.
silent_member_wait_margin_s = 2.0
# etcd grants no lease shorter than this (its minimum TTL with default timings).
member_lease_ttl_s_min = 2
# The lease of a client that coordinates a striped ingest, replace, rebalance
# or delete (its intent key): if the client dies, the intent goes with the
# lease this long after its last keepalive and every member aborts.
coordinator_lease_ttl_s = 10
# A member reads the whole cluster state from etcd at least this often, even
# with no watch event (a safety net under the watch; a read is one Range).
cluster_reconcile_interval_s = 10.0
# A watch or keepalive stream that broke is opened again after this pause.
etcd_reconnect_pause_s = 0.2
# A commit whose answer was lost (etcd leader killed, a timeout) is retried
# until etcd answers, at most this long; then its outcome is read back.
etcd_commit_retry_s = 30.0
# After its commit a coordinator waits at most this long for the members to
# publish the new version (they watch etcd: milliseconds) before it returns.
cluster_publish_wait_s = 30.0
# A cluster reader that asks a member for a version it has not yet published
# (the commit is in etcd; the member applies it from its watch) retries this
# long, in at most this many attempts.
striped_settle_s = 11.0
striped_settle_attempts_max = 40
# Resumable ingests (IngestStart.resumable): a running one checkpoints (its
# extents fsync'ed, then a CHECKPOINT catalog record, synced) after this many
# bytes or seconds, whichever comes first: what a daemon killed mid-ingest
# keeps.  A stream that breaks off while the daemon runs checkpoints at once.
# Daemon settings --ingest-checkpoint-bytes and --ingest-checkpoint-interval-s.
ingest_checkpoint_bytes = 256 * MiB
ingest_checkpoint_interval_s = 10.0
# A parked ingest (resumable, broke off) not resumed within this is discarded
# (daemon setting --resumable-ingest-timeout-s); `dlfs discard NAME` ends it sooner.
resumable_ingest_timeout_s_default = 24 * 3600.0
# An ingest asks the kernel to start writing its extent back after this many
# bytes (sync_file_range), so the fsync of a checkpoint or of the seal finds
# little left to write and dirty pages never pile up.
ingest_writeback_bytes = 32 * MiB
# Daemons that hold each sample of a striped dataset, at most.
replicas_max = 8
# Generations a striped ingest names are at least this: apart from the dataset
# ids one daemon hands out (which stand in as generations for its own datasets).
cluster_generation_min = 1 << 62
# Daemons one striped dataset may span (member indices are u16).
members_max = 4096
# How often the daemon's main thread checks for a stop signal.
shutdown_poll_s = 0.1
# Ingest stream: bytes per client message.
ingest_message_bytes = 1 * MiB
# An ingest capped with --max-rate (`dlfs.staging.pace`): the least cap accepted
# (below it an ingest of any size would take days), and how much a sender
# that fell behind its pace may send at once to catch up, in seconds' worth.
ingest_rate_min = 64 * KiB
ingest_rate_burst_s = 0.1
# Request ids (`x-request-id` metadata, see dlfs.logs): longer ones from a
# caller are replaced, so one id is one grep-able token of bounded size.
request_id_chars_max = 64
# An RPC that takes longer than this is logged as a warning with its id.
slow_rpc_log_s = 2.0

# --- data path (dlfs/proto/datapath.md) ---------------------------------------
# Connections one daemon's data path serves at once (authenticated: past
# HELLO): each holds a thread, and a window buffer while it sends a window.
# More are refused at HELLO.
datapath_connections_max_default = 256
# The share of the served connections and of the window buffers one peer (a
# client host over TCP, a client process on the Unix socket) may hold, so
# that a few stalled or greedy peers leave the rest for everyone else.
# --datapath-connections-per-peer-max overrides it for connections.
datapath_peer_share = 0.5
# A connection that sends no request for this long is closed; clients open
# a new one at their next read.
datapath_idle_timeout_s_default = 300.0
# A reply that makes no progress for this long (the client stopped reading)
# is abandoned and its connection closed.
datapath_stall_timeout_s_default = 30.0
# And a reply as a whole must be sent by a deadline: the stall timeout plus
# its payload at this rate, so a client that reads a byte now and then does
# not keep its thread and connection for ever.
datapath_reply_bytes_per_s_min = 1 * MiB
# The handshake as a whole (accept to the end of HELLO) must take at most
# this long, however its bytes trickle in.
datapath_hello_timeout_s = 10.0
# Connections not yet past HELLO (unauthenticated) have a budget of their
# own, apart from the served connections: at most this many at once, and
# this many from one peer.  A new connection over either evicts the oldest
# such connection (of its peer, else of all): a flood of them costs each
# other their time, never an authenticated client its slot.
datapath_handshakes_max = 128
datapath_handshakes_per_peer_max = 32
# A request frame must arrive whole this soon after its first byte (the
# idle timeout bounds the wait for that first byte).
datapath_request_timeout_s = 10.0
# So must each frame of an ingest on the data path (a PIECE holds at most
# `ingest_message_bytes` of data): a peer that trickles one cannot hold its
# ingest's session, connection and reserved space for ever.  A paced ingest
# (--max-rate, staging/pace.py) paces the reads between frames, not a frame.
datapath_piece_timeout_s = 10.0
# A window buffer waits at most this long on a client that is slow to make
# room in its socket; then it goes back to the pool and the reply waits for
# the client without one (and reads the rest of the window again once the
# client made room): a client that stops reading holds no buffer.
datapath_buffer_hold_s = 0.1
# An accept loop that runs out of descriptors or kernel memory (EMFILE,
# ENFILE, ENOBUFS, ENOMEM) tries again after this long, doubling up to the
# most, and meanwhile refuses the waiting connections with an ERROR that
# says why (through a descriptor it keeps in reserve).
datapath_accept_backoff_s_min = 0.01
datapath_accept_backoff_s_max = 0.5
# Failed accepts less than this apart are one episode: logged once when it
# starts and once when accepts succeed again (a daemon at its descriptor
# limit flaps between the two; the log must not).
datapath_accept_episode_s = 30.0
# Before closing a connection the daemon reads what the client still sends,
# at most this much for at most this long, so its last ERROR frame is not
# lost to a reset.  An ERROR to a connection that never authenticated is
# sent within the send bound and not drained for.
datapath_drain_bytes_max = 1 * MiB
datapath_drain_s = 1.0
datapath_error_send_s = 1.0
# Largest request frame body: a GET_BATCH of batch_ids_max ids and as many
# hint ids (8 bytes each), plus the dataset name and a request id.  A daemon
# with another --batch-ids-max takes 16 bytes per id of it, and says so at
# WELCOME (datapath_frames.request_bytes_max).
datapath_request_fixed_bytes_max = 4 * KiB
datapath_request_bytes_max = 16 * batch_ids_max_default + datapath_request_fixed_bytes_max
# Largest BATCH frame body (12 bytes per sample) a client accepts from a
# daemon that did not tell its limits at WELCOME.
datapath_reply_fixed_bytes_max = 1 * KiB
datapath_reply_header_bytes_max = 12 * batch_ids_max_default + datapath_reply_fixed_bytes_max
# Tokens in HELLO, and the message of an ERROR frame.
datapath_token_bytes_max = 4 * KiB
datapath_error_bytes_max = 16 * KiB
datapath_error_frame_bytes_max = datapath_error_bytes_max + 1 * KiB
# Window buffers the data path keeps for reuse across requests (each is
# chunk_bytes); a request beyond them waits for one, within its deadline.
datapath_buffer_bytes_max_default = 512 * MiB
# Worker processes that serve the data path (--datapath-workers): at most
# this many per daemon (beyond the CPUs there are they only add memory).
datapath_workers_max = 256
# A worker's control messages (publish, remove, stats, hand-offs) are small
# JSON objects with a few descriptors; larger ones are refused, not sent.
worker_control_message_bytes_max = 128 * KiB
# Descriptors one control message carries (one publish: one index).
worker_control_fds_max = 4
# A started worker must serve (its interpreter up, every dataset mapped)
# within this, or it is killed and started again; the daemon's start waits
# for its first workers this long.
worker_start_timeout_s = 60.0
# A replace or delete is acknowledged once every serving worker applied it;
# a worker that has not within this is killed (its replacement starts from
# the current state), so a stuck worker cannot hold a replace up forever.
worker_ack_timeout_s = 10.0
# `dlfs status` and a metrics scrape ask every worker for its counters and
# wait this long for the answers (a late one is counted with its last figures).
worker_stats_timeout_s = 2.0
# A worker that died is started again after this pause, doubled after each
# death within worker_stable_s of its start, up to the maximum: a worker
# that cannot start does not spin.
worker_restart_backoff_s = 0.2
worker_restart_backoff_s_max = 10.0
worker_stable_s = 10.0
# A stopping daemon gives its workers this long to close their connections
# and exit before it kills them.
worker_stop_grace_s = 5.0
# Longest a client waits to connect to a data path (the gRPC channel to the
# same daemon answered, so a slow connect means a blocked port).
data_connect_timeout_s = 5.0
# Descriptors passed in one FDS frame (the kernel takes at most 253 per message).
datapath_fds_per_frame_max = 250
# Samples whose block CRCs a co-located reader (Client(direct=True)) keeps, to check
# parts of large samples it reads from the mapped extents (4 bytes per MiB each).
direct_block_crc_samples_max = 65536
# A data connection that stays silent this long while a reply is due (or a
# handshake) is taken for a hung worker: the call goes on at once on a new
# connection, which the daemon's kernel hands to a worker that accepts.  Each
# stall of the call doubles the bound, so a daemon that is only slow gets longer.
# A live worker sends a reply's header before it reads a byte of the samples.
data_reply_stall_s = 5.0
# Data connections one client process keeps to one daemon (one request in
# flight on each); callers beyond that wait for a free one.
data_connections_max = 64
# A client whose data connection the daemon refused with Overloaded at HELLO
# (its connection limit, its share for this client, out of descriptors)
# reads through gRPC and tries the data path again after this long.
data_overloaded_retry_s = 1.0
# Connections a client tries in a row when one of a daemon's serving processes
# refused it for its own share of a split limit (Overloaded.split): the kernel hands
# each new connection to the next process waiting, and another may have room.
# The processes the refusal names plus one, and at most this many.
data_split_refusal_tries_max = 64
# Prefetch hints a client sends on one data connection without reading their
# replies yet (`Dataset.prefetch` returns at once); each reply is one small
# BATCH frame, read before the connection's next request.
datapath_hints_unanswered_max = 8
# Reply buffers without a caller's `out`: size classes start here, and a
# client keeps at most this many bytes of returned ones for reuse.
reply_buffer_bytes_min = 64 * KiB
reply_buffer_pool_bytes_max = 1 * GiB

# --- client ---------------------------------------------------------------------
# The port of a daemon address given without one ("localhost", "[::1]"):
# dlfs-server's default --listen port.
daemon_port_default = 7010
# How long a call retries a daemon this process has never reached before it
# raises Unavailable (a connect that timed out, a name not resolved): it fails
# as fast from Python as from the CLI.  A refused connection (nothing listens)
# to such a daemon is not retried at all.  One reached before is waited for
# up to `reconnect_timeout_s` (it is restarting).
first_contact_timeout_s = 2.0
# A member daemon that failed with UNAVAILABLE is skipped this long before a
# multi-daemon client tries it again (a daemon that is back is used again).
member_down_s = 5.0
# How long a multi-daemon client retries an unreachable member before it
# fails over to a replica: short, because the replica is right there.
failover_timeout_s = 1.0
# Calls a multi-daemon client runs at once (parts of batches, hints).
cluster_calls_in_flight_max = 64
# Pieces buffered per member while a striped ingest streams to it.
ingest_queue_pieces_max = 64
# Longest pause between a channel's attempts to reach a daemon that is down.
# gRPC's default grows to two minutes (shared by every channel to the same
# address), so a daemon back after a long outage would stay unreachable for
# minutes; this bounds it to half a second, well inside the shortest retry
# window (a mount's 1-5 s), so a restarted daemon is reached on the next try.
reconnect_backoff_max_s = 0.5
# How long read calls retry an unreachable daemon before raising Unavailable.
reconnect_timeout_s_default = 10.0
# Pauses between attempts of a call that failed with UNAVAILABLE (the last
# repeats): short at first, so a daemon restarting on the same port is
# reached within tens of milliseconds of coming back.
retry_backoff_s = (0.05, 0.1, 0.2, 0.5, 1.0)
# Attempts of one call at most, whatever the time bound: a bound that does
# not depend on the clock, so a clock that stands still cannot loop forever.
call_attempts_max = 64
# Default deadline of a metadata call and of a get_batch call.
metadata_timeout_s_default = 30.0
batch_timeout_s_default = 120.0
# Ingest and delete may legitimately take long (a whole dataset).
ingest_timeout_s_default = 24 * 3600.0
# The `dlfs` command's retry window for an unreachable daemon: a person waits.
cli_reconnect_timeout_s = 2.0
# After Ctrl-C during `dlfs ingest`: how long the command waits for the daemon
# to park what it received (it notices the closed stream within milliseconds)
# before it says what was kept.
cli_park_wait_s = 5.0

# --- FUSE mount: concurrency -------------------------------------------------
# Blocking client calls running in worker threads at once.  Handlers await
# them, so the trio loop keeps serving other requests; the bound keeps a burst
# of cold reads from opening hundreds of threads and streams.  Well below the
# daemon's rpcs_concurrent_max_default so one mount cannot exhaust it alone.
mount_rpcs_in_flight_max = 64
# Page-cache pushes (notify_store) running in threads at once: each is a
# memory copy in the kernel, so a few keep both cores busy.
mount_stores_in_flight_max = 4
# Asynchronous requests (read-ahead of several files and readers) the kernel
# keeps in flight to the mount (FUSE max_background; the kernel's default is
# 12).  Synchronous reads are not counted; each request waiting for the
# daemon is a trio task, so many in flight cost little.
mount_background_requests_max = 64
# The kernel's read-ahead window for files of the mount (the FUSE bdi's
# read_ahead_kb, set at mount time when this process may write it; the
# kernel's default is 128 KiB).  Sequential readers of large files (np.load
# of a volume, 1 MiB reads) then get 1 MiB READs several at a time instead
# of one READ per read() call: fewer READs and more bandwidth for NPZ volumes
# read in 256 KiB reads (log-fuse.md).  Random
# readers are unaffected: the kernel grows the window only for sequential ones.
mount_kernel_read_ahead_bytes = 8 * MiB
# libfuse worker threads reading /dev/fuse.  They answer requests that need
# no Python (ioctl, flush) in C, reads of small files themselves (blocking
# on the daemon, fuse/wholereads.py), and hand the rest to the trio thread:
# enough that 8 readers of small files still leave threads for the rest.
mount_fuse_threads_max = 16
# Splice READs of a co-located mount (fuse/splicereads.py): a pipe holds one READ's
# reply, header page included, so twice the kernel's largest READ (1 MiB).  One pipe
# per message in flight: one per libfuse worker thread, and one more for the page
# push, whose store can wait for a page lock that only a READ's reply releases (so
# READs must never wait for the push's pipe).  Kernel memory: count x bytes.
mount_splice_pipe_bytes = 2 * MiB
mount_splice_pipes_max = mount_fuse_threads_max + 2

# --- FUSE mount: data --------------------------------------------------------
# Samples up to this size are fetched whole, with their CRC32C verified, on the
# first read; larger files are read in units (below).  Covers images, audio clips
# and small arrays in one round trip.
mount_whole_sample_bytes_max = 8 * MiB
# Larger files are cut into units of this size.  A random read (an h5py chunk,
# an mmap page fault) fetches only the units it touches, so it does not pay
# for a large window it will not use.
mount_read_unit_bytes = 1 * MiB
# A sequential reader fetches runs of units, up to this many bytes per
# ReadRange call: large enough that per-RPC cost is small against transfer
# time (DESIGN.md: gRPC moves data fastest in messages of several MiB).
mount_read_run_bytes_max = 16 * MiB
# How far ahead of a sequential reader runs are kept in flight, so the next
# RPC overlaps the kernel's consumption of the current one.
mount_read_ahead_bytes = 32 * MiB
# Fetched bytes held until the kernel has taken them (it then keeps them in
# the page cache).  Evicted least recently used beyond this bound.
mount_read_cache_bytes_max = 256 * MiB
# Of those, units whose bytes already went into the page cache (pushed) are
# kept only for kernel reads that raced with the push: the most recent ones,
# up to this many bytes (the kernel keeps up to 64 one-MiB READs in flight,
# `mount_background_requests_max`; with 8 MiB kept, a third more RPCs
# refetched what had been pushed).  Dropping the rest promptly returns their
# run's reply buffer to the pool, so a long sequential read recycles a few
# buffers instead of faulting in fresh memory for every run.
mount_pushed_keep_bytes = 64 * MiB
# Whole small files held by libfuse's worker threads until the kernel has
# taken all their bytes (fuse/wholereads.py): a few hundred files read at once.
mount_whole_reads_bytes_max = 64 * MiB
# A mounted dataset's small files are pushed into the page cache after its
# first read (fuse/pagepush.py) in get_batch calls of at most this many
# samples and bytes: per-sample costs vanish, one batch stays cheap to hold.
mount_push_batch_samples_max = 256
mount_push_batch_bytes_max = 16 * MiB
# ... and its larger files in ranged reads of this many bytes each (one reply
# over the data path, block CRCs verified).
mount_push_piece_bytes = 16 * MiB
# A streamed range read (read_chunks) of at most this many bytes travels over
# the data path as one reply, not as a gRPC stream, which was far slower for a
# mount's runs of a large file (DLIO's NPZ volumes; log-fuse.md).
data_path_chunks_bytes_max = 16 * MiB
# Reads of small files that wait for the daemon in libfuse's worker threads at
# once; more go through the trio thread.  Half the threads: the others answer
# requests from memory even while the daemon hangs.
mount_whole_reads_waiting_max = 8
# A read starting this close to where the previous read of the same file
# ended continues it (the kernel sends read-ahead requests slightly out of
# order); after `mount_sequential_reads_min` such reads in a row the reader is
# sequential and gets runs and read-ahead.  Two, so that one random read that
# happens to land near the last one does not fetch a whole run.
mount_sequential_slack_bytes = 1 * MiB
mount_sequential_reads_min = 2
# Large files whose last read position is remembered to detect sequential
# readers (least recently read forgotten first).
mount_read_streams_max = 4096

# glibc malloc: allocations below this come from the heap (glibc's ceiling is
# 32 MiB), and freed heap memory is returned to the system only above the trim
# threshold, so received pieces reuse memory instead of faulting in new pages
# (main._keep_freed_memory).
mount_malloc_mmap_threshold_bytes = 32 * MiB
mount_malloc_trim_threshold_bytes = 256 * MiB

# --- FUSE mount: metadata ----------------------------------------------------
# Entries per ListDir call while listing a directory.  A page is kept per open
# directory handle and serves many kernel readdir calls (each takes ~4 KiB of
# entries), so one RPC answers tens of them.
mount_dir_page_entries = 2000
# Inodes the kernel has forgotten but this process keeps (least recently used
# beyond this are dropped).  They make re-lookups after cache eviction free and
# keep inode numbers stable while cached; ~200 bytes each.
mount_idle_inodes_max = 262144
# Directories whose first lookup listed them into the inode table, remembered
# so they are not listed again (a key each, ~100 bytes).
mount_listed_dirs_max = 4096
# Kernel entry and attribute cache time for everything inside a dataset.
# Sealed datasets are immutable, so this can be long; a dataset deleted or
# replaced while mounted may be seen stale this long (docs/mount.md, fs.py).
mount_cache_timeout_s_default = 3600.0
# Entry cache time of the dataset directories at the mount root: a replaced or
# deleted dataset is noticed by new lookups after this long.
mount_dataset_entry_timeout_s = 5.0
# Entry and attribute cache time of everything in a checkpoint space (it changes
# while mounted): a change made through another mount or client is seen by new
# lookups after this long; this mount's own changes at once (fuse/space_files.py).
mount_space_cache_timeout_s = 1.0
# st_blksize reported for files.  Readers size their buffers by it: Python's
# open() allocates one of this size per file, and at 128 KiB (glibc's mmap
# threshold) that allocation is an mmap/munmap per open, which halved warm
# 110 KB reads.  The kernel sizes its first read-ahead of a file by the first
# read: with 4 KiB (as ext4 reports) a cold 64 KB JPEG opened by PIL cost 3
# READ requests (16, 16 and 32 KiB), with 64 KiB one of 128 KiB.
mount_block_bytes = 64 * KiB

# A mount lets go of the extent pages it mapped to read files from the extents once
# it read none for this long (`--extent-pages-release`; 0: never), as the daemon
# unmaps its idle mappings (`extent_map_idle_s`): mapped pages count in its RSS and
# drop_caches skips them, so a "cold" epoch after drop_caches would read warm.
# Released, they stay in the page cache and the next read of one maps it again (a
# minor fault per page).  While it reads on, it lets go every
# `mount_extent_pages_release_busy_s`, so its RSS holds what it read since.
mount_extent_pages_release_s_default = 1.0
mount_extent_pages_release_busy_s = 30.0
assert mount_extent_pages_release_s_default <= mount_extent_pages_release_busy_s

# --- FUSE mount: daemon connection -------------------------------------------
# How long a call waits for an unreachable daemon (retrying) before the FUSE
# request fails with EIO.  Short: a training job should see an error, not hang.
mount_reconnect_timeout_s_default = 5.0
# Deadline of a metadata call (stat, one directory page).
mount_metadata_timeout_s_default = 10.0
# Deadline of a data call (one sample or one window).
mount_read_timeout_s_default = 60.0
# Failures of one kind are logged once per this interval (plus a count), so a
# dead daemon does not flood the log with one line per failed read.
mount_error_log_interval_s = 10.0

# --- FUSE mount: mounting ----------------------------------------------------
# `dlfs-mount` without --foreground waits this long for the mount to become
# usable before it gives up and stops the background process.
mount_ready_timeout_s = 120.0
# ... and once the background process said why it failed, this long for it to exit
# before it is killed.
mount_failed_exit_wait_s = 10.0
# After SIGTERM, requests still waiting for the daemon get this long to finish
# before they are abandoned and the file system is unmounted.
mount_shutdown_grace_s = 5.0

# --- training side (dlfs.training: shard_order, pipeline, profile) ---------------------------------
# Samples one shuffle may cover: the permutation is held in memory as int64
# (8 bytes a sample), so this bounds it at 8 GiB; far beyond any dataset's
# sample count that fits a daemon's in-memory directory.
shuffle_samples_max = 1 << 30
# Ranks of one job.  A sanity bound: larger values are almost surely a bug
# (a rank passed as world size, a negative number cast to unsigned).
world_size_max = 1 << 20
# Batches in flight at once in iter_batches, and so threads in its pool; each
# holds one reply payload (batch_size x sample size) until the caller takes it.
pipeline_prefetch_batches_max = 64
# Batches hinted beyond those in flight.  The daemon queues at most
# prefetch_queue_max hints and drops the rest, so hinting further ahead only
# produces dropped hints (and pages that may be evicted before their turn).
pipeline_hint_ahead_batches_max = prefetch_queue_max
# Ids per Prefetch RPC (the daemon's default batch_ids_max).
pipeline_hint_ids_max = batch_ids_max_default
# Samples per batch: one get_batch call may carry no more (daemon default).
pipeline_batch_size_max = batch_ids_max_default
# Shared memory of one dlfs.torch.ReadAhead ring (slots x batch bytes): a
# sanity bound against a batch size or sample size typed wrong.
readahead_ring_bytes_max = 16 * GiB
# The read-ahead helper process must answer this soon after it starts (it
# imports DLFS and connects to the daemon), and stop this soon when told to.
readahead_start_timeout_s = 60.0
readahead_stop_timeout_s = 10.0
# Hints waiting for the hint thread; when it lags this far behind, new hints
# are skipped (counted) rather than queued: a late hint is worthless.
pipeline_hint_queue_max = 2 * prefetch_queue_max
# Side of the square images DecodedBatches makes: its batch of float pixels and the gather
# indices behind it grow with the square of it (4096: 512 MiB of indices per image).
decoded_image_side_max = 4096
# Batches DecodedBatches decodes ahead of the training step: each holds a whole batch of
# float pixels in GPU memory (about 150 MB at 256 x 224 x 224).
decode_ahead_batches_max = 8
# Spans one timeline keeps (about 200 bytes each in memory and in the file).
# Beyond it, new spans are counted as dropped and the summary says so:
# a multi-day run must not grow without bound.
timeline_spans_max = 1_000_000
# Bytes of one worker spool file; past it the worker stops writing spans
# (counted by the lines it did write).
timeline_spool_file_bytes_max = 64 * MiB

assert space_file_bytes_max <= sample_bytes_max
assert space_files_max_default < 65530 // 2
assert 4 * (space_file_bytes_max // crc_block_bytes) + 4096 <= catalog_record_bytes_max
assert chunk_bytes_default + 16 * MiB <= message_bytes_max
assert range_bytes_max <= chunk_bytes_default
assert (read_ahead_windows + 1) * chunk_bytes_default <= inflight_bytes_max_default
assert ingest_message_bytes + 1 * MiB <= message_bytes_max
assert list_page_entries_default <= list_page_entries_max
assert 1 <= reader_threads_default_min <= reader_threads_default_max <= reader_threads_max
assert 0 <= warm_memory_share_default <= warm_memory_share_max < 1
assert path_component_bytes_max < path_bytes_max
assert extent_bytes_max_default <= sample_bytes_max
# One sample's block CRCs always fit one BLOCKS record.
assert 4 * (catalog_block_crcs_per_record + sample_bytes_max // crc_block_bytes) + 64 \
    <= catalog_record_bytes_max
assert mount_rpcs_in_flight_max <= rpcs_concurrent_max_default
assert mount_read_run_bytes_max <= batch_bytes_max_default
assert mount_whole_sample_bytes_max <= batch_bytes_max_default
assert mount_read_unit_bytes % (128 * KiB) == 0  # aligned kernel reads never straddle units
assert mount_read_run_bytes_max % mount_read_unit_bytes == 0
assert mount_read_unit_bytes % crc_block_bytes == 0  # a unit is whole blocks: verifiable alone
assert crc_block_bytes <= mount_whole_sample_bytes_max
assert mount_read_ahead_bytes >= mount_read_run_bytes_max
assert mount_read_run_bytes_max + mount_read_ahead_bytes <= mount_read_cache_bytes_max
assert mount_whole_sample_bytes_max <= mount_read_cache_bytes_max
assert mount_pushed_keep_bytes <= mount_read_cache_bytes_max
assert mount_whole_sample_bytes_max <= mount_whole_reads_bytes_max
assert mount_whole_reads_waiting_max < mount_fuse_threads_max
assert mount_read_run_bytes_max <= data_path_chunks_bytes_max
assert mount_whole_sample_bytes_max <= mount_push_batch_bytes_max <= batch_bytes_max_default
assert 1 <= mount_dir_page_entries <= list_page_entries_max
assert mount_dataset_entry_timeout_s <= mount_cache_timeout_s_default
assert mount_space_cache_timeout_s <= mount_dataset_entry_timeout_s
assert 2 * reconnect_backoff_max_s <= mount_reconnect_timeout_s_default
# A first contact gets at least two connection attempts.
assert 2 * reconnect_backoff_max_s <= first_contact_timeout_s <= reconnect_timeout_s_default
assert pipeline_hint_ahead_batches_max <= prefetch_queue_max
assert pipeline_hint_ids_max <= batch_ids_max_default
assert datapath_error_frame_bytes_max <= datapath_reply_header_bytes_max
assert 0 < datapath_peer_share <= 1
assert 1 <= datapath_handshakes_per_peer_max <= datapath_handshakes_max
assert 1 <= grpc_handshakes_per_peer_max <= grpc_handshakes_max
assert 0 < datapath_buffer_hold_s < datapath_stall_timeout_s_default
assert 0 < datapath_accept_backoff_s_min <= datapath_accept_backoff_s_max
assert dataset_name_bytes_max + request_id_chars_max * 4 + 64 <= datapath_request_fixed_bytes_max
assert datapath_token_bytes_max + 64 <= datapath_request_bytes_max
# The attempt bound must not cut retries short of the default time bound.
assert sum(retry_backoff_s) + (call_attempts_max - len(retry_backoff_s)) * retry_backoff_s[-1] \
    >= 2 * reconnect_timeout_s_default
assert worker_restart_backoff_s <= worker_restart_backoff_s_max
assert worker_stats_timeout_s < worker_ack_timeout_s
assert etcd_reconnect_pause_s < etcd_attempt_timeout_s < etcd_call_timeout_s
