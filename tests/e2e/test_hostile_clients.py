"""The data path's front door against hostile and careless clients (issue 37, items 1, 2,
3 and 6), each against a real daemon.

- a HELLO trickled a byte at a time takes no slot an authenticated client
  needs and is cut off when the whole handshake took its budget; a client
  the data path refuses at connect reads through gRPC and says so;
- out of descriptors, the accept loops back off, say why once, answer the
  clients they cannot serve, and serve again when descriptors free up;
- clients that stop reading hold no window buffer while they stall, and one
  peer holds at most its share of the connections;
- an oversized batch is the same InvalidArgument, word for word, on every
  transport, refused before a byte is sent where the client knows the limit,
  and a daemon that refuses a frame says why before it closes; every frame
  header is checked against its kind's maximum before its body (issue 55).

The gRPC port's door is tests/e2e/test_grpc_door.py.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import select
import socket
import threading
import time

import numpy as np
import pytest

import dlfs
from helpers.daemons import metric_samples
from helpers.trees import write_tree
from helpers.waiting import wait_until
from dlfs import Client, limits
from dlfs.crc import crc32c
from dlfs.formats import datapath_frames as frames
from helpers.hostile_peers import Trickler, connect, read_frame, stall, welcomed

MiB = 1024 * 1024
TOKEN = "f" * 8 + "-front-door-token"
# Another peer to the daemon than 127.0.0.1 (all of 127.0.0.0/8 is this host).
OTHER_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    rng = np.random.default_rng(37)
    files = {f"s/{i:03d}.bin": rng.bytes(int(rng.integers(100, 5000))) for i in range(64)}
    files |= {f"t/big{i}.raw": rng.bytes(9 * MiB + i) for i in range(2)}  # three windows each
    root = tmp_path_factory.mktemp("hostile-src")
    write_tree(root, files)
    return root, files, sorted(files)


def endpoints_of(client) -> tuple[tuple, tuple]:
    """("tcp", port) and ("unix", socket name) of the daemon's data path."""
    data = client.transport.data_path()
    return ("tcp", data.tcp_port), ("unix", data.hint.unix_socket)


def on_data_path(client) -> bool:
    """Whether this client's reads got a WELCOME from the data path (not only gRPC)."""
    data = client.transport.data_path()
    return data is not None and data.ever_connected


def tokens_file(tmp_path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"admin {TOKEN}\n")
    os.chmod(path, 0o600)
    return str(path)


def cache_extents(daemon) -> None:
    """Read every extent file of `daemon` once: the page cache then holds them (reads
    of large cached samples go by sendfile)."""
    extent_dir = os.path.join(daemon.data_dir, "extents")
    for folder, _dirs, names in os.walk(extent_dir):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(8 * MiB):
                    pass


# --- item 1: trickled handshakes; a refusal at connect ------------------------------------

def test_trickled_hellos_hold_no_slot_and_are_cut_off_within_the_handshake_budget(
        daemon_factory, tmp_path, tree):
    root, files, paths = tree
    daemon = daemon_factory(extra_args=["--tokens-file", tokens_file(tmp_path),
                                        "--datapath-connections-max", "4"])
    with Client(daemon.address, token=TOKEN) as client:
        client.ingest(str(root), "ds")
        tcp, unix = endpoints_of(client)
    # Twelve connections, three times the connection limit, that say HELLO a byte a
    # second and have no token at all.
    tricklers = [Trickler(tcp if i % 2 else unix, 1.0) for i in range(12)]
    try:
        for trickler in tricklers:
            trickler.start()
        for mode in ("tcp", "unix"):
            with Client(daemon.address, token=TOKEN, data_path=mode) as client:
                got = client.dataset("ds").get_batch([0, 7, 63])
                assert [bytes(s) for s in got] == [files[paths[i]] for i in (0, 7, 63)]
                assert on_data_path(client), f"the {mode} data path refused an authenticated client"
        # Bytes keep coming, but the handshake as a whole had its budget: each is cut off.
        budget_s = limits.datapath_hello_timeout_s
        for trickler in tricklers:
            assert trickler.hung_up.wait(budget_s + 30), "a trickled HELLO was never cut off"
            # From its connect to the hang-up: the budget, plus a loaded machine's delays.
            assert budget_s - 1 <= trickler.closed_after_s <= budget_s + 15, \
                trickler.closed_after_s
    finally:
        for trickler in tricklers:
            trickler.close()


