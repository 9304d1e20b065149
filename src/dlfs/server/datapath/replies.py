"""Replies of the data path: a batch, a range, a dataset's descriptors, its version.

Each function answers one parsed request on a connection (`ServedConnection`
in `conn_handler`): it checks the request against the dataset and the
daemon's limits (the Store's `batch_limits`, as gRPC's planning does: the
same error and message), sends the reply's header, then its payload window
by window, read by the read engine into a window buffer from the server's
pool and sent with one `sendmsg` each (or, cached, with no buffer: by `sendfile`,
or from mappings of the extents).
A reply takes a buffer per window, only once its client has room for it,
and gives it back as soon as the client stops taking bytes: one that stops
reading holds none (`_send_window`).  Every reply has a deadline as a whole
(`ServedConnection.reply_deadline`).  A `DlfsError` raised before or during the
payload propagates: the connection answers it with an ERROR frame (in
place of the remaining DATA frames).  Nothing here imports grpc.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import time

import numpy as np

from dlfs import limits
from dlfs.errors import DlfsError, PermissionDenied
from dlfs.formats import datapath_frames as frames
from dlfs.server.read import sendfiles
from dlfs.server.read.batch_planning import RequestOrder
from dlfs.sockio import wait_at_most


def batch(connection, request: frames.GetBatchFrame) -> None:
    """GET_BATCH: BATCH (lengths and CRC32Cs), then the samples in request order."""
    store = connection.store
    started = time.perf_counter()
    # The daemon's one set of batch limits, as gRPC's plan meets them: the same error.
    store.batch_limits.check_count(request.ids.size)
    with store.reading(request.dataset, request.generation,
                       first_read=bool(request.ids.size)) as dataset:
        if not request.hints.size and _sent_in_one_call(connection, dataset, request.ids,
                                                         frames.BATCH_CRCS, started):
            return
        ids = dataset.check_ids(request.ids)
        dataset.check_local(ids)
        lengths = dataset.length[ids]
        payload = int(lengths.sum())  # a duplicate id is sent each time: it counts each time
        store.batch_limits.check_payload(ids.size, payload)
        flags = frames.BATCH_CRCS
        if request.hints.size and not store.reads.hint_ids(dataset, request.hints,
                                                           alone=not ids.size):
            flags |= frames.BATCH_HINTS_DROPPED
        if request.hints.size and _sent_in_one_call(connection, dataset, ids, flags, started):
            return
        order = RequestOrder(dataset.extent[ids], dataset.offset[ids], lengths)
        header = frames.batch_header(dataset.generation, lengths, dataset.crc[ids], flags)
        send_reply(connection, dataset, header, order, lambda: store.reads.count_served(
            "DataBatch", ids.size, payload, started))


def _sent_in_one_call(connection, dataset, ids, flags: int, started: float) -> bool:
    """The whole reply of samples `ids` sent in one call of the C send from mappings of
    the extents (DatasetReads.send_batch), when `send_reply` would send it from
    mappings and the page cache holds its pages; the same bytes, without the
    planning, the frames and the send loop in Python.  False, with nothing sent,
    otherwise: the request then takes the Python path, which checks it."""
    store = connection.store
    samples = ids.size
    return store.reads.send_batch(
        dataset, ids, connection.sock, flags, window_bytes=connection.server.buffers.window_bytes,
        large_ok=connection.same_host_tcp, stall_s=connection.server.stall_timeout_s,
        before=lambda payload: store.reads.count_served("DataBatch", samples, payload, started))


def byte_range(connection, request: frames.ReadRangeFrame) -> None:
    """READ_RANGE: BATCH, then the bytes.  The whole sample is one item with its CRC32C;
    with the RANGE_BLOCKS flag a part of a sample with block CRCs is sent as the
    whole blocks around it, each with its CRC32C (BATCH_BLOCKS: the client
    verifies them and cuts the range out); otherwise a part has no CRC."""
    store = connection.store
    started = time.perf_counter()
    with store.reading(request.dataset, request.generation) as dataset:
        sample_id = int(dataset.check_ids(np.array([request.sample_id]))[0])
        read = store.reads.plan_range(dataset, sample_id, request.offset, request.length,
                                      blocks=bool(request.flags & frames.RANGE_BLOCKS))
        flags = (frames.BATCH_CRCS if read.checkable else 0) | \
            (frames.BATCH_BLOCKS if read.blocks else 0)
        header = frames.batch_header(dataset.generation, read.lengths, read.crcs, flags,
                                       (read.skip, read.length) if read.blocks else None)
        plan = read.plan
        order = RequestOrder(plan.range_extent, plan.range_file_offset, plan.range_length)
        send_reply(connection, dataset, header, order, lambda: store.reads.count_served(
            "DataRange", 1, plan.payload_bytes, started))


def open_dataset(connection, name: str, generation: int) -> None:
    """OPEN_DATASET: INDEX, the extents' read-only descriptors (FDS frames, SCM_RIGHTS),
    then the location arrays as DATA.

    Only over the Unix socket, to a peer that authenticated at HELLO (a
    token, when the daemon has tokens) and, without tokens, runs as the
    daemon's own user or root (SO_PEERCRED): a passed descriptor reads the
    whole extent and cannot be taken back.
    """
    check_local_peer(connection.sock, connection.server.authorizer is not None)
    store = connection.store
    with store.reading(name, generation) as dataset, \
            store.reads.extent_descriptors(dataset) as descriptors:
        deadline = connection.reply_deadline(len(dataset) * frames.INDEX_BYTES_PER_SAMPLE)
        extent_nos = np.array([e for e, _ in descriptors], dtype=np.uint32)
        connection.send([frames.index_header(dataset.generation, len(dataset), extent_nos)],
                        deadline)
        step = limits.datapath_fds_per_frame_max
        fds = [fd for _, fd in descriptors]
        for start in range(0, len(fds), step):
            part = fds[start:start + step]
            wait_at_most(connection.sock, deadline, connection.server.stall_timeout_s)
            connection.sock.sendmsg([frames.fds_frame(len(part))], [
                (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(part)}i", *part))])
        window = connection.server.buffers.window_bytes
        for array, dtype in ((dataset.extent, "<u4"), (dataset.offset, "<u8"),
                             (dataset.length, "<u8"), (dataset.crc, "<u4")):
            raw = memoryview(np.ascontiguousarray(array, dtype=dtype)).cast("B")
            for start in range(0, len(raw), window):
                piece = raw[start:start + window]
                connection.send([frames.data_frame(len(piece)), piece], deadline)


def block_crcs(connection, name: str, generation: int, sample_id: int) -> None:
    """BLOCK_CRCS: CRCS, the CRC32C of every block of one sample (dlfs.formats.block_crcs): what a
    co-located reader of the extents needs to verify a part of a large sample.  A sample
    of one block has its own CRC; one ingested before block CRCs has none."""
    with connection.store.reading(name, generation) as dataset:
        dataset.check_local(dataset.check_ids([sample_id]))
        connection.send([frames.crcs_reply(dataset.generation, dataset.blocks.block_bytes,
                                             dataset.block_crcs(sample_id))])


def stat_dataset(connection, name: str) -> None:
    """STAT_DATASET: DATASET (the current version, samples and bytes)."""
    summary = connection.store.dataset(name).summary()
    connection.send([frames.dataset_reply(summary.generation, summary.samples,
                                            summary.bytes)])


def send_reply(connection, dataset, header: list, order: RequestOrder, count) -> None:
    """The BATCH frame `header`, then DATA frames of the payload, window by window, each
    read into a pooled buffer (`_send_window`), or sent from the page cache with
    no buffer at all: by `sendfile` when its pieces are large and all cached
    (server/read/sendfiles.py), from mappings of the extents when its pieces are
    small, or the client is on this host over TCP, and their pages are cached
    (server/read/mapped_sends.py).

    The whole reply must be sent by `connection.reply_deadline` and every wait
    for the client ends after the stall timeout (socket.timeout: the
    connection is closed).  `count()` records the request as served once
    every byte was read and before the last frame goes out: a client that asks
    for the daemon's counters as soon as its reply arrived finds it counted.
    """
    deadline = connection.reply_deadline(order.payload_bytes)
    windows = order.windows(connection.server.buffers.window_bytes)
    if not windows:
        count()
        connection.send(header, deadline)
        return
    store = connection.store
    # Large cached samples straight from the page cache: no copy in the daemon.
    by_sendfile = store.reads.sendfile
    # Small cached samples from mappings of their extents: one copy in the daemon (and
    # large ones to a client on this host over TCP: cheaper there than sendfile).
    by_mapping = store.reads.maps is not None
    if by_mapping and len(windows) > 1 and \
            _sent_whole_from_mappings(connection, dataset, header, order, windows, count,
                                      deadline):
        return
    # The header goes out with the first window sent without a buffer (one system call,
    # and the client wakes once for both), else on its own before the first read.
    unsent: list | None = header
    advised = 0  # payload bytes below this were asked of the device ahead of their window
    for k, (start, stop) in enumerate(windows):
        before = count if k == len(windows) - 1 else None
        kind = order.mapping_kind(start, stop) if by_mapping else None
        small_to_map = kind == "small"
        large_to_map = kind == "large" and connection.same_host_tcp
        sent = False
        if small_to_map or large_to_map:
            # One iovec per sample, in payload order (no sort, no join).  Large samples
            # only from extents already mapped: mapping extents cold reads touch cost
            # cold 110 KB 5-10%; sendfile finding a window cached has its extents
            # mapped if the page cache holds them (nearly) whole.
            send = functools.partial(store.reads.send_mapped, map_missing=small_to_map)
            sent = _send_unbuffered(connection, send, dataset,
                                    order.in_request_order(start, stop), start, stop,
                                    unsent, before, deadline)
        # A small window whose pages were not all cached takes the read path.
        if not sent and by_sendfile and not small_to_map:
            pieces = order.pieces(start, stop)
            sent = sendfiles.worth(pieces) and _send_unbuffered(
                connection, store.reads.send_cached, dataset, pieces, start, stop, unsent,
                before, deadline)
            if sent:
                # Mapped, a client on this host gets the next windows from the mapping;
                # any other, only the mapping's scans (residency without a system
                # call per piece): no page table filled for it.
                store.reads.map_soon(dataset, pieces.extent, populate=large_to_map)
        if sent:
            unsent = None
            continue
        if unsent is not None:
            connection.send(unsent, deadline)
            unsent = None
        advised = _send_window(connection, dataset, order, start, stop, deadline, before,
                               advised)


def _sent_whole_from_mappings(connection, dataset, header: list, order: RequestOrder,
                              windows: list[tuple[int, int]], count, deadline: float) -> bool:
    """The whole reply in one send from mappings of the extents, still a DATA frame per
    window, when a send from mappings would take it (as `send_reply` decides per
    window) and the page cache holds every page: one residency look, one iovec
    array and one run of `sendmsg`s for the reply, where window by window each
    came once per window (28 MB of 110 KB samples: 7 windows, about 30 array
    operations each).  False, with nothing sent, otherwise: the reply then
    goes window by window."""
    kind = order.mapping_kind(0, order.payload_bytes)
    if kind != "small" and not (kind == "large" and connection.same_host_tcp):
        return False
    send = functools.partial(
        connection.store.reads.send_mapped, map_missing=kind == "small",
        later_heads=[(start, frames.data_frame(stop - start)) for start, stop in windows[1:]])
    pieces = order.in_request_order_by_window(connection.server.buffers.window_bytes)
    return _send_unbuffered(connection, send, dataset, pieces, *windows[0], header, count,
                            deadline)


def _send_unbuffered(connection, send, dataset, pieces, start: int, stop: int,
                     unsent: list | None, before, deadline: float) -> bool:
    """Payload bytes [start, stop) as one DATA frame by `send` (the read engine's
    `send_mapped` or `send_cached`; a `send_mapped` given later heads goes on with
    the windows after it), preceded by the frames `unsent` if any: True when
    sent, False (nothing sent) when the pages were not all cached."""
    connection.sock.settimeout(connection.server.stall_timeout_s)
    head = frames.data_frame(stop - start)
    if unsent is not None:
        head = b"".join(unsent) + head
    return send(dataset, pieces, connection.sock, head, before=before, deadline=deadline)


def _send_window(connection, dataset, order: RequestOrder, start: int, stop: int,
                 deadline: float, before, advised: int) -> int:
    """Payload bytes [start, stop) as one DATA frame, read into a buffer of the pool.

    The window is read while the socket may still be sending the one before
    (as it always was: reading and sending overlap), and the buffer is held
    only while the client takes the bytes: when it takes none for
    `limits.datapath_buffer_hold_s`, the buffer goes back to the pool, the
    reply waits for the client holding nothing, and the rest of the window is
    read again (from the page cache, as a rule) into whichever buffer is free
    once the client made room.  So a client that stops reading holds no buffer
    another client needs (it costs one read of a window it never takes).  `before()` (if given) runs once the window was read.  A read
    that fails after part of the frame went out completes the frame with zeros
    before its error propagates (the client's CRC checks never pass them).
    Returns the payload offset up to which the device was asked to read ahead.
    """
    store = connection.store
    buffers = connection.server.buffers
    head = frames.data_frame(stop - start)
    size = stop - start
    total = len(head) + size
    done = 0  # bytes of the frame (its header, then payload) sent
    first = True
    while done < total:
        if not first:  # the client took no bytes for a while: wait for it holding nothing
            connection.wait_writable(deadline)
        offset = max(0, done - len(head))  # payload bytes of this window sent already
        try:
            with buffers.take(connection.peer_key, deadline) as buffer:
                window = buffer[:size - offset]
                missed = store.reads.read_into(dataset, order.pieces(start + offset, stop),
                                               window)
                if first:
                    first = False
                    if missed and stop < order.payload_bytes:
                        # A cold reply: keep the device busy with the next windows while
                        # this one is sent, instead of asking for each only when its
                        # turn comes.
                        lo = max(advised, stop)
                        hi = min(order.payload_bytes, stop + limits.datapath_advise_ahead_bytes)
                        if hi > lo:
                            store.reads.advise(dataset, order.pieces(lo, hi))
                            advised = hi
                    if before is not None:
                        before()
                views = ([memoryview(head)[done:]] if done < len(head) else []) + \
                    [memoryview(window)]
                done += _send_while_taken(connection.sock, views, deadline)
        except DlfsError:
            if done:
                _pad(connection, total - done, deadline)  # keep the framing whole
            raise
    return advised


def _send_while_taken(sock: socket.socket, views: list, deadline: float) -> int:
    """Send `views` for as long as the client takes bytes (each wait at most
    `limits.datapath_buffer_hold_s`); returns the bytes sent.  Raises socket.timeout
    at `deadline`."""
    sent_all = 0
    try:
        while views:
            wait_at_most(sock, deadline, limits.datapath_buffer_hold_s)
            sent = sock.sendmsg(views)
            sent_all += sent
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if sent:
                views[0] = views[0][sent:]
    except socket.timeout:
        if time.monotonic() >= deadline:
            raise
    return sent_all


def _pad(connection, count: int, deadline: float) -> None:
    """`count` zero bytes: the rest of a DATA frame whose bytes could not be read."""
    while count:
        piece = memoryview(_ZEROS)[:min(count, len(_ZEROS))]
        connection.send([piece], deadline)
        count -= len(piece)


_ZEROS = bytes(64 * 1024)


def check_local_peer(sock: socket.socket, has_tokens: bool) -> None:
    """Raise PermissionDenied unless `sock`'s peer may receive extent descriptors."""
    if sock.family != socket.AF_UNIX:
        raise PermissionDenied("extent descriptors are passed only over the daemon's Unix "
                               "socket, to a client on its host")
    if not has_tokens:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid not in (0, os.getuid()):
            raise PermissionDenied(
                f"uid {uid} may not read this daemon's extents directly: without a tokens "
                "file only its own user and root may; give the daemon --tokens-file and "
                "the client a token, or read without direct=True")
