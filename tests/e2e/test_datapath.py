"""The data path against real daemons: bytes, errors, tokens, hostile and dying clients.

Reads, errors and damage go through both of the client's exchanges (the C one and
the Python one: the `exchange` fixture)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlfs
from dlfs import Client
from dlfs.formats import datapath_frames as frames
from helpers.daemons import evict_extents
from helpers.trees import unique_name, write_tree
from helpers.hostile_peers import read_frame

MiB = 1024 * 1024
TOKEN = "t" * 8 + "-data-path-token"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    rng = np.random.default_rng(3)
    files = {f"s/{i:03d}.bin": rng.bytes(int(rng.integers(0, 9000))) for i in range(200)}
    files["s/empty"] = b""
    files["big/volume.raw"] = rng.bytes(9 * MiB + 123)  # spans three 4 MiB windows
    root = tmp_path_factory.mktemp("dp-src")
    write_tree(root, files)
    return root, files


@pytest.fixture(scope="module")
def served(shared_daemon, tree):
    root, files = tree
    name = unique_name("dp")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name)
    return shared_daemon, name, files


def paths_of(files):
    return sorted(files)


@pytest.mark.parametrize("mode", ["tcp", "unix"])
def test_batches_match_the_source_over_each_socket(served, mode, exchange):
    daemon, name, files = served
    paths = paths_of(files)
    with Client(daemon.address, data_path=mode) as client:
        ds = client.dataset(name)
        ids = [5, 3, 5, paths.index("big/volume.raw"), paths.index("s/empty"), 0]
        got = ds.get_batch(ids)
        assert [bytes(s) for s in got] == [files[paths[i]] for i in ids]
        assert all(s.readonly for s in got)  # views of a buffer the client recycles
        assert client.transport.data_path().endpoint.label.startswith(
            "unix:" if mode == "unix" else "127.0.0.1:")
        assert [bytes(s) for s in ds.get_batch(["s/007.bin", "s/001.bin"])] == \
            [files["s/007.bin"], files["s/001.bin"]]
        assert ds.get_batch([]) == []
        assert client.status().batches_served > 0


def test_out_receives_the_batch_in_request_order(served, exchange):
    daemon, name, files = served
    paths = paths_of(files)
    ids = [9, 2, 9]
    expected = b"".join(files[paths[i]] for i in ids)
    with Client(daemon.address) as client:
        out = np.zeros(len(expected) + 10, dtype=np.uint8)
        samples = client.dataset(name).get_batch(ids, out=out)
        assert bytes(out[:len(expected)]) == expected and not out[len(expected):].any()
        assert [bytes(s) for s in samples] == [files[paths[i]] for i in ids]
        assert np.shares_memory(np.frombuffer(samples[0], np.uint8), out)
        assert not any(s.readonly for s in samples)  # the caller's memory, as given
        with pytest.raises(dlfs.InvalidArgument, match="out holds 3 bytes"):
            client.dataset(name).get_batch(ids, out=bytearray(3))
        with pytest.raises(dlfs.InvalidArgument, match="writable"):
            client.dataset(name).get_batch(ids, out=b"x" * len(expected))


def test_ranges_and_their_integrity(served):
    daemon, name, files = served
    big = files["big/volume.raw"]
    with Client(daemon.address) as client:
        ds = client.dataset(name)
        assert bytes(ds.read("big/volume.raw", 4 * MiB - 10, 5 * MiB)) == \
            big[4 * MiB - 10:9 * MiB - 10]
        assert bytes(ds.read("big/volume.raw", len(big) - 5, 100)) == big[-5:]
        assert bytes(ds.read("big/volume.raw", len(big) + 5, 1)) == b""


def test_errors_keep_their_codes(served, exchange):
    daemon, name, _files = served
    with Client(daemon.address) as client:
        ds = client.dataset(name)
        with pytest.raises(dlfs.InvalidArgument, match="out of range"):
            ds.get_batch([10**6])
        with pytest.raises(dlfs.InvalidArgument, match="out of range"):
            ds.get_batch([-1])
        with pytest.raises(dlfs.NotFound):
            client.get_batch([0], dataset="no-such-dataset")
        with pytest.raises(dlfs.NotFound):
            ds.get_batch(["s/missing"])
        assert len(ds.get_batch([1])) == 1  # the connection survived every error


def test_limits_name_themselves(daemon_factory, tree):
    root, _files = tree
    daemon = daemon_factory(extra_args=["--batch-ids-max", "4", "--batch-bytes-max", "1000000"])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        with pytest.raises(dlfs.InvalidArgument, match="--batch-ids-max"):
            ds.get_batch([0, 1, 2, 3, 4])
        with pytest.raises(dlfs.InvalidArgument, match="--batch-bytes-max"):
            ds.get_batch(["big/volume.raw"])


def test_a_corrupted_byte_is_caught_by_the_client(daemon, tmp_path, exchange):
    write_tree(tmp_path / "src", {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    extent_dir = os.path.join(daemon.data_dir, "extents")
    [dataset_dir] = os.listdir(extent_dir)
    with open(os.path.join(extent_dir, dataset_dir, "000000.ext"), "r+b") as f:
        position = f.read().index(b"B" * 1000) + 10
        f.seek(position)
        f.write(b"X")
    daemon.restart()
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.DataCorruption,
                           match="checksum mismatch for sample 1 'b.bin' of dataset 'ds'"):
            client.get_batch([0, 1], dataset="ds")
        assert client.transport.data_path() is not None  # caught on the data path itself
        assert bytes(client.get_batch([1], dataset="ds", verify=False)[0]).count(b"X") == 1
        assert [e.path for e, _ in client.scrub("ds", progress=False).damaged] == ["b.bin"]


def test_generations_are_checked(served):
    daemon, name, files = served
    with Client(daemon.address) as client:
        info = client.dataset(name).info
        data = client.transport.data_path()
        assert data.get_batch(name, np.array([1]), generation=info.generation).generation \
            == info.generation
        with pytest.raises(dlfs.FailedPrecondition, match="was replaced"):
            data.get_batch(name, np.array([1]), generation=info.generation + 1000)
        assert data.stat_dataset(name) == (info.generation, info.samples, info.bytes)


# --- the protocol from outside -------------------------------------------------------

def raw_connection(daemon) -> socket.socket:
    with Client(daemon.address) as client:
        port = client.transport.data_path().tcp_port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def test_a_token_is_required_when_the_daemon_has_tokens(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {TOKEN}\n")
    os.chmod(tokens, 0o600)
    daemon = daemon_factory(extra_args=["--tokens-file", str(tokens)])
    with Client(daemon.address, token=TOKEN) as client:
        assert client.datasets() == []
        port = client.transport.data_path().tcp_port
    for token in ("", "wrong-token-wrong-token"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(frames.hello(token))
            kind, body = read_frame(sock)
            assert kind == frames.Kind.ERROR
            assert isinstance(frames.parse_error(body, "x"), dlfs.Unauthenticated)
            assert read_frame(sock) == (0, b"")  # and the daemon hung up
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frames.hello(TOKEN))
        assert read_frame(sock)[0] == frames.Kind.WELCOME


def test_malformed_frames_get_an_error_and_a_closed_connection(served):
    daemon, name, _files = served
    cases = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not our protocol at all
        frames.frame(frames.Kind.GET_BATCH, 0),  # a request before HELLO
        frames.FRAME.pack(frames.Kind.HELLO, 0, 0, 1 << 30),  # a huge body
    ]
    for raw in cases:
        with raw_connection(daemon) as sock:
            sock.sendall(raw)
            kind, body = read_frame(sock)
            assert kind == frames.Kind.ERROR
            assert isinstance(frames.parse_error(body, "x"), dlfs.InvalidArgument)
            assert read_frame(sock) == (0, b"")
    with raw_connection(daemon) as sock:  # valid HELLO, then a frame of an unknown kind
        sock.sendall(frames.hello(""))
        assert read_frame(sock)[0] == frames.Kind.WELCOME
        sock.sendall(frames.frame(99, 4) + b"abcd")
        assert read_frame(sock)[0] == frames.Kind.ERROR
        assert read_frame(sock) == (0, b"")
    with Client(daemon.address) as client:
        assert len(client.dataset(name).get_batch([1, 2])) == 2


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 3, 4, 64, 66, 255]), st.binary(max_size=64)),
                min_size=1, max_size=4))
def test_fuzzed_frames_never_hurt_the_daemon(served, fuzzed):
    daemon, name, _files = served
    with raw_connection(daemon) as sock:
        sock.settimeout(10)
        try:
            sock.sendall(frames.hello(""))
            for kind, body in fuzzed:
                sock.sendall(frames.frame(kind, len(body)) + body)
            sock.shutdown(socket.SHUT_WR)
            while read_frame(sock)[0]:
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
    with Client(daemon.address) as client:
        assert client.status().uptime_s > 0


def test_a_client_that_dies_mid_reply_costs_nothing(served):
    daemon, name, files = served
    big = paths_of(files).index("big/volume.raw")
    code = f"""