def test_a_client_refused_at_connect_reads_through_grpc_and_says_so(daemon_factory, tree,
                                                                   caplog):
    root, files, paths = tree
    daemon = daemon_factory(extra_args=["--datapath-connections-max", "1"])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        tcp, _unix = endpoints_of(client)
    with Client(daemon.address, data_path=False) as client:
        wait_until(lambda: client.status().data_connections == 0,
                   "the daemon saw the ingesting client's connections close", 30)
    holder = welcomed(tcp)  # the one connection the data path serves
    try:
        with Client(daemon.address) as client, caplog.at_level(logging.INFO, logger="dlfs"):
            ds = client.dataset("ds")
            assert [bytes(s) for s in ds.get_batch([1, 2])] == [files[paths[1]], files[paths[2]]]
            said = [r.getMessage() for r in caplog.records if "Overloaded" in r.getMessage()]
            assert said and "through gRPC" in said[0], caplog.text
            assert not on_data_path(client)
            holder.close()
            holder = None
            wait_until(lambda: client.status().data_connections == 0,
                       "the daemon saw the held connection close", 30)
            # Room again: reads take the data path again (it was not given up), once the
            # client's pause after the refusal (limits.data_overloaded_retry_s) is over.

            def read_on_data_path() -> bool:
                assert bytes(ds.get_batch([3])[0]) == files[paths[3]]
                return on_data_path(client)

            wait_until(read_on_data_path, "reads took the data path again", 30)
    finally:
        if holder is not None:
            holder.close()


# --- item 2: out of descriptors -------------------------------------------------------------

def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_out_of_descriptors_the_data_path_backs_off_and_serves_again(daemon_factory, tree):
    root, files, paths = tree
    # One data path worker: the process that accepts, whose descriptors run out.
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--datapath-workers", "1"])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        tcp, unix = endpoints_of(client)
        assert bytes(client.dataset("ds").get_batch([5])[0]) == files[paths[5]]
        [worker] = client.status().data_workers
    pid = worker.pid
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_descriptors(pid) + 12, hard))
    clients = []
    try:
        # More connections than the daemon has descriptors left, on both sockets.
        for i in range(40):
            sock = connect(tcp if i % 2 else unix)
            sock.sendall(frames.hello(""))
            clients.append(sock)
        # Every one hears from the daemon: WELCOME while descriptors lasted, then an
        # ERROR that says why (none is left hanging until its client gives up).
        answers = []
        give_up = time.monotonic() + 30
        for sock in clients:
            sock.settimeout(max(0.1, give_up - time.monotonic()))
            kind, body = read_frame(sock)
            answers.append(frames.parse_error(body, "x") if kind == frames.Kind.ERROR else kind)
        refused = [a for a in answers if isinstance(a, dlfs.Overloaded)]
        assert answers.count(frames.Kind.WELCOME) >= 1 and refused, answers
        assert "file descriptors" in str(refused[0])
        assert all(a == frames.Kind.WELCOME or isinstance(a, dlfs.Overloaded) for a in answers)
    finally:
        for sock in clients:
            sock.close()
    wait_until(lambda: open_descriptors(pid) <= resource.prlimit(
        pid, resource.RLIMIT_NOFILE)[0] - 8, "the daemon closed the connections", 30)
    # Descriptors are free again: new clients are served over the data path, on both
    # sockets, not read silently through gRPC.
    for mode in ("tcp", "unix"):
        with Client(daemon.address, data_path=mode) as client:
            assert bytes(client.dataset("ds").get_batch([9])[0]) == files[paths[9]]
            assert on_data_path(client), f"the {mode} data path never accepted again"
    log = daemon.log()
    # Said once for the episode (not once per failed accept), and counted.
    assert log.count("cannot accept data path connections") == 1, log[-3000:]
    assert log.count("accepting data path connections again") == 1, log[-3000:]
    with Client(daemon.address) as client:
        counted = {labels: value for (name, labels), value in metric_samples(client).items()
                   if name == "dlfs_data_accept_errors_total"}
    assert sum(counted.values()) >= 1 and (("errno", "EMFILE"),) in counted, counted


