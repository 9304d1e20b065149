"""A GET_BATCH exchange against a scripted daemon, through the C exchange and the Python one.

The scripted daemon is a real socket on loopback that answers each GET_BATCH with
bytes a test wrote (a whole reply, an ERROR frame before or inside the payload,
a damaged sample, a trickle, a hang-up), so every path where the C exchange
hands back to the Python code is reached, and both must end the same way: the
same samples, the same typed errors, the same connection state after them.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import numpy as np
import pytest

from dlfs import errors
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.transport.datapath_conn import DataPathConnection, Endpoint
from dlfs.crc import crc32c
from dlfs.formats import datapath_frames as frames

DATASET = "ds"


def samples_of(count: int, size: int = 4096, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]


def batch_reply(samples: list[bytes], *, generation: int = 3, crcs: list[int] | None = None,
                window: int = 1 << 20, flags: int = frames.BATCH_CRCS) -> bytes:
    """A BATCH frame and the payload in DATA frames of at most `window` bytes."""
    lengths = np.array([len(s) for s in samples], dtype=np.uint64)
    if crcs is None:
        crcs = [crc32c(s) for s in samples]
    header = b"".join(bytes(b) for b in frames.batch_header(
        generation, lengths, np.array(crcs, dtype=np.uint32), flags))
    payload = b"".join(samples)
    data = b"".join(frames.frame(frames.Kind.DATA, len(payload[at:at + window]))
                    + payload[at:at + window] for at in range(0, len(payload), window))
    return header + data


class ScriptedDaemon(threading.Thread):
    """Accepts one data path connection, welcomes it, and answers the k-th request
    with `replies[k]`: bytes (sent at once), ("trickle", bytes, seconds per byte),
    ("close", bytes: sent, then the connection is closed) or ("hang", bytes: sent,
    then nothing until the test ends)."""

    def __init__(self, replies: list):
        super().__init__(daemon=True, name="scripted-daemon")
        self.replies = list(replies)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint(socket.AF_INET, self.listener.getsockname(), "scripted")
        self.done = threading.Event()
        self.requests: list[bytes] = []
        self.start()

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            self._frame(conn)  # HELLO
            conn.sendall(frames.welcome(4 << 20, b"i" * 16, frames.DaemonLimits(
                1024, 1 << 30, frames.request_bytes_max(1024))))
            for reply in self.replies:
                request = self._frame(conn)
                if request is None:
                    return
                self.requests.append(request)
                if isinstance(reply, bytes):
                    conn.sendall(reply)
                    continue
                what, raw = reply[0], reply[1]
                if what == "trickle":
                    for k in range(len(raw)):
                        conn.sendall(raw[k:k + 1])
                        if self.done.wait(reply[2]):
                            return
                    continue
                conn.sendall(raw)
                if what == "close":
                    return
                if what == "hang":
                    self.done.wait()
                    return
            self.done.wait()

    @staticmethod
    def _frame(conn: socket.socket) -> bytes | None:
        try:
            header = conn.recv(frames.FRAME.size, socket.MSG_WAITALL)
        except ConnectionResetError:  # a client that closed with a reply unread
            return None
        if len(header) < frames.FRAME.size:
            return None
        _kind, _flags, length = frames.parse_frame(header)
        return header + (conn.recv(length, socket.MSG_WAITALL) if length else b"")

    def stop(self) -> None:
        self.done.set()
        self.listener.close()


@pytest.fixture
def script():
    """`script(replies, reply_timeout_s=5)`: a connection to a scripted daemon."""
    made: list = []

    def connect(replies: list, reply_timeout_s: float = 5.0) -> DataPathConnection:
        daemon = ScriptedDaemon(replies)
        connection = DataPathConnection(daemon.endpoint, "", b"", connect_timeout_s=5.0,
                                        reply_timeout_s=reply_timeout_s)
        made.append((daemon, connection))
        return connection

    yield connect
    for daemon, connection in made:
        connection.close()
        daemon.stop()


def ask(connection: DataPathConnection, count: int, *, out=None, verify: bool = True,
        pool: BufferPool | None = None, generation: int = 0):
    ids = np.arange(100, 100 + count, dtype=np.int64)
    return connection.get_batch(frames.get_batch(DATASET, ids, generation=generation or 3),
                                ids, DATASET, verify=verify, out=out, pool=pool or BufferPool(),
                                generation=generation)


def test_the_c_exchange_reads_the_frames_this_package_writes():
    """Its frame layout is its own copy (C cannot import datapath_frames): held to it."""
    from dlfs.client.transport import datapath_conn

    native = datapath_conn.native
    assert native is not None, "the C exchange was not built"
    assert (native.KIND_BATCH, native.KIND_DATA) == (frames.Kind.BATCH, frames.Kind.DATA)
    assert (native.BATCH_CRCS, native.BATCH_BLOCKS) == (frames.BATCH_CRCS,
                                                          frames.BATCH_BLOCKS)
    assert (native.FRAME_BYTES, native.BATCH_FIXED_BYTES) == (frames.FRAME.size,
                                                               frames.BATCH.size)


def test_a_whole_reply_gives_read_only_samples_in_order(exchange, script):
    samples = samples_of(64) + [b""] + samples_of(3, size=110_000, seed=1)
    connection = script([batch_reply(samples, window=70_000)])
    got = ask(connection, len(samples))
    assert got.generation == 3 and not got.hints_dropped
    assert [bytes(s) for s in got.samples] == samples
    assert all(s.readonly for s in got.samples)
    assert not connection.broken


def test_out_receives_the_reply_and_its_views_are_writable(exchange, script):
    samples = samples_of(8)
    out = bytearray(8 * 4096 + 10)
    connection = script([batch_reply(samples)])
    got = ask(connection, 8, out=out)
    assert bytes(out[:8 * 4096]) == b"".join(samples)
    assert not got.samples[0].readonly and got.samples[0].obj is not None
    got.samples[1][0] = 7
    assert out[4096] == 7


def test_an_out_too_small_is_refused_and_the_unread_reply_closes_the_connection(
        exchange, script):
    connection = script([batch_reply(samples_of(8))])
    with pytest.raises(errors.InvalidArgument,
                       match="out holds 4096 bytes; the batch needs 32768"):
        ask(connection, 8, out=bytearray(4096))
    assert connection.broken


def test_an_empty_batch_and_the_hints_dropped_flag(exchange, script):
    connection = script([batch_reply([], flags=frames.BATCH_CRCS | frames.BATCH_HINTS_DROPPED)])
    got = ask(connection, 0)
    assert got.samples == [] and got.hints_dropped


@pytest.mark.parametrize("window", [1 << 20, 3 * 4096], ids=["one window", "windows"])
def test_a_damaged_sample_is_named_and_the_connection_stays_usable(exchange, script, window):
    samples = samples_of(10)
    crcs = [crc32c(s) for s in samples]
    crcs[6] ^= 1
    crcs[8] ^= 1  # only the first is named
    connection = script([batch_reply(samples, crcs=crcs, window=window),
                         batch_reply(samples, window=window)])
    with pytest.raises(errors.DataCorruption) as caught:
        ask(connection, 10)
    assert "sample 106 of dataset 'ds'" in caught.value.message
    assert f"{crcs[6]:08x}" in caught.value.message.lower()
    assert not connection.broken
    assert [bytes(s) for s in ask(connection, 10).samples] == samples
    # Unchecked, the same bytes are handed out.
    unchecked = script([batch_reply(samples, crcs=crcs)])
    assert [bytes(s) for s in ask(unchecked, 10, verify=False).samples] == samples


def test_an_error_instead_of_the_batch_is_typed_and_leaves_the_connection_usable(
        exchange, script):
    samples = samples_of(4)
    refusal = frames.error(errors.NotFound("dataset 'ds' not found"))
    connection = script([refusal, batch_reply(samples)])
    with pytest.raises(errors.NotFound, match="dataset 'ds' not found"):
        ask(connection, 4)
    assert not connection.broken
    assert [bytes(s) for s in ask(connection, 4).samples] == samples


def test_an_error_inside_the_payload_is_typed(exchange, script):
    samples = samples_of(32)
    whole = batch_reply(samples, window=16 * 4096)
    first_window = whole[:len(whole) - (16 * 4096 + frames.FRAME.size)]
    failure = frames.error(errors.DataCorruption("extent 3 is damaged"))
    connection = script([first_window + failure])
    with pytest.raises(errors.DataCorruption, match="extent 3 is damaged"):
        ask(connection, 32)


@pytest.mark.parametrize("damage", ["kind", "long DATA", "lengths", "blocks"])
def test_a_reply_that_breaks_the_protocol_breaks_the_connection(exchange, script, damage):
    samples = samples_of(4)
    reply = bytearray(batch_reply(samples))
    header = frames.FRAME.size + frames.BATCH.size + 12 * 4
    if damage == "kind":
        reply[0] = frames.Kind.DATASET
    elif damage == "long DATA":
        reply[header + 4:header + 8] = (5 * 4096).to_bytes(4, "little")
    elif damage == "lengths":
        at = frames.FRAME.size + frames.BATCH.size
        reply[at:at + 8] = (4095).to_bytes(8, "little")
    else:
        reply[frames.FRAME.size + 20] |= frames.BATCH_BLOCKS
    connection = script([bytes(reply)])
    with pytest.raises(errors.Unavailable) as caught:
        ask(connection, 4)
    assert connection.broken
    assert "scripted" in caught.value.message


def test_a_daemon_gone_mid_payload_is_unavailable(exchange, script):
    reply = batch_reply(samples_of(16))
    connection = script([("close", reply[:len(reply) // 2])])
    with pytest.raises(errors.Unavailable, match="dropped the connection"):
        ask(connection, 16)
    assert connection.broken


@pytest.mark.parametrize("where", ["header", "payload"])
def test_a_trickled_reply_is_cut_off_at_the_whole_deadline(exchange, script, where):
    reply = batch_reply(samples_of(4))
    cut = 4 if where == "header" else len(reply) - 4096
    connection = script([("trickle", reply[:cut] if where == "header" else reply, 0.05)]
                        if where == "header" else
                        [("hang", reply[:cut])], reply_timeout_s=0.6)
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded, match="within 0.6 s"):
        ask(connection, 4)
    assert 0.5 < time.monotonic() - started < 2.0
    assert connection.broken


# 25 days are past poll's int milliseconds; 31 years past them many times.
@pytest.mark.parametrize("timeout_s", [25 * 86400.0, 1e9])
def test_a_timeout_longer_than_any_wait_waits_for_a_trickled_reply(exchange, script,
                                                                   timeout_s):
    """A timeout far past what one wait can be told (poll's milliseconds, a timeval's
    microseconds) waits for the reply in turns: the reply is whole."""
    samples = samples_of(2, size=64)
    connection = script([("trickle", batch_reply(samples), 0.002)], reply_timeout_s=timeout_s)
    assert [bytes(s) for s in ask(connection, 2).samples] == samples


def test_a_signal_handler_runs_while_the_exchange_waits(exchange, script):
    """A wait inside the exchange lets Python's signal handlers run (Ctrl-C ends a
    training loop stuck on a silent daemon)."""
    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    reply = batch_reply(samples_of(4))
    connection = script([("hang", reply[:len(reply) - 100])], reply_timeout_s=30.0)
    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    started = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            ask(connection, 4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("sent", [7, 9], ids=["one too few", "one too many"])
def test_a_reply_of_another_number_of_samples_is_refused(exchange, script, sent):
    """8 ids asked, `sent` samples answered: a caller pairing ids with samples would get
    the wrong ones, so nothing is handed out."""
    connection = script([batch_reply(samples_of(sent))])
    with pytest.raises(errors.InvalidReply, match=f"{sent} samples in reply to a request "
                                                  "for 8"):
        ask(connection, 8)
    assert connection.broken


def test_a_reply_of_another_generation_than_named_is_refused(exchange, script):
    connection = script([batch_reply(samples_of(2), generation=4)])
    with pytest.raises(errors.InvalidReply, match="version 4 of the dataset in reply to a "
                                                  "request for version 3"):
        ask(connection, 2, generation=3)
    assert connection.broken
    # Not naming one, the current version is whatever the daemon serves.
    assert ask(script([batch_reply(samples_of(2), generation=4)]), 2).generation == 4


def test_a_payload_over_what_a_reply_may_carry_is_refused_before_any_allocation(
        exchange, script):
    """A header announcing 2**62 bytes (its lengths adding up): InvalidReply, not a
    MemoryError, and no buffer asked of the pool."""
    lengths = np.array([1 << 62], dtype=np.uint64)
    header = b"".join(bytes(b) for b in frames.batch_header(
        3, lengths, np.zeros(1, np.uint32), frames.BATCH_CRCS))
    pool = BufferPool()
    taken = []
    take = pool.take
    pool.take = lambda size: taken.append(size) or take(size)
    connection = script([("hang", header)])
    with pytest.raises(errors.InvalidReply, match=r"a payload of 4611686018427387904 bytes, "
                                                  r"over the most a reply of this daemon "
                                                  r"carries \(1075838976\)"):
        ask(connection, 1, pool=pool)
    assert taken == [] and connection.broken


def test_a_range_reply_longer_than_the_range_asked_for_is_refused(script):
    connection = script([batch_reply([b"x" * 200], flags=0)])
    request = frames.read_range(DATASET, 5, 10, 100)
    with pytest.raises(errors.InvalidReply, match="a range of 200 bytes in reply to a "
                                                  "request for 100"):
        connection.read_range(request, 5, 10, DATASET, verify=False, pool=BufferPool(),
                              length=100)
    assert connection.broken
    answered = script([batch_reply([b"x" * 60], flags=0)])  # clipped at the sample's end
    assert bytes(answered.read_range(request, 5, 10, DATASET, verify=False, pool=BufferPool(),
                                     length=100).samples[0]) == b"x" * 60