import socket, sys
from dlfs.formats import datapath_frames as frames
import numpy as np
sock = socket.create_connection(("127.0.0.1", {raw_port(daemon)}))
sock.sendall(frames.hello(""))
sock.recv(100)
for b in frames.get_batch({name!r}, np.array([{big}] * 8)):
    sock.sendall(b)
sock.recv(65536)
import os; os._exit(0)
"""
    for _ in range(3):
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with Client(daemon.address) as client:
        assert bytes(client.dataset(name).get_batch([big])[0]) == files["big/volume.raw"]


def raw_port(daemon) -> int:
    with Client(daemon.address) as client:
        return client.transport.data_path().tcp_port


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_client_that_stops_reading_is_cut_off_and_memory_stays_bounded(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=["--datapath-stall-timeout-s", "2",
                                        "--datapath-buffer-bytes-max", str(8 * MiB)])
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        big = paths_of(files).index("big/volume.raw")
        port = client.transport.data_path().tcp_port
        before = rss_kib(daemon.process.pid)
        stalled = []
        for _ in range(4):  # each asks for ~450 MB and reads nothing
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(frames.hello(""))
            read_frame(sock)
            for b in frames.get_batch("ds", np.array([big] * 48)):
                sock.sendall(b)
            stalled.append(sock)
        # Meanwhile everyone else is served: the buffer pool (two windows) is not held
        # forever, and health and metadata never wait on it.
        ds = client.dataset("ds")
        assert client.status().uptime_s > 0
        assert bytes(ds.get_batch([3])[0]) == files[paths_of(files)[3]]
        # The daemon gives up on each of them (the client's own connection stays).
        give_up = time.monotonic() + 120
        while client.status().data_connections > 1:
            assert time.monotonic() < give_up, "stalled data connections were never closed"
            time.sleep(0.2)
        for sock in stalled:
            sock.close()
        grown_mib = (rss_kib(daemon.process.pid) - before) / 1024
        assert grown_mib < 64, f"daemon grew by {grown_mib:.0f} MiB serving stalled clients"
        assert bytes(ds.get_batch([big])[0]) == files["big/volume.raw"]


def test_a_killed_daemon_is_unavailable_with_its_address(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"alpha"})
    with Client(daemon.address, reconnect_timeout_s=1) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        assert bytes(client.get_batch([0], dataset="ds")[0]) == b"alpha"
        daemon.kill()
        with pytest.raises(dlfs.Unavailable, match=daemon.address.rpartition(":")[0]):
            client.get_batch([0], dataset="ds")


def test_without_a_data_path_reads_go_through_grpc(daemon_factory, tmp_path):
    write_tree(tmp_path / "src", {"a": b"alpha"})
    daemon = daemon_factory(extra_args=["--data-port", "-1"])
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        assert bytes(client.get_batch([0], dataset="ds")[0]) == b"alpha"
        assert client.transport.data_path() is None


def test_forked_children_open_their_own_connections(served):
    daemon, name, files = served
    paths = paths_of(files)
    with Client(daemon.address) as client:
        ds = client.dataset(name)
        assert len(ds.get_batch([1])) == 1  # the parent holds a data connection
        context = multiprocessing.get_context("fork")
        queue = context.Queue()

        def child(ids):
            queue.put([bytes(s) for s in ds.get_batch(ids)])

        workers = [context.Process(target=child, args=([i, i + 1],)) for i in range(3)]
        for worker in workers:
            worker.start()
        results = sorted(queue.get(timeout=60) for _ in workers)
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
        assert results == sorted([files[paths[i]], files[paths[i + 1]]] for i in range(3))
        assert len(ds.get_batch([2])) == 1  # the parent's connections still work


def test_cold_and_warm_windows_give_the_same_bytes(daemon, tree):
    """Warm windows are gathered from the page cache, cold ones read into a buffer first."""
    root, files = tree
    paths = paths_of(files)
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        ids = list(range(len(paths)))[::-1]
        warm = [bytes(s) for s in ds.get_batch(ids)]
        evict_extents(daemon)
        cold = [bytes(s) for s in ds.get_batch(ids)]
        assert warm == cold == [files[paths[i]] for i in ids]
        assert client.status().cache_miss_ranges > 0  # the second batch really was cold