# --- item 3: clients that stop reading ------------------------------------------------------

@pytest.mark.parametrize("sendfile", ["off", "on"])
def test_clients_that_stop_reading_hold_no_buffer_others_need(daemon_factory, tree, sendfile):
    root, files, paths = tree
    # Two window buffers for everyone; stalled replies are abandoned only after 30 s.
    daemon = daemon_factory(extra_args=["--datapath-buffer-bytes-max", str(8 * MiB),
                                        "--sendfile", sendfile, "--warm-on-first-read", "off"])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        tcp, unix = endpoints_of(client)
    if sendfile == "on":
        cache_extents(daemon)  # large cached samples: every window goes by sendfile
    big = paths.index("t/big0.raw")
    # Eight clients, on both sockets, ask for 150 MB each and read none of it.
    stalled = [stall(tcp, "", "ds", [big] * 16, source=OTHER_HOST) for _ in range(4)]
    stalled += [stall(unix, "", "ds", [big] * 16) for _ in range(4)]
    try:
        # Everyone else is served as fast as ever: a stalled reply holds no buffer
        # while it waits for its client.  Bound: 3 s a read (a read takes milliseconds
        # alone; before the fix each waited for a buffer until a stalled reply was
        # abandoned, 30 s).
        slowest = {}
        for mode in ("tcp", "unix"):
            with Client(daemon.address, data_path=mode, batch_timeout_s=20) as client:
                ds = client.dataset("ds")
                took = []
                for k in range(5):
                    ids = [k, big, 10 + k]
                    started = time.monotonic()
                    got = ds.get_batch(ids)
                    took.append(time.monotonic() - started)
                    assert [bytes(s) for s in got] == [files[paths[i]] for i in ids]
                assert on_data_path(client)
                slowest[mode] = max(took)
        assert max(slowest.values()) < 3.0, slowest
    finally:
        for sock in stalled:
            sock.close()


def test_one_peer_holds_at_most_its_share_of_the_connections(daemon_factory, tree):
    root, files, paths = tree
    daemon = daemon_factory(extra_args=["--datapath-connections-max", "8"])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        tcp, _unix = endpoints_of(client)
    # One host opens as many connections as the daemon serves and stalls them all.
    hog, refusals = [], []
    try:
        for _ in range(8):
            sock = connect(tcp, source=OTHER_HOST)
            sock.sendall(frames.hello(""))
            kind, body = read_frame(sock)
            if kind == frames.Kind.WELCOME:
                hog.append(sock)
            else:
                refusals.append(frames.parse_error(body, "x"))
                sock.close()
        assert len(hog) == 4  # half of --datapath-connections-max
        assert all(isinstance(e, dlfs.Overloaded) for e in refusals) and len(refusals) == 4
        # One serving process says so of the daemon; one of several, of its share.
        assert re.search(rf"{OTHER_HOST} (already holds 4 |holds this serving process's share "
                         r"\(\d\) of the 4 )", str(refusals[0])), refusals[0]
        # The other half is there for everyone else.
        with Client(daemon.address, data_path="tcp") as client:
            assert bytes(client.dataset("ds").get_batch([4])[0]) == files[paths[4]]
            assert on_data_path(client)
    finally:
        for sock in hog:
            sock.close()


# --- item 6: one error for an oversized batch, and why a frame was refused ------------------

