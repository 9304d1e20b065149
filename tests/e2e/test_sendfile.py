"""Large cached samples sent from the page cache (`sendfile`), against real daemons: the
bytes, which windows take that way, damage, a stalled client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.formats import datapath_frames as frames
from dlfs.server.read import sendfiles
from dlfs.server.core.extents import ExtentFiles, ExtentStore
from dlfs.server.read.batch_planning import PieceColumns
from dlfs.server.read.preadv_reads import ShortRead
from dlfs.staging.progress import human_bytes
from dlfs.sockio import recv_exactly
from helpers.daemons import evict_extents, metric_samples
from helpers.trees import write_tree
from helpers.other_host import other_host

MiB = 1024 * 1024

@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    rng = np.random.default_rng(11)
    files = {f"img/{i:03d}.jpg": rng.bytes(int(rng.integers(70_000, 200_000)))
             for i in range(60)}
    files["small/a.bin"] = rng.bytes(3000)
    files["vol/big.raw"] = rng.bytes(9 * MiB + 77)  # three 4 MiB windows
    root = tmp_path_factory.mktemp("sendfile-src")
    write_tree(root, files)
    return root, files


def sent_by_sendfile(client) -> float:
    return metric_samples(client).get(("dlfs_sendfile_bytes_total", ()), 0.0)


def sent_mapped(client) -> float:
    return metric_samples(client).get(("dlfs_mapped_send_bytes_total", ()), 0.0)


# A kernel without cachestat(2) (before 6.5: RHEL 8 and 9, Ubuntu 22.04) asks mincore.
ON_BY_MINCORE = "on (residency by mincore: this kernel has no cachestat(2), Linux 6.5+)"


@pytest.mark.parametrize("residency", ["cachestat", "mincore"])
def test_cached_large_samples_go_by_sendfile_on_either_socket(daemon_factory, tree, residency,
                                                              monkeypatch):
    if residency == "mincore":
        monkeypatch.setenv("DLFS_RESIDENCY", "mincore")  # the daemon runs as on an older kernel
    state = "on" if residency == "cachestat" else ON_BY_MINCORE
    root, files = tree
    paths = sorted(files)
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--warm-on-first-read", "off"])
    ids = [paths.index(p) for p in paths[::-1]] + [paths.index("vol/big.raw")]
    expected = [files[paths[i]] for i in ids]
    with Client(daemon.address, data_path="unix") as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        evict_extents(daemon)
        one_window = [paths.index(f"img/{i:03d}.jpg") for i in range(40, 20, -1)]
        window_bytes = [files[paths[i]] for i in one_window]  # about 2.7 MB: one window
        assert [bytes(s) for s in ds.get_batch(one_window)] == window_bytes  # cold: read
        assert sent_by_sendfile(client) == 0 and client.status().cache_miss_ranges > 0
        assert [bytes(s) for s in ds.get_batch(one_window)] == window_bytes  # cached now
        assert sent_by_sendfile(client) == sum(len(b) for b in window_bytes)
        assert [bytes(s) for s in ds.get_batch(ids)] == expected  # caches the rest
        before = sent_by_sendfile(client)
        assert [bytes(s) for s in ds.get_batch(ids)] == expected
        # Every window, the one holding the 3 KB sample too (its pieces average
        # over the threshold).
        assert sent_by_sendfile(client) - before == sum(len(b) for b in expected)
        before = sent_by_sendfile(client)
        assert bytes(ds.read("vol/big.raw", offset=5 * MiB + 3, length=MiB)) == \
            files["vol/big.raw"][5 * MiB + 3:6 * MiB + 3]  # whole blocks, verified by the client
        assert sent_by_sendfile(client) - before == 2 * MiB
    with Client(daemon.address, data_path="tcp") as client:
        # To a client on this host over TCP, a window of many samples goes from mappings
        # of the extents once they are mapped, the others (and all before) by sendfile.
        before = sent_by_sendfile(client) + sent_mapped(client)
        assert [bytes(s) for s in client.dataset("ds").get_batch(ids)] == expected
        assert sent_by_sendfile(client) + sent_mapped(client) - before == \
            sum(len(b) for b in expected)
        status = client.status()
        assert (status.sendfile, status.sendfile_bytes) == (state, sent_by_sendfile(client))
        assert status.mapped_sends == f"{state}; whole replies sent by C"
    # `dlfs status` says how much, in a whole sentence (it once ended "... sent so").
    out = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                          "status"], capture_output=True, text=True, timeout=60).stdout
    assert f"  sendfile from the page cache: {state}; {human_bytes(status.sendfile_bytes)} " \
           "sent so far\n" in out


REMOTE_READER = """
import sys
from dlfs import Client
address, out, *ids = sys.argv[1:]
with Client(address, data_path="tcp") as client:
    ds = client.dataset("ds")
    for _ in range(2):
        got = b"".join(bytes(s) for s in ds.get_batch([int(i) for i in ids]))
