"""Co-located direct reads give the same bytes as reads through the daemon."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.client import named_checksum_error
from dlfs.client.transport.datapath_conn import DataPathConnection
from helpers.trees import write_tree


def test_direct_reads_match_daemon_reads(daemon, tmp_path):
    rng = np.random.default_rng(3)
    tree = {f"c{i % 5}/{i:04d}": rng.bytes(int(rng.integers(0, 9000))) for i in range(400)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote, Client(daemon.address, direct=True) as local:
        remote.ingest(str(tmp_path / "src"), "ds")
        ids = rng.integers(0, len(tree), 1000)
        assert [bytes(s) for s in local.get_batch(ids, dataset="ds")] == \
               [bytes(s) for s in remote.get_batch(ids, dataset="ds")]
        paths = sorted(tree)
        assert bytes(local.get_batch([paths[9]], dataset="ds")[0]) == tree[paths[9]]
        with pytest.raises(dlfs.InvalidArgument, match="sample id 400 is out of range"):
            local.get_batch([400], dataset="ds")
        # A replaced dataset: the direct reader notices its old extents are gone.
        write_tree(tmp_path / "v2", {"only": b"new"})
        remote.ingest(str(tmp_path / "v2"), "ds", replace=True)
        assert bytes(local.get_batch([0], dataset="ds")[0]) == b"new"


def test_direct_reads_need_the_daemons_unix_socket(daemon_factory, tmp_path):
    write_tree(tmp_path / "src", {"a": b"1"})
    daemon = daemon_factory(extra_args=["--data-socket", "none"])
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds")
    with Client(daemon.address, direct=True) as local:
        with pytest.raises(dlfs.FailedPrecondition, match="Unix socket"):
            local.get_batch([0], dataset="ds")


def test_a_foreign_daemons_socket_is_refused(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"1"})
    with Client(daemon.address, direct=True) as local:
        local.ingest(str(tmp_path / "src"), "ds")
        endpoint = local.transport.data_path().endpoint
    with pytest.raises(dlfs.FailedPrecondition, match="another daemon's data path"):
        DataPathConnection(endpoint, "", b"someone else....", connect_timeout_s=5,
                           reply_timeout_s=5)


def test_descriptors_go_to_the_daemons_user_or_a_token_holder(daemon_factory, tmp_path):
    """The data dir stays 0700; another user reads directly only with a token."""
    write_tree(tmp_path / "src", {"a": b"alpha"})
    token = "d" * 8 + "-direct-token-01"
    admin = "a" * 8 + "-direct-admin-01"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {token}\nadmin {admin}\n")
    os.chmod(tokens, 0o600)
    open_daemon = daemon_factory()
    guarded = daemon_factory(extra_args=["--tokens-file", str(tokens)])
    for d in (open_daemon, guarded):
        with Client(d.address, token=admin) as c:
            c.ingest(str(tmp_path / "src"), "ds")
        assert os.stat(d.data_dir).st_mode & 0o777 == 0o700
    # The reader becomes user nobody once everything it needs is imported (the
    # interpreter itself may live where nobody cannot read, as under /root).
    read = ("import os, sys, grpc, numpy, crc32c\n"
            "from dlfs.client.client import Client\n"
            "import dlfs.client.transport.direct_transport, dlfs.client.transport.datapath_pool, "
            "dlfs.client.ingest_upload\n"
            "os.setuid(65534)\n"
            "c = Client(sys.argv[1], direct=True, token=sys.argv[2])\n"
            "print(bytes(c.get_batch([0], dataset='ds')[0]).decode())")

    def as_nobody(address: str, token: str = ""):
        return subprocess.run([sys.executable, "-c", read, address, token], capture_output=True,
                              text=True, timeout=60)

    refused = as_nobody(open_daemon.address)
    assert refused.returncode != 0 and "PermissionDenied" in refused.stderr, refused.stderr
    assert "uid 65534 may not read this daemon's extents directly" in refused.stderr
    allowed = as_nobody(guarded.address, token)
    assert allowed.returncode == 0 and allowed.stdout.strip() == "alpha", allowed.stderr
    # Over TCP no daemon passes descriptors, whoever asks.
    with Client(open_daemon.address, data_path="tcp") as tcp:
        tcp.dataset("ds").get_batch([0])
        with pytest.raises(dlfs.PermissionDenied, match="only over the daemon's Unix socket"):
            tcp.transport.data_path().open_dataset("ds")


def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache, from util-linux fincore."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def test_prefetch_hints_warm_the_page_cache(daemon, tmp_path):
    rng = np.random.default_rng(4)
    tree = {f"{i:04d}": rng.bytes(64 * 1024) for i in range(64)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        ds = client.dataset("ds")
        [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
        extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
        fd = os.open(extent, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict the extent
        finally:
            os.close(fd)
        assert resident_bytes(extent) < 64 * 1024
        assert ds.prefetch(range(0, 64, 2)) is True
        deadline = time.monotonic() + 10
        while resident_bytes(extent) < 32 * 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 32 * 64 * 1024 <= resident_bytes(extent) < 48 * 64 * 1024  # hinted half only
        with pytest.raises(dlfs.InvalidArgument, match="out of range"):
            ds.prefetch([64])
        assert [bytes(s) for s in ds.get_batch(range(0, 64, 2))] == \
               [tree[f"{i:04d}"] for i in range(0, 64, 2)]


def test_direct_reads_report_corruption_and_truncation(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"A" * 5000, "b": b"B" * 5000})
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds")
    [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
    extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
    with open(extent, "r+b") as f:
        data = f.read()
        f.seek(data.index(b"A" * 5000) + 7)
        f.write(b"x")
    with Client(daemon.address, direct=True) as local:
        with pytest.raises(dlfs.DataCorruption, match="checksum mismatch for sample 0"):
            local.get_batch([0], dataset="ds")
        # The damaged sample second in a batch: the error names it, not the first.
        with pytest.raises(dlfs.DataCorruption, match="checksum mismatch for sample 0 "):
            local.get_batch([1, 0, 1], dataset="ds")
        assert bytes(local.get_batch([0], dataset="ds", verify=False)[0]).count(b"x") == 1
    os.truncate(extent, data.index(b"B" * 5000) + 10)
    with Client(daemon.address, direct=True) as local:
        assert bytes(local.get_batch([0], dataset="ds", verify=False)[0]).count(b"x") == 1
        with pytest.raises(dlfs.DataCorruption, match="is truncated: sample 1"):
            local.get_batch([1], dataset="ds")


@pytest.mark.parametrize("direct", [False, True])
def test_get_batch_carries_a_prefetch_hint(daemon_factory, tmp_path, direct):
    # No warm-up on first read: it would read the whole extent back in behind the test.
    daemon = daemon_factory(extra_args=["--warm-on-first-read", "off"])
    rng = np.random.default_rng(5)
    tree = {f"{i:04d}": rng.bytes(64 * 1024) for i in range(64)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds", replace=True)
    [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
    extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
    with Client(daemon.address, direct=direct) as client:
        client.get_batch([0], dataset="ds")
        fd = os.open(extent, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        before = resident_bytes(extent)
        got = client.get_batch([1], dataset="ds", prefetch=range(32, 64))
        assert bytes(got[0]) == tree["0001"]
        deadline = time.monotonic() + 10
        while resident_bytes(extent) < before + 32 * 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert resident_bytes(extent) >= before + 32 * 64 * 1024
        if direct:  # the co-located reader drops hint ids it does not know
            assert bytes(client.get_batch([1], dataset="ds", prefetch=[64])[0]) == tree["0001"]
        else:
            with pytest.raises(dlfs.InvalidArgument, match="sample id 64 is out of range"):
                client.get_batch([1], dataset="ds", prefetch=[64])


def test_one_sample_read_whole_is_checked_and_names_its_version(daemon, tmp_path):
    """`DirectReader.sample` (what a co-located mount reads a small file with): the
    bytes get_batch returns, a damaged byte raises naming the sample, and a
    version the daemon replaced is StaleGeneration."""
    rng = np.random.default_rng(8)
    tree = {f"{i:02d}": rng.bytes(size) for i, size in enumerate((0, 1, 4096, 110_000))}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote, Client(daemon.address, direct=True) as local:
        remote.ingest(str(tmp_path / "src"), "ds")
        reader = local.extent_reader("ds")
        with pytest.raises(dlfs.FailedPrecondition, match="direct=True"):
            remote.extent_reader("ds")  # the extents are mapped by direct clients only
        generation = local.dataset("ds").info.generation
        for sample_id, rel in enumerate(sorted(tree)):
            assert bytes(reader.sample(sample_id, generation=generation)) == tree[rel]
        [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
        with open(os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext"),
                  "r+b") as f:
            data = f.read()
            f.seek(data.index(tree["03"]) + 50_000)
            f.write(bytes([tree["03"][50_000] ^ 1]))
        with pytest.raises(dlfs.DataCorruption, match="checksum mismatch for sample 3") as info:
            reader.sample(3)
        assert info.value.sample_id == 3
        # The mount names the file it read (as reads through the daemon name it).
        named = named_checksum_error(info.value, lambda i: f"sample {i} '03' of dataset 'ds'")
        assert isinstance(named, dlfs.DataCorruption)
        assert "checksum mismatch for sample 3 '03' of dataset 'ds'" in named.message
        with pytest.raises(dlfs.InvalidArgument, match="out of range"):
            reader.sample(4)
        write_tree(tmp_path / "v2", {"only": b"new"})
        remote.ingest(str(tmp_path / "v2"), "ds", replace=True)
        with pytest.raises(dlfs.StaleGeneration):
            reader.sample(1, generation=generation)
        assert bytes(reader.sample(0)) == b"new"


def test_more_extents_than_the_open_files_limit_allows_says_so(daemon_factory, tmp_path):
    """The kernel installs passed descriptors only up to RLIMIT_NOFILE and drops the
    rest: the client says which limit to raise (it used to call that a protocol error
    of the daemon), and reads through the daemon still work."""
    import resource

    daemon = daemon_factory(extra_args=["--extent-bytes-max", "65536"])
    tree = {f"{i:03d}": os.urandom(20_000) for i in range(300)}  # about 100 extents
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with Client(daemon.address, direct=True) as local:
        # Room for the connections, not for the extents.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 30, hard))
        try:
            with pytest.raises(dlfs.FailedPrecondition, match="RLIMIT_NOFILE"):
                local.transport.extent_reader("ds")
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert bytes(local.get_batch([7], dataset="ds")[0]) == tree["007"]