OVERSIZED = 722_000


def oversized_message(ids_max: int = limits.batch_ids_max_default) -> str:
    return (f"batch of {OVERSIZED} samples exceeds the limit of {ids_max} "
            "(--batch-ids-max); split it into smaller batches")


def test_an_oversized_batch_is_one_error_on_every_transport(daemon_factory, tree):
    root, files, paths = tree
    daemon = daemon_factory()  # the default limits: the request frame is over its limit too
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
    ids = np.zeros(OVERSIZED, dtype=np.int64)
    refused_by_daemon = {}
    for transport, options in (("grpc", {"data_path": False}), ("tcp", {"data_path": "tcp"}),
                               ("unix", {"data_path": "unix"}), ("direct", {"direct": True})):
        with Client(daemon.address, **options) as client:
            before = client.status().errors.get("INVALID_ARGUMENT", 0)
            ds = client.dataset("ds")
            with pytest.raises(dlfs.InvalidArgument) as raised:
                ds.get_batch(ids)
            assert raised.value.message == oversized_message(), transport
            refused_by_daemon[transport] = \
                client.status().errors.get("INVALID_ARGUMENT", 0) - before
            # The client and its connections are fine: the next read is served.
            assert bytes(ds.get_batch([1])[0]) == files[paths[1]]
    # Clients that know the limit (the data path's, told at WELCOME) refuse before
    # sending a byte; over gRPC alone the daemon refuses it with the same words.
    assert refused_by_daemon == {"grpc": 1, "tcp": 0, "unix": 0, "direct": 0}


@pytest.mark.parametrize("socket_kind", ["tcp", "unix"])
def test_a_daemon_that_refuses_a_frame_says_why_before_it_closes(daemon_factory, tree,
                                                                 socket_kind):
    root, _files, _paths = tree
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        endpoint = dict(zip(("tcp", "unix"), endpoints_of(client)))[socket_kind]
    # A client that does not check the limit (an old one) sends the whole 5.8 MB frame.
    sock = welcomed(endpoint)
    request = frames.get_batch("ds", np.zeros(OVERSIZED, dtype=np.int64))
    sender = threading.Thread(target=_send_ignoring_errors, args=(sock, request), daemon=True)
    sender.start()
    try:
        sock.settimeout(30)
        kind, body = read_frame(sock)
        assert kind == frames.Kind.ERROR
        error = frames.parse_error(body, "x")
        assert isinstance(error, dlfs.InvalidArgument)
        assert error.message == oversized_message()
        assert read_frame(sock) == (0, b"")  # then the daemon hung up
    finally:
        sock.close()
        sender.join(30)


def _send_ignoring_errors(sock: socket.socket, buffers: list) -> None:
    try:
        for buffer in buffers:
            sock.sendall(buffer)
    except OSError:
        pass  # the daemon stopped reading and closed


def test_welcome_tells_the_daemons_release_and_limits(daemon_factory):
    daemon = daemon_factory(extra_args=["--batch-ids-max", "1000"])
    with Client(daemon.address) as client:
        client.status()
        tcp, _unix = endpoints_of(client)
    with connect(tcp) as sock:
        sock.sendall(frames.hello(""))
        kind, body = read_frame(sock)
        assert kind == frames.Kind.WELCOME
        welcome = frames.parse_welcome(body)
        assert welcome.release == dlfs.__version__
        assert welcome.limits.batch_ids_max == 1000
        assert welcome.limits.batch_bytes_max == limits.batch_bytes_max_default
        assert welcome.limits.request_bytes_max >= 16 * 1000
        readable, _, _ = select.select([sock], [], [], 0)
        assert not readable  # nothing else came