open(out, "wb").write(got)
"""


def test_large_cached_samples_go_from_mappings_to_this_host_and_by_sendfile_to_another(
        daemon_factory, tree, tmp_path):
    """Over loopback the mappings' one copy measured cheaper than sendfile's page
    references; to another host (here a network namespace over a veth pair) sendfile
    spares the daemon the copy."""
    root, files = tree
    paths = sorted(files)
    ids = [paths.index(f"img/{i:03d}.jpg") for i in range(59, -1, -1)]  # 8 MB: 2 windows
    expected = b"".join(files[paths[i]] for i in ids)
    with other_host() as host:
        daemon = daemon_factory(extra_args=["--listen", f"{host.address}:0", "--insecure",
                                            "--metrics-listen", "0"])
        # A client on this host, by this host's address on the pair: from mappings.
        with Client(daemon.address, data_path="tcp") as client:
            client.ingest(str(root), "ds")
            ds = client.dataset("ds")
            give_up = time.monotonic() + 10
            while True:
                before = sent_mapped(client)
                assert b"".join(bytes(s) for s in ds.get_batch(ids)) == expected
                if sent_mapped(client) - before == len(expected):
                    break
                assert time.monotonic() < give_up, "no reply was ever sent from mappings"
                time.sleep(0.05)
            by_sendfile, mapped = sent_by_sendfile(client), sent_mapped(client)
            # The same batch, twice, to a client on the other host: by sendfile.
            out = tmp_path / "remote.bin"
            done = host.run([sys.executable, "-c", REMOTE_READER, daemon.address, str(out),
                             *map(str, ids)])
            assert done.returncode == 0, done.stderr
            assert out.read_bytes() == expected
            assert sent_by_sendfile(client) - by_sendfile == 2 * len(expected)
            assert sent_mapped(client) == mapped


def test_small_samples_and_the_switch_keep_the_read_path(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--sendfile", "off"])
    with Client(daemon.address, data_path="unix") as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        for _ in range(2):
            assert bytes(ds.get_batch(["vol/big.raw"])[0]) == files["vol/big.raw"]
        assert sent_by_sendfile(client) == 0
        status = client.status()
        assert (status.sendfile, status.sendfile_bytes) == ("off (--sendfile off)", 0)
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    write_tree(root.parent / "small-src", {f"t/{i}.bin": i.to_bytes(2, "big") * 2048
                                           for i in range(300)})
    with Client(daemon.address, data_path="unix") as client:
        client.ingest(str(root.parent / "small-src"), "small")
        ds = client.dataset("small")
        ids = np.random.default_rng(5).permutation(300)  # no two neighbours join
        by_id = sorted(range(300), key=str)  # sample ids follow the paths' order
        for _ in range(2):
            got = ds.get_batch(ids)
            assert [bytes(s) for s in got] == [by_id[i].to_bytes(2, "big") * 2048 for i in ids]
        assert sent_by_sendfile(client) == 0  # 4 KiB pieces: one read and one send is cheaper


def test_damage_in_a_sample_sent_by_sendfile_is_caught_by_the_client(daemon_factory, tmp_path):
    samples = {"a.bin": b"A" * 200_000, "b.bin": b"B" * 200_000}
    write_tree(tmp_path / "src", samples)
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    with Client(daemon.address, data_path="unix") as client:
        client.ingest(str(tmp_path / "src"), "ds")
    extent_dir = os.path.join(daemon.data_dir, "extents")
    [dataset_dir] = os.listdir(extent_dir)
    with open(os.path.join(extent_dir, dataset_dir, "000000.ext"), "r+b") as f:
        f.seek(f.read().index(b"B" * 1000) + 150_000)
        f.write(b"X")  # through the page cache: the next reads find it cached
    with Client(daemon.address, data_path="unix") as client:
        with pytest.raises(dlfs.DataCorruption, match="sample 1 'b.bin'"):
            client.get_batch([0, 1], dataset="ds")
        assert sent_by_sendfile(client) > 0


def test_a_client_that_stops_reading_a_sendfile_reply_is_cut_off(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=["--datapath-stall-timeout-s", "2"])
    with Client(daemon.address, data_path="unix") as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        big = sorted(files).index("vol/big.raw")
        assert bytes(ds.get_batch([big])[0]) == files["vol/big.raw"]  # now cached
        endpoint = client.transport.data_path().endpoint
        assert endpoint.family == socket.AF_UNIX
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.connect(endpoint.address)
        stalled.sendall(frames.hello(""))
        header = bytearray(frames.FRAME.size)
        recv_exactly(stalled, memoryview(header))
        stalled.recv(frames.parse_frame(header)[2])
        for b in frames.get_batch("ds", np.array([big] * 40)):  # 360 MB, never read
            stalled.sendall(b)
        assert bytes(ds.get_batch([3])[0]) == files[sorted(files)[3]]  # others are served
        give_up = time.monotonic() + 60
        while client.status().data_connections > 1:
            assert time.monotonic() < give_up, "the stalled connection was never closed"
            time.sleep(0.2)
        stalled.close()
        assert bytes(ds.get_batch([big])[0]) == files["vol/big.raw"]


def test_an_extent_that_ends_early_pads_the_window_and_says_so(tmp_path):
    """Truncation between the residency check and the send: the window keeps its
    announced length (zeros), then ShortRead; the race is forced by reporting the
    pages cached."""
    store = ExtentStore(str(tmp_path))
    os.makedirs(os.path.dirname(store.extent_path(1, 0)))
    from dlfs.formats.disk_layout import HEADER_BYTES, encode_header
    with open(store.extent_path(1, 0), "wb") as f:
        f.write(encode_header(1, 0, time.time_ns()) + b"x" * 100_000)
    files = ExtentFiles(store)
    pieces = PieceColumns(np.array([0, 0]), np.array([HEADER_BYTES, HEADER_BYTES + 70_000]),
                          np.array([0, 70_000]), np.array([70_000, 70_000]))
    here, there = socket.socketpair()
    original = sendfiles.all_cached
    sendfiles.all_cached = lambda fds, offsets, sizes: True
    try:
        with pytest.raises(ShortRead) as raised:
            sendfiles.send(here, files, 1, pieces, b"HEAD")
    finally:
        sendfiles.all_cached = original
        here.close()
    got = bytearray()
    while chunk := there.recv(1 << 20):
        got += chunk
    assert bytes(got) == b"HEAD" + b"x" * 100_000 + bytes(40_000)
    assert (raised.value.extent_no, raised.value.got) == (0, 30_000)
    files.close()
