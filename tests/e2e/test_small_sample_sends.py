"""Small cached samples sent from mappings of their extents, against real daemons with
worker processes: the bytes on both sockets, the switch, status and metrics, a replace
while clients read, and the page cache given back once the daemon is idle."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers.daemons import metric_samples
from helpers.trees import write_tree
from dlfs import Client, limits
from dlfs.formats import datapath_frames as frames
from helpers.hostile_peers import read_frame, welcomed
from dlfs.staging.progress import human_bytes
from helpers.page_cache import cached


def small_tree(root, count: int = 600, salt: int = 0) -> dict[str, bytes]:
    """`count` samples of 1-6 KB whose bytes say which sample (and which `salt`) they are."""
    rng = np.random.default_rng(salt)
    files = {}
    for i in range(count):
        size = int(rng.integers(1000, 6000))
        files[f"s/{i:04d}.bin"] = (f"{salt}:{i}:".encode() * size)[:size]
    write_tree(root, files)
    return files


def shuffled(count: int) -> np.ndarray:
    """Every sample id in an order where no two neighbours are joined into one piece
    (a run of neighbours is a large piece: sendfile's, not the mappings')."""
    return np.random.default_rng(7).permutation(count)


def mapped(client) -> float:
    return metric_samples(client).get(("dlfs_mapped_send_bytes_total", ()), 0.0)


def read_until_mapped(ds, ids, expected, client, timeout_s: float = 10.0) -> None:
    """Read `ids` until a reply went out from the mappings (the daemon maps an extent in
    the background after a read wanted it); every reply must be right."""
    give_up = time.monotonic() + timeout_s
    while True:
        before = mapped(client)
        assert [bytes(s) for s in ds.get_batch(ids)] == expected
        if mapped(client) > before:
            return
        assert time.monotonic() < give_up, "no reply was ever sent from a mapping"
        time.sleep(0.05)


def serving_mapped(daemon_factory, root, files: dict[str, bytes]):
    """A daemon serving `files` (from `root`) as dataset "ds", read until its replies go
    out from mappings."""
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    paths = sorted(files)
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(root), "ds")
        ids = shuffled(len(paths))
        read_until_mapped(client.dataset("ds"), ids, [files[paths[i]] for i in ids], client)
    return daemon


@pytest.mark.parametrize("residency", ["cachestat", "mincore"])
def test_small_cached_samples_go_from_mappings_on_either_socket(daemon_factory, tmp_path,
                                                                residency, monkeypatch):
    if residency == "mincore":
        monkeypatch.setenv("DLFS_RESIDENCY", "mincore")  # the daemon runs as on an older kernel
    state = "on" if residency == "cachestat" else \
        "on (residency by mincore: this kernel has no cachestat(2), Linux 6.5+)"
    files = small_tree(tmp_path / "src")
    paths = sorted(files)
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    ids = shuffled(len(paths))[:300]
    expected = [files[paths[i]] for i in ids]
    for transport in ("unix", "tcp"):
        with Client(daemon.address, data_path=transport) as client:
            if transport == "unix":
                client.ingest(str(tmp_path / "src"), "ds")
            ds = client.dataset("ds")
            read_until_mapped(ds, ids, expected, client)
            # Duplicates, and a batch in any order: each piece from its own place.
            twice = np.concatenate([ids[:50], ids[:50][::-1]])
            assert [bytes(s) for s in ds.get_batch(twice)] == [files[paths[i]] for i in twice]
    with Client(daemon.address, data_path="tcp") as client:
        status = client.status()
        assert status.mapped_sends == f"{state}; whole replies sent by C"
        assert status.mapped_send_bytes == mapped(client) > 0
    out = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                          "status"], capture_output=True, text=True, timeout=60).stdout
    assert f"  cached samples sent from mapped extents: {state}; whole replies sent by C; " \
           f"{human_bytes(status.mapped_send_bytes)} sent so far\n" in out


def raw_batch(port: int, ids) -> tuple[bytes, list[int]]:
    """(payload, each DATA frame's size) of GET_BATCH `ids` of "ds", through the
    protocol itself over TCP."""
    with welcomed(("tcp", port)) as sock:
        for buffer in frames.get_batch("ds", ids):
            sock.sendall(buffer)
        kind, body = read_frame(sock)
        assert kind == frames.Kind.BATCH
        reply = frames.parse_batch_header(body)
        payload, sizes = bytearray(), []
        while len(payload) < reply.payload_bytes:
            kind, body = read_frame(sock)
            assert kind == frames.Kind.DATA
            sizes.append(len(body))
            payload += body
    return bytes(payload), sizes


def test_a_reply_of_many_windows_goes_from_mappings_a_frame_per_window(daemon_factory, tmp_path,
                                                                       daemon_send):
    """A reply of some thirty windows (64 KiB windows, 2 MB of small samples) goes out
    from the mappings whole, still as DATA frames of at most a window each: read
    through the protocol itself, and by a client.  Its last window holds too few
    samples to go from mappings on its own (`limits.mapped_pieces_min`): only a
    send of the whole reply takes it that way."""
    files = small_tree(tmp_path / "src")
    paths = sorted(files)
    window = 64 * 1024
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--chunk-bytes", str(window)])
    ids = shuffled(len(paths))
    ends = np.cumsum([len(files[paths[i]]) for i in ids])
    ids = ids[:max(n for n in range(1, len(ids) + 1)
                   if ends[n - 1] > 20 * window and 0 < ends[n - 1] % window < 8000)]
    expected = [files[paths[i]] for i in ids]
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(tmp_path / "src"), "ds")
        port = client.transport.data_path().tcp_port
        give_up = time.monotonic() + 10
        while True:  # until a serving process found every extent mapped
            before = mapped(client)
            payload, sizes = raw_batch(port, ids)
            assert payload == b"".join(expected)
            assert len(sizes) == -(-len(payload) // window) > 20
            assert all(size == window for size in sizes[:-1])
            if mapped(client) - before == len(payload):
                break
            assert time.monotonic() < give_up, "no reply ever went out whole from mappings"
            time.sleep(0.05)
        assert [bytes(s) for s in client.dataset("ds").get_batch(ids)] == expected
        # Status says which send that was; so does the daemon's log.
        sender = "C" if daemon_send == "native" else "Python (DLFS_NATIVE=0)"
        assert client.status().mapped_sends == f"on; whole replies sent by {sender}"
    assert f"cached samples sent from mapped extents: on; whole replies sent by {sender}" in \
        open(daemon.log_path).read()


def test_the_switch_keeps_the_read_path(daemon_factory, tmp_path):
    files = small_tree(tmp_path / "src")
    paths = sorted(files)
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--mapped-sends", "off"])
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(tmp_path / "src"), "ds")
        ds = client.dataset("ds")
        for _ in range(20):
            assert [bytes(s) for s in ds.get_batch(range(len(paths)))] == \
                [files[p] for p in paths]
        assert mapped(client) == 0
        status = client.status()
        assert (status.mapped_sends, status.mapped_send_bytes) == \
            ("off (--mapped-sends off)", 0)


def test_a_replace_while_clients_read_from_mappings_never_mixes_versions(daemon_factory,
                                                                          tmp_path, daemon_send):
    """Four clients read the mapped version while it is replaced: every batch is wholly
    one version, and the old version's extents are freed once the reads let go."""
    old = small_tree(tmp_path / "old", salt=1)
    new = small_tree(tmp_path / "new", salt=2)
    paths = sorted(old)
    daemon = serving_mapped(daemon_factory, tmp_path / "old", old)
    stop = threading.Event()
    seen: list[set] = [set() for _ in range(4)]
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        rng = np.random.default_rng(k)
        try:
            with Client(daemon.address, data_path="tcp") as client:
                ds = client.dataset("ds")
                while not stop.is_set():
                    batch = rng.permutation(len(paths))[:200]
                    got = [bytes(s) for s in ds.get_batch(batch)]
                    salts = {g.split(b":", 1)[0] for g in got}
                    assert len(salts) == 1, f"a batch mixed versions: {salts}"
                    version = old if salts == {b"1"} else new
                    assert got == [version[paths[i]] for i in batch]
                    seen[k] |= salts
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(tmp_path / "new"), "ds", replace=True)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors[0]
        assert all(s == {b"1", b"2"} or s == {b"2"} for s in seen)
        ids = shuffled(len(paths))
        read_until_mapped(client.dataset("ds"), ids, [new[paths[i]] for i in ids], client)
    # One version's extents on disk: the old one's were unmapped and removed.
    extent_dirs = os.listdir(os.path.join(daemon.data_dir, "extents"))
    give_up = time.monotonic() + 10
    while len(extent_dirs) != 1 and time.monotonic() < give_up:
        time.sleep(0.1)
        extent_dirs = os.listdir(os.path.join(daemon.data_dir, "extents"))
    assert len(extent_dirs) == 1


def test_an_idle_daemon_lets_the_page_cache_drop_its_extents(daemon_factory, tmp_path):
    files = small_tree(tmp_path / "src")
    daemon = serving_mapped(daemon_factory, tmp_path / "src", files)
    extent_dir = os.path.join(daemon.data_dir, "extents")
    (dataset_dir,) = os.listdir(extent_dir)
    path = os.path.join(extent_dir, dataset_dir, sorted(os.listdir(
        os.path.join(extent_dir, dataset_dir)))[0])
    size = os.path.getsize(path)
    time.sleep(2 * limits.extent_map_idle_s + 0.5)  # idle: the workers unmapped it
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert not cached(path, 0, size)