def test_a_batch_header_in_place_of_hello_is_refused_for_its_size(daemon_factory):
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        client.status()
        tcp, _unix = endpoints_of(client)
    # A GET_BATCH of three billion ids where HELLO is due: not a request yet, so it is
    # refused for its size alone (the batch limit speaks only to a served client).
    with connect(tcp) as sock:
        sock.sendall(frames.FRAME.pack(frames.Kind.GET_BATCH, 0, 0, (1 << 32) - 1)
                     + frames.GET_BATCH.pack(0, 0, 3_205_999_682, 0, 2, 0, 0))
        kind, body = read_frame(sock)
        assert kind == frames.Kind.ERROR
        error = frames.parse_error(body, "x")
        assert isinstance(error, dlfs.InvalidArgument) and "over the limit" in error.message
        assert read_frame(sock) == (0, b"")
    assert "Traceback" not in daemon.log()


FOUR_GIB = (1 << 32) - 1  # the largest body a frame header can announce


def refused_at_once(sock: socket.socket) -> dlfs.DlfsError:
    """The ERROR the daemon answered, once it also closed the connection."""
    sock.settimeout(30)
    kind, body = read_frame(sock)
    assert kind == frames.Kind.ERROR, (kind, body)
    error = frames.parse_error(body, "x")
    assert read_frame(sock) == (0, b"")  # then the daemon hung up
    return error


@pytest.mark.parametrize("socket_kind", ["tcp", "unix"])
def test_every_frame_header_is_checked_against_its_kind_before_its_body(daemon_factory,
                                                                        socket_kind):
    """After a good HELLO, a header announcing 4 GiB is refused for its size with an
    ERROR and a close, whatever its kind, with no byte of its body sent: nothing waits
    for the body (a deadline's DeadlineExceeded would say it did), nothing is
    allocated for it, and the next client is served."""
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        endpoint = dict(zip(("tcp", "unix"), endpoints_of(client)))[socket_kind]
    for kind in (frames.Kind.GET_BATCH, frames.Kind.READ_RANGE, frames.Kind.STAT_DATASET,
                 frames.Kind.OPEN_DATASET, frames.Kind.INGEST_START, frames.Kind.BLOCK_CRCS):
        with welcomed(endpoint) as sock:
            sock.sendall(frames.FRAME.pack(kind, 0, 0, FOUR_GIB))
            error = refused_at_once(sock)
            assert isinstance(error, dlfs.InvalidArgument), (kind, error)
            assert f"of kind {kind.name} announces {FOUR_GIB} bytes, over the limit of" \
                in error.message, error.message
    # A READ_RANGE is small: one of 5 KiB is refused too (the batch frame's 1 MiB is
    # GET_BATCH's limit alone).
    with welcomed(endpoint) as sock:
        sock.sendall(frames.FRAME.pack(frames.Kind.READ_RANGE, 0, 0, 5 * 1024))
        assert "over the limit of 4096 for its kind" in refused_at_once(sock).message
    # Kinds that are not requests are refused at their header, before their body.
    for kind in (frames.Kind.PIECE, frames.Kind.WELCOME, 200):
        with welcomed(endpoint) as sock:
            sock.sendall(frames.FRAME.pack(kind, 0, 0, FOUR_GIB))
            error = refused_at_once(sock)
            assert isinstance(error, dlfs.InvalidArgument)
            assert error.message == f"frame kind {frames.kind_name(kind)} is not a request"
    welcomed(endpoint).close()  # the data path serves the next client
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("socket_kind", ["tcp", "unix"])
def test_an_oversized_ingest_frame_is_refused_with_what_became_of_the_ingest(
        daemon_factory, socket_kind):
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        endpoint = dict(zip(("tcp", "unix"), endpoints_of(client)))[socket_kind]
    data = b"a whole first file"
    for name, header, said in (
            ("piece", frames.FRAME.pack(frames.Kind.PIECE, 0, 0, FOUR_GIB),
             f"a frame of kind PIECE announces {FOUR_GIB} bytes, over the limit of "
             f"{limits.ingest_message_bytes + 8 * 1024} for its kind"),
            ("end", frames.FRAME.pack(frames.Kind.INGEST_END, 0, 0, 17),
             "a frame of kind INGEST_END announces 17 bytes, over the limit of 16 for its kind"),
            ("batch", frames.FRAME.pack(frames.Kind.GET_BATCH, 0, 0, FOUR_GIB),
             "a frame of kind GET_BATCH in the middle of a conversation it has no place in")):
        with welcomed(endpoint) as sock:
            sock.sendall(frames.ingest_start(f"oversized-{name}"))
            assert read_frame(sock)[0] == frames.Kind.INGEST_READY
            sock.sendall(frames.piece(b"a.bin", len(data), first=True, last=True,
                                      size=len(data), crc=crc32c(data)) + data + header)
            error = refused_at_once(sock)
            assert isinstance(error, dlfs.InvalidArgument), error
            assert error.message == f"{said}; the ingest was discarded: nothing of it takes " \
                "space on the data dir", error.message
    with Client(daemon.address) as client:
        assert client.dataset_infos() == []
    assert "Traceback" not in daemon.log()


