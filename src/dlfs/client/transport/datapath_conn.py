"""One connection to a daemon's data path, one request at a time (the client side).

`DataPathConnection` speaks the frames of `dlfs/proto/datapath.md`: HELLO and
WELCOME (checking the daemon's instance id), then GET_BATCH / READ_RANGE /
STAT_DATASET / OPEN_DATASET.  Every reply's payload is received with
`recv_into` straight into a buffer: the caller's `out`, or a recycled one
from a `BufferPool`; each sample is checked against the CRC32C the reply
header carries.  No sample byte is copied in Python.

Longer than most modules (about 600 lines): it is one state machine, a
connection and the frames it reads, and every request (batches, ranges,
block CRCs, descriptors, ingest) goes through the same private frame reader
and failure rule (`_frame`, `_failed`); split, those would have to be public.
The reply's checks are in `datapath_checks`.  A GET_BATCH goes through the C
exchange (`native_exchange.c`, one call for the common case of a whole
reply) where it was built and `DLFS_NATIVE` is not 0; whatever it does not
take it hands back to the Python code here, which stays the reference.
"""

from __future__ import annotations

import array
import logging
import os
import resource
import select
import socket
import time
from typing import NamedTuple

import numpy as np

from dlfs import limits, logs
from dlfs import native as native_extensions
from dlfs.client.reply_buffers import BufferPool, out_array
from dlfs.client.transport.datapath_checks import ReplyChecker, sample_mismatch
from dlfs.crc import crc32c
from dlfs.formats import datapath_frames as frames
from dlfs.batch_limits import BatchLimits
from dlfs.client.transport.call_policy import stall_s, time_left
from dlfs.errors import (
    DeadlineExceeded,
    DlfsError,
    FailedPrecondition,
    InvalidArgument,
    InvalidReply,
    Overloaded,
    Unavailable,
    VersionMismatch,
)
from dlfs.sockio import recv_exactly, recv_waiting, send_all
from dlfs.version import interoperates, mismatch_message

log = logging.getLogger(__name__)


# The C exchange of a GET_BATCH (native_exchange.c), or None (dlfs.native.extension).
# Module state so that a test can run the Python exchange in-process (set it to None).
native = native_extensions.extension("dlfs.client.transport.native_exchange")


class Endpoint(NamedTuple):
    """Where a data path listens: (socket family, address) and a label for messages."""

    family: int
    address: object  # (host, port) for TCP, a path or b"\0name" for a Unix socket
    label: str


class OpenedDataset(NamedTuple):
    """A dataset's version, its location arrays (id order) and its extents' descriptors."""

    generation: int
    samples: int
    fds: dict  # extent no -> read-only descriptor (the receiver closes them)
    extent: np.ndarray  # uint32 per sample; 0xFFFFFFFF: stored by another daemon
    offset: np.ndarray  # uint64
    length: np.ndarray  # uint64
    crc: np.ndarray  # uint32


class Received(NamedTuple):
    """One reply: the generation it was served from and the samples in request order."""

    generation: int
    samples: list[memoryview]
    hints_dropped: bool = False  # the daemon's prefetch queue dropped the request's hints


class DataPathConnection:
    """One connection to a daemon's data path; one request at a time.  Not thread-safe.

    Deadlines are for whole operations: connecting and the handshake take at
    most `connect_timeout_s` together, a request and its whole reply at most
    `reply_timeout_s`, however the bytes trickle; both cut to what is left of
    the call in progress (`call_policy.time_left`).  While a reply (or the
    handshake) is due, a silence of `call_policy.stall_s()` is taken for a hung
    daemon process.  Raises Unavailable when the daemon cannot be reached (with
    `refused` set when nothing listens there), and
    Unavailable with `connection_lost` set (`stalled` for a silence) when a
    connection that reached it breaks or stops answering; DeadlineExceeded when
    a reply is not whole in time; VersionMismatch for a daemon of another minor
    release (`dlfs.version`); InvalidReply for a reply that does not match its
    request; and the daemon's typed errors: an Overloaded that refused the
    connection at HELLO has `refused_at_connect` set.  After any exception but
    a typed error from the daemon, `broken` is set and the connection must be
    closed.  `batch_limits`: the daemon's, as its WELCOME told them.
    `watch_stalls` False (a long one-way ingest, whose daemon may think for
    long before it answers) leaves only the deadlines.
    """

    def __init__(self, endpoint: Endpoint, token: str, instance: bytes, *,
                 connect_timeout_s: float, reply_timeout_s: float):
        self.endpoint = endpoint
        self.reply_timeout_s = reply_timeout_s
        self.broken = False
        self.watch_stalls = True
        self._reached = False  # the connect went through: failures after it are losses
        self.hints_dropped = 0  # hints sent without waiting that the daemon's queue dropped
        self._unanswered_hints = 0  # replies of hints sent without waiting, still to be read
        self._header = bytearray(frames.FRAME.size)
        self._sock = socket.socket(endpoint.family, socket.SOCK_STREAM)
        self._begin(connect_timeout_s)
        try:
            self._sock.connect(endpoint.address)
            self._reached = True
            if endpoint.family != socket.AF_UNIX:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_all(self._sock, [frames.hello(token)], deadline=self._deadline)
            kind, body = self._frame(limits.datapath_reply_header_bytes_max)
            if kind != frames.Kind.WELCOME:
                raise self._unexpected(kind, "WELCOME")
            welcome = frames.parse_welcome(body)
        except OSError as exc:
            self._sock.close()
            if self._reached:
                raise self._failed(exc) from None
            unreached = Unavailable(f"DLFS daemon's data path at {endpoint.label} cannot be "
                                    f"reached ({exc.strerror or exc}); is dlfs-server running "
                                    "there?")
            unreached.refused = isinstance(exc, ConnectionRefusedError)
            raise unreached from None
        except frames.FrameError as exc:
            self._sock.close()
            raise Unavailable(f"DLFS daemon's data path at {endpoint.label} broke the protocol "
                              f"at its handshake ({exc})") from None
        except Overloaded as exc:
            self._sock.close()
            exc.refused_at_connect = True
            raise
        except BaseException:
            self._sock.close()
            raise
        if welcome.version != frames.VERSION or not interoperates(welcome.release):
            self._sock.close()
            raise VersionMismatch(mismatch_message("daemon", welcome.release, this="client")
                                  + f" (the daemon's data path at {endpoint.label})")
        if instance and welcome.instance != instance:
            self._sock.close()
            raise FailedPrecondition(f"{endpoint.label} is another daemon's data path")
        self.window_bytes = welcome.window_bytes
        told = welcome.limits
        assert told is not None
        self.batch_limits = BatchLimits(told.batch_ids_max, told.batch_bytes_max)
        self._request_bytes_max = told.request_bytes_max
        self._reply_header_bytes_max = max(limits.datapath_reply_header_bytes_max,
                                           frames.reply_header_bytes_max(told.batch_ids_max))
        # The largest payload a reply may announce: a batch at the daemon's limit, or a
        # range at it widened to the whole blocks around it (a block more each side).
        self.payload_bytes_max = told.batch_bytes_max + 2 * limits.crc_block_bytes

    def check_batch(self, samples: int, request_bytes: int) -> None:
        """Refuse a batch of `samples` whose GET_BATCH body is `request_bytes` long before a
        byte of it is sent, when the daemon told limits it is over: the daemon's own
        InvalidArgument (`dlfs.batch_limits`), word for word.  The connection stays usable."""
        self.batch_limits.check_count(samples)
        if request_bytes > self._request_bytes_max:
            raise InvalidArgument(
                f"a request of {request_bytes} bytes is over the limit of "
                f"{self._request_bytes_max} of the daemon's data path at {self.endpoint.label}; "
                "send fewer prefetch hint ids with the batch")

    def close(self) -> None:
        self._sock.close()

    def looks_alive(self) -> bool:
        """Whether an idle connection may take a request: nothing arrived on it since its
        last reply (one `select`, and a peek when something came).  A daemon process
        that went away left an end of file or a reset; one that closed an idle connection, an ERROR before
        it.  Replies of hints sent without waiting may be waiting: then it is taken
        as alive (the request reads them first and finds out)."""
        if self._unanswered_hints:
            return True
        try:
            if not select.select([self._sock], [], [], 0)[0]:
                return True  # the common case: one system call
            self._sock.settimeout(0)  # with a timeout, Python would poll for it first
            waiting = self._sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # an end of file, or bytes nobody asked for

    # --- requests ---------------------------------------------------------------------

    def get_batch(self, request: list, ids: np.ndarray, dataset: str, *, verify: bool,
                  out, pool: BufferPool, generation: int = 0) -> Received:
        """Send a GET_BATCH frame (`request`, from `frames.get_batch`, naming `generation`)
        and receive its reply, checked against the request (`ReplyShape`)."""
        shape = ReplyShape(ids.size, generation, self.endpoint.label)
        if native is None or len(request) > native.REQUEST_BUFFERS_MAX:
            return self._exchange(request, ids, dataset, verify, out, pool, shape)
        return self._native_exchange(request, ids, dataset, verify, out, pool, shape)

    def send_hint(self, request: list) -> None:
        """Send a GET_BATCH of hints alone (`request`) without waiting for its reply.

        The reply (one BATCH frame) is read before this connection's next
        request, so a hint costs its sender one `sendmsg`; the daemon plans
        and advises it while the sender goes on.  A reply saying the
        daemon's prefetch queue dropped the hint counts in `hints_dropped`;
        a typed error answering it is logged at debug level and dropped (a
        hint only costs speed, and the next read of that dataset meets the
        same trouble with its own exception).  At most
        `limits.datapath_hints_unanswered_max` replies wait to be read.
        """
        try:
            self._begin(self.reply_timeout_s)
            if self._unanswered_hints >= limits.datapath_hints_unanswered_max:
                self._settle()
            send_all(self._sock, request, deadline=self._deadline)
        except BaseException as exc:
            raise self._failed(exc) from None
        self._unanswered_hints += 1

    def read_range(self, request: bytes, sample_id: int, offset: int, dataset: str, *,
                   verify: bool, pool: BufferPool, generation: int = 0,
                   length: int = 0) -> Received:
        """Send a READ_RANGE frame (`request`, asking for `length` bytes from `offset` of
        version `generation`) and receive its reply: one item, the range, verified
        whole or block by block."""
        shape = ReplyShape(1, generation, self.endpoint.label, range_bytes=length)
        return self._exchange([request], np.array([sample_id]), dataset, verify, None, pool,
                              shape, offset)

    def stat_dataset(self, dataset: str) -> tuple[int, int, int]:
        """(generation, samples, bytes) of the dataset's current version."""
        try:
            self._begin(self.reply_timeout_s)
            self._settle()
            send_all(self._sock, [frames.stat_dataset(dataset)], deadline=self._deadline)
            kind, body = self._frame(frames.DATASET.size)
        except BaseException as exc:
            raise self._failed(exc) from None
        if kind != frames.Kind.DATASET:
            raise self._unexpected(kind, "DATASET")
        return frames.parse_dataset_reply(body)

    def block_crcs(self, dataset: str, sample_id: int, generation: int = 0
                   ) -> tuple[int, int, np.ndarray | None]:
        """(generation, block bytes, CRC32C of each block or None) of one sample, for a
        reader of the extents that checks parts of it.  Raises the daemon's errors."""
        try:
            self._begin(self.reply_timeout_s)
            self._settle()
            send_all(self._sock, [frames.block_crcs(dataset, sample_id, generation,
                                                    logs.current_request_id())],
                     deadline=self._deadline)
            kind, body = self._frame(self._reply_header_bytes_max)
            if kind != frames.Kind.CRCS:
                raise self._unexpected(kind, "CRCS")
            return frames.parse_crcs_reply(body)
        except BaseException as exc:
            raise self._failed(exc) from None

    def open_dataset(self, dataset: str, generation: int = 0) -> "OpenedDataset":
        """The dataset's index and read-only descriptors of its extents (Unix socket only).

        The caller owns the descriptors (close them).  Raises the daemon's
        typed errors (PermissionDenied over TCP or for a foreign user).
        """
        fds: list[int] = []
        try:
            self._begin(self.reply_timeout_s)
            self._settle()
            send_all(self._sock, [frames.open_dataset(dataset, generation,
                                                      logs.current_request_id())],
                     deadline=self._deadline)
            kind, body = self._frame(self._reply_header_bytes_max)
            if kind != frames.Kind.INDEX:
                raise self._unexpected(kind, "INDEX")
            generation, samples, extent_nos = frames.parse_index_header(body)
            if samples > limits.dataset_samples_max:
                raise self._invalid(f"an index of {samples} samples, over the limit of "
                                    f"{limits.dataset_samples_max}")
            while len(fds) < len(extent_nos):
                fds.extend(self._receive_fds())
            if len(fds) != len(extent_nos):
                raise frames.FrameError("more descriptors than extents arrived")
            arrays = np.empty(samples * frames.INDEX_BYTES_PER_SAMPLE, dtype=np.uint8)
            self._receive_payload(arrays)
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            raise self._failed(exc) from None
        n = samples
        return OpenedDataset(
            generation, samples, dict(zip(extent_nos.tolist(), fds)),
            arrays[:4 * n].view("<u4"), arrays[4 * n:12 * n].view("<u8"),
            arrays[12 * n:20 * n].view("<u8"), arrays[20 * n:].view("<u4"))

    # --- ingest (dlfs.client.transport.datapath_upload) -------------------------------------

    def start_ingest(self, start: bytes, timeout_s: float) -> int:
        """Send INGEST_START; return the files the daemon already holds (INGEST_READY).
        From here on only deadlines bound the connection's waits (`watch_stalls`)."""
        self.watch_stalls = False
        try:
            self._begin(timeout_s)
            send_all(self._sock, [start], deadline=self._deadline)
            kind, body = self._frame(frames.INGEST_READY.size)
        except BaseException as exc:
            raise self._failed(exc) from None
        if kind != frames.Kind.INGEST_READY:
            raise self._unexpected(kind, "INGEST_READY")
        return frames.parse_ingest_ready(body)

    def widen_send_buffer(self, size: int) -> None:
        """Let `size` bytes be in flight (capped by net.core.wmem_max): a long one-way
        stream (an ingest) then needs far fewer wake-ups of either side."""
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        except OSError:
            pass

    def send_frames(self, buffers: list) -> None:
        """Send frames of an ingest; raises the daemon's ERROR if it answered one."""
        try:
            send_all(self._sock, buffers)
        except OSError as exc:
            self.raise_pending(wait_s=1.0)  # the daemon may have said why it stopped reading
            raise self._failed(exc) from None

    def raise_pending(self, wait_s: float = 0.0) -> None:
        """Raise the daemon's ERROR frame if one has arrived (within `wait_s`); an ingest
        hears nothing else before its end."""
        try:
            self._sock.settimeout(wait_s)
            waiting = self._sock.recv(1, socket.MSG_PEEK | (socket.MSG_DONTWAIT if not wait_s
                                                            else 0))
        except (BlockingIOError, socket.timeout, InterruptedError):
            return
        except OSError:
            return
        finally:
            self._begin(self.reply_timeout_s)
        if not waiting:
            self.broken = True
            raise Unavailable(f"DLFS daemon's data path at {self.endpoint.label} closed the "
                              "connection in the middle of an ingest")
        try:
            kind, _body = self._frame(self._reply_header_bytes_max)
        except BaseException as exc:
            raise self._failed(exc) from None
        raise self._unexpected(kind, "nothing")

    def finish_ingest(self, timeout_s: float) -> tuple:
        """Wait for INGESTED: (name, generation, samples, bytes, created ns, extents)."""
        try:
            self._begin(timeout_s)
            kind, body = self._frame(frames.INGESTED.size + 1024)
        except BaseException as exc:
            raise self._failed(exc) from None
        if kind != frames.Kind.INGESTED:
            raise self._unexpected(kind, "INGESTED")
        return frames.parse_ingested(body)

    # --- writes (dlfs.client.transport.datapath_writer) -------------------------------------

    def file_request(self, request: list, answer: int, body_bytes_max: int,
                     timeout_s: float) -> memoryview:
        """Send the frames of one request of a file's writes and return the body of its
        answer, a frame of kind `answer`; a WRITE_FAILED on the way (an earlier
        write's failure, which the answer repeats) is passed over.  Raises the
        daemon's typed error (the connection stays usable), Unavailable,
        DeadlineExceeded."""
        try:
            self._begin(timeout_s)
            send_all(self._sock, request, deadline=self._deadline)
            while True:
                kind, length = self._frame_header()
                if kind == frames.Kind.WRITE_FAILED:
                    self._body(min(length, limits.datapath_error_frame_bytes_max))
                    continue
                kind, body = self._frame_body(kind, length, body_bytes_max)
                if kind != answer:
                    raise self._unexpected(kind, frames.Kind(answer).name)
                return body
        except BaseException as exc:
            raise self._failed(exc) from None

    def write_failure(self) -> DlfsError | None:
        """The daemon's error if a WRITE_FAILED arrived (it is not waited for), else None.
        Cost: one non-blocking recv."""
        try:
            self._sock.settimeout(0.0)  # with a timeout, recv would poll for it first
            waiting = self._sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise self._failed(exc) from None
        finally:
            self._sock.settimeout(self.reply_timeout_s)
        if not waiting:
            self.broken = True
            return Unavailable(f"DLFS daemon's data path at {self.endpoint.label} closed the "
                               "connection of a file being written (the daemon restarted?); "
                               "what it received since the last fsync is lost")
        try:
            self._begin(self.reply_timeout_s)
            kind, length = self._frame_header()
            if kind != frames.Kind.WRITE_FAILED or \
                    length > limits.datapath_error_frame_bytes_max:
                raise self._unexpected(kind, "nothing or WRITE_FAILED")
            return frames.parse_error(self._body(length), self.endpoint.label)
        except DlfsError:
            raise
        except BaseException as exc:
            raise self._failed(exc) from None

    def _receive_fds(self) -> list[int]:
        """One FDS frame: its descriptors, which ride on its first byte (SCM_RIGHTS)."""
        size = frames.FRAME.size + frames.FDS.size
        space = socket.CMSG_SPACE(limits.datapath_fds_per_frame_max * 4)
        data, ancillary, flags, _ = self._sock.recvmsg(size, space)
        fds = [fd for level, kind, raw in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
        try:
            if flags & socket.MSG_CTRUNC:
                self.broken = True  # the frames behind these descriptors are still in flight
                raise _descriptors_cut_off(len(fds))
            if not data:
                raise ConnectionResetError(0, "connection closed before the descriptors")
            frame = bytearray(data)
            if len(frame) < size:
                rest = bytearray(size - len(frame))
                recv_exactly(self._sock, memoryview(rest), deadline=self._deadline)
                frame += rest
            kind, _flags, length = frames.parse_frame(frame[:frames.FRAME.size])
            if kind != frames.Kind.FDS or length != frames.FDS.size:
                raise self._unexpected(kind, "FDS")
            (count,) = frames.FDS.unpack_from(frame, frames.FRAME.size)
            if count != len(fds):
                raise frames.FrameError(f"an FDS frame announced {count} descriptors and "
                                          f"carried {len(fds)}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _exchange(self, request: list, ids: np.ndarray, dataset: str, verify: bool, out,
                  pool: BufferPool, shape: "ReplyShape", offset: int = 0) -> Received:
        try:
            self._begin(self.reply_timeout_s)
            self._settle()
            try:
                send_all(self._sock, request, deadline=self._deadline)
            except OSError as exc:
                raise self._refusal_of(exc) from None
            kind, body = self._frame(self._reply_header_bytes_max)
            if kind != frames.Kind.BATCH:
                raise self._unexpected(kind, "BATCH")
            return self._reply(body, ids, dataset, verify, out, pool, shape, offset)
        except BaseException as exc:
            raise self._failed(exc) from None

    def _native_exchange(self, request: list, ids: np.ndarray, dataset: str, verify: bool,
                         out, pool: BufferPool, shape: "ReplyShape") -> Received:
        """`_exchange` of a GET_BATCH in one call of the C exchange; where it stops
        short of a whole reply (what it returns says where), the Python code here
        goes on from there, so both raise the same errors."""
        try:
            self._begin(self.reply_timeout_s)
            self._settle()
            result = native.get_batch(
                self._sock.fileno(), request, self._deadline, self._wait_s,
                self._reply_header_bytes_max, lambda size: self._payload(out, size, pool),
                crc32c if verify else None, out is None)
            stop = result[0]
            if stop == native.SEND_FAILED:
                code = result[1]
                raise self._refusal_of(OSError(code, os.strerror(code)) if code
                                       else socket.timeout("timed out"))
            if stop == native.NOT_BATCH:
                kind, body = self._frame_body(result[1], result[2],
                                              self._reply_header_bytes_max)
                if kind != frames.Kind.BATCH:
                    raise self._unexpected(kind, "BATCH")
                return self._reply(body, ids, dataset, verify, out, pool, shape)
            if stop == native.BATCH_LEFT:
                return self._reply(result[1], ids, dataset, verify, out, pool, shape)
            if stop == native.NOT_DATA:
                raise self._not_data(result[1], result[2])
            _, generation, flags, samples, bad, expected, got = result
            shape.check(len(samples), generation, blocks=False)
        except BaseException as exc:
            raise self._failed(exc) from None
        if bad >= 0:
            raise sample_mismatch(int(ids[bad]), dataset, self.endpoint.label, expected, got)
        return Received(generation, samples, bool(flags & frames.BATCH_HINTS_DROPPED))

    def _reply(self, body, ids: np.ndarray, dataset: str, verify: bool, out,
               pool: BufferPool, shape: "ReplyShape", offset: int = 0) -> Received:
        """The rest of a reply whose BATCH frame's `body` was read: its shape checked
        against the request's, its payload received and checked.  Raises as
        `_exchange` does before `_failed`."""
        reply = frames.parse_batch_header(body)
        blocks = bool(reply.flags & frames.BATCH_BLOCKS)
        if blocks and (ids.size != 1 or out is not None):
            raise frames.FrameError("blocks came in reply to a batch")
        shape.check(len(reply.lengths), reply.generation, blocks=blocks,
                    range_bytes=reply.length if blocks else int(reply.payload_bytes))
        payload = self._payload(out, reply.payload_bytes, pool)
        view = memoryview(payload).cast("B")
        # Samples handed out of a recycled buffer are read-only; `out` is the caller's.
        source = view if out is not None else view.toreadonly()
        samples, ends = sample_views(source, reply.lengths)
        checker = None
        if verify and reply.flags & frames.BATCH_CRCS:
            # Blocks are named by the bytes of the sample they hold.
            first = offset - reply.skip if blocks else None
            checker = ReplyChecker(samples, ends, reply.crcs,
                                   np.repeat(ids, len(samples)) if blocks else ids, dataset,
                                   self.endpoint.label, first)
        self._receive_payload(payload, checker)
        if checker is not None and checker.failure is not None:
            raise checker.failure
        if blocks:  # the asked range, cut out of its verified blocks
            samples = [source[reply.skip:reply.skip + reply.length]]
        return Received(reply.generation, samples,
                        bool(reply.flags & frames.BATCH_HINTS_DROPPED))

    def _payload(self, out, size: int, pool: BufferPool) -> np.ndarray:
        """The uint8 array a payload of `size` bytes is received into, once `size` was
        checked against the most a reply may carry (InvalidReply, nothing allocated).
        When the caller's `out` cannot hold it (InvalidArgument), the payload stays
        unread in the socket, so the connection is marked broken: the next request
        gets a new one instead of those bytes."""
        try:
            if size > self.payload_bytes_max:
                raise self._invalid(f"a payload of {size} bytes, over the most a reply of "
                                    f"this daemon carries ({self.payload_bytes_max})")
            return _target(out, size, pool)
        except BaseException:
            self.broken = True
            raise

    def _receive_payload(self, payload: np.ndarray, checker: "ReplyChecker | None" = None) -> None:
        """Receive the DATA frames of a payload into `payload`; `checker` verifies the
        samples each frame completes while the next one is still on its way."""
        view = memoryview(payload).cast("B")
        filled = 0
        if checker is not None:
            checker.check_until(0)  # empty samples at the start
        while filled < len(view):
            kind, length = self._frame_header()
            if kind != frames.Kind.DATA or length > len(view) - filled:
                raise self._not_data(kind, length)
            recv_waiting(self._sock, view[filled:filled + length], deadline=self._deadline)
            filled += length
            if checker is not None:
                checker.check_until(filled)

    def _settle(self) -> None:
        """Read the replies of the hints `send_hint` sent (see there); the socket's timeout
        is set.  Raises what `_frame` raises but the daemon's typed errors."""
        while self._unanswered_hints:
            self._unanswered_hints -= 1
            try:
                kind, body = self._frame(self._reply_header_bytes_max)
            except DlfsError as exc:
                if isinstance(exc, (Unavailable, DeadlineExceeded)):
                    raise
                log.debug("a prefetch hint sent to %s was refused: %s", self.endpoint.label, exc)
                continue
            if kind != frames.Kind.BATCH:
                raise self._unexpected(kind, "BATCH")
            reply = frames.parse_batch_header(body)
            if reply.payload_bytes:
                raise frames.FrameError("samples came in reply to hints alone")
            if reply.flags & frames.BATCH_HINTS_DROPPED:
                self.hints_dropped += 1

    # --- frames -------------------------------------------------------------------------

    def _begin(self, timeout_s: float) -> None:
        """Start an operation that must be whole within `timeout_s` (cut to what is left
        of the call in progress); each wait is bounded by the stall bound too, unless
        stalls are not watched."""
        timeout_s = time_left(timeout_s)
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._wait_s = min(stall_s(), timeout_s) if self.watch_stalls else timeout_s
        self._sock.settimeout(self._wait_s)

    def _refusal_of(self, exc: OSError) -> BaseException:
        """Why a send failed: the daemon's ERROR frame when it refused the request and
        closed (it says why first: a frame over its limits from a client that did
        not know them), else `exc`."""
        try:
            self._deadline = min(self._deadline, time.monotonic() + _REFUSAL_WAIT_S)
            self._frame(self._reply_header_bytes_max)
        except DlfsError as error:
            self.broken = True  # the daemon closes the connection after it
            return error
        except BaseException:
            pass
        return exc

    def _frame_header(self) -> tuple[int, int]:
        recv_exactly(self._sock, memoryview(self._header), deadline=self._deadline)
        kind, _flags, length = frames.parse_frame(self._header)
        return kind, length

    def _body(self, length: int) -> memoryview:
        body = memoryview(bytearray(length))
        recv_exactly(self._sock, body, deadline=self._deadline)
        return body

    def _frame(self, body_bytes_max: int) -> tuple[int, memoryview]:
        """The next frame (kind, body); an ERROR frame is raised as its typed error."""
        return self._frame_body(*self._frame_header(), body_bytes_max)

    def _frame_body(self, kind: int, length: int, body_bytes_max: int
                    ) -> tuple[int, memoryview]:
        """A frame whose header was read: (kind, body); ERROR raised as in `_frame`."""
        if length > max(body_bytes_max, limits.datapath_error_frame_bytes_max):
            raise frames.FrameError(f"a frame of kind {kind} announces {length} bytes")
        body = self._body(length)
        if kind == frames.Kind.ERROR:
            raise frames.parse_error(body, self.endpoint.label)
        return kind, body

    def _not_data(self, kind: int, length: int) -> Exception:
        """What to raise for a frame (header read) where a DATA frame of the payload was
        due: the daemon's error when it is an ERROR frame (the reply ends there)."""
        if kind == frames.Kind.ERROR:
            return frames.parse_error(self._body(length), self.endpoint.label)
        return self._unexpected(kind, "DATA within the announced payload")

    def _unexpected(self, kind: int, wanted: str) -> Exception:
        self.broken = True
        return _lost(f"DLFS daemon's data path at {self.endpoint.label} sent frame kind "
                     f"{kind} where {wanted} was due; the connection was closed")

    def _failed(self, exc: BaseException) -> BaseException:
        """The error to raise for `exc`; marks the connection broken unless the daemon
        answered with a typed error at a frame boundary."""
        if isinstance(exc, DlfsError) and not isinstance(
                exc, (Unavailable, DeadlineExceeded, InvalidReply)) and not self.broken:
            return exc
        self.broken = True
        label = self.endpoint.label
        if isinstance(exc, socket.timeout):
            if time.monotonic() < self._deadline:  # one wait ran out: a silence
                return _lost(f"DLFS daemon's data path at {label} sent nothing for "
                             f"{self._wait_s:g} s while an answer was due (a hung daemon "
                             "process?); the connection was closed", stalled=True)
            return DeadlineExceeded(f"DLFS daemon's data path at {label} did "
                                    f"not answer in full within {self._timeout_s:g} s")
        if isinstance(exc, frames.FrameError):
            return _lost(f"DLFS daemon's data path at {label} broke the "
                         f"protocol ({exc}); the connection was closed")
        if isinstance(exc, OSError):
            return _lost(f"DLFS daemon's data path at {label} dropped the "
                         f"connection ({exc.strerror or exc})")
        return exc

    def _invalid(self, what: str) -> InvalidReply:
        """The error for a reply that does not fit its request; the connection is closed."""
        self.broken = True
        return InvalidReply(f"DLFS daemon's data path at {self.endpoint.label} sent {what}; "
                            "the connection was closed (a bug in the daemon: report it)")


# How long a client whose send failed waits for the ERROR frame that says why.
_REFUSAL_WAIT_S = 1.0


def _lost(message: str, *, stalled: bool = False) -> Unavailable:
    """Unavailable for a connection that reached the daemon and then broke or went
    silent: the call policy goes on at once on a new connection."""
    error = Unavailable(message)
    error.connection_lost = True
    error.stalled = int(stalled)
    return error


class ReplyShape:
    """What a reply must look like to answer its request: `samples` items (ids asked
    for), of version `generation` (0: any), and for a range at most `range_bytes`
    (0: to the sample's end).  `check` raises InvalidReply otherwise, before the
    payload is received (after it, for the C exchange's whole replies)."""

    __slots__ = ("samples", "generation", "label", "range_bytes")

    def __init__(self, samples: int, generation: int, label: str, range_bytes: int = 0):
        self.samples, self.generation = samples, generation
        self.label, self.range_bytes = label, range_bytes

    def check(self, samples: int, generation: int, *, blocks: bool, range_bytes: int = 0) -> None:
        if not blocks and samples != self.samples:
            raise self._invalid(f"{samples} samples in reply to a request for {self.samples}")
        if self.generation and generation != self.generation:
            raise self._invalid(f"version {generation} of the dataset in reply to a request "
                                f"for version {self.generation}")
        if self.range_bytes and range_bytes > self.range_bytes:
            raise self._invalid(f"a range of {range_bytes} bytes in reply to a request for "
                                f"{self.range_bytes}")

    def _invalid(self, what: str) -> InvalidReply:
        return InvalidReply(f"DLFS daemon's data path at {self.label} sent {what}; the "
                            "connection was closed (a bug in the daemon: report it)")


def _descriptors_cut_off(received: int) -> Exception:
    """Why the kernel cut an FDS frame's descriptors off.  The daemon sends at most
    `datapath_fds_per_frame_max` a frame and there is room for that many, so a cut
    below it means this process may open no more files (the kernel installs
    descriptors up to RLIMIT_NOFILE and drops the rest); at it, a daemon that sent
    more than a frame may carry."""
    if received < limits.datapath_fds_per_frame_max:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return FailedPrecondition(
            f"this process may open at most {soft} files (RLIMIT_NOFILE), fewer than the "
            "dataset's extents need as descriptors; raise the limit (ulimit -n, "
            "LimitNOFILE= in a systemd unit) or read without direct=True")
    return frames.FrameError("descriptors were cut off (too many in one frame)")


def sample_views(source: memoryview, lengths: np.ndarray) -> tuple[list[memoryview], list[int]]:
    """(a view of `source` per item, each item's end) for items of `lengths` bytes back to
    back.  The views are cut by `map` over slice objects: no Python bytecode runs per
    item (256 items: about a fifth less than a list comprehension)."""
    end_list = np.cumsum(lengths, dtype=np.int64).tolist()
    starts = [0] + end_list[:-1]
    return list(map(source.__getitem__, map(slice, starts, end_list))), end_list


def _target(out, size: int, pool: BufferPool) -> np.ndarray:
    """The uint8 array a payload of `size` bytes is received into."""
    return pool.take(size) if out is None else out_array(out, size)