def trickle_until_answered(sock: socket.socket, data: bytes, pause_s: float):
    """Send `data` a byte every `pause_s` until the daemon answers: its first frame, or
    None if it never did."""
    for byte in data:
        sock.sendall(bytes([byte]))
        readable, _, _ = select.select([sock], [], [], pause_s)
        if readable:
            return read_frame(sock)
    return None


def test_a_trickled_request_is_cut_off_with_why(daemon_factory, tree):
    root, _files, _paths = tree
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        tcp, _unix = endpoints_of(client)
    request = b"".join(bytes(b) for b in frames.get_batch("ds", np.array([1, 2])))
    with welcomed(tcp) as sock:
        started = time.monotonic()
        sock.settimeout(1.0)
        answer = trickle_until_answered(sock, request, 1.0)  # the whole takes a minute
        # Cut off once the frame took its budget, however its bytes trickled, and told why.
        budget_s = limits.datapath_request_timeout_s
        assert answer is not None and answer[0] == frames.Kind.ERROR, answer
        error = frames.parse_error(answer[1], "x")
        assert isinstance(error, dlfs.DeadlineExceeded) and "whole within" in error.message
        assert budget_s - 1 <= time.monotonic() - started <= budget_s + 15
        assert read_frame(sock) == (0, b"")


def test_a_trickled_ingest_piece_is_cut_off_with_what_became_of_the_ingest(daemon_factory,
                                                                            tree):
    """The idle timeout bounds the wait between frames; a PIECE frame that began must
    arrive whole within its budget, however its bytes trickle."""
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        tcp, _unix = endpoints_of(client)
    with welcomed(tcp) as sock:
        sock.sendall(frames.ingest_start("trickled", resumable=True))
        kind, _body = read_frame(sock)
        assert kind == frames.Kind.INGEST_READY
        data = b"a whole first file"
        sock.sendall(frames.piece(b"a.bin", len(data), first=True, last=True, size=len(data),
                                  crc=crc32c(data)) + data)
        trickled = frames.piece(b"b.bin", 1000, first=True, last=True, size=1000) + bytes(1000)
        started = time.monotonic()
        answer = trickle_until_answered(sock, trickled, 0.5)  # the whole would take 9 min
        budget_s = limits.datapath_piece_timeout_s
        assert answer is not None and answer[0] == frames.Kind.ERROR, answer
        error = frames.parse_error(answer[1], "x")
        assert isinstance(error, dlfs.DeadlineExceeded), error
        assert f"did not arrive whole within {budget_s:g} s" in error.message
        assert "the ingest is parked" in error.message or \
            "the ingest was discarded" in error.message, error.message
        assert budget_s - 1 <= time.monotonic() - started <= budget_s + 15
        assert read_frame(sock) == (0, b"")
    with Client(daemon.address) as client:  # nothing of it is left receiving
        if "parked" in error.message:
            client.discard_ingest("trickled")
        assert "trickled" not in [info.name for info in client.dataset_infos()]
    assert "Traceback" not in daemon.log()
