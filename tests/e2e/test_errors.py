"""Every user-facing error: exact type, status code and message; the daemon survives."""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.trees import unique_name, write_tree


@pytest.fixture(scope="module")
def loaded(shared_daemon, tmp_path_factory):
    """A dataset of 20 small samples on the module's daemon."""
    source = tmp_path_factory.mktemp("src")
    tree = {f"d/{i:02d}.bin": bytes([i]) * (i + 1) for i in range(20)}
    write_tree(source, tree)
    name = unique_name()
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name)
    return name, tree


def raw_stub(address):
    channel = grpc.insecure_channel(address)
    return channel, dlfs_pb2_grpc.DlfsStub(channel)


def assert_still_serving(client, name, tree):
    assert bytes(client.get_batch([3], dataset=name)[0]) == tree["d/03.bin"]


CASES = [
    # (keys, error type, message fragment)
    ([20], dlfs.InvalidArgument, "sample id 20 is out of range for dataset '{name}': valid ids are 0..19"),
    ([-1], dlfs.InvalidArgument, "sample id -1 is out of range"),
    ([2**63 - 1], dlfs.InvalidArgument, "out of range"),
    (["d/nope.bin"], dlfs.NotFound, "dataset '{name}' has no sample 'd/nope.bin'"),
    (["nodir/x"], dlfs.NotFound, "has no path 'nodir/x'"),
    ([""], dlfs.InvalidArgument, "path is empty"),
    (["/abs"], dlfs.InvalidArgument, "is absolute"),
    (["d/../x"], dlfs.InvalidArgument, "'..' components"),
    (["d//x"], dlfs.InvalidArgument, "empty, '.' and '..'"),
    (["a\0b"], dlfs.InvalidArgument, "NUL byte"),
    (["x" * 5000], dlfs.InvalidArgument, "over the limit of 4096"),
    (["d"], dlfs.InvalidArgument, "is a directory, not a sample"),
    ([1, "d/01.bin"], dlfs.InvalidArgument, "either integer sample ids or string paths"),
    ([1.5], dlfs.InvalidArgument, "either integer sample ids or string paths"),
    ([2**64], dlfs.InvalidArgument, "signed 64-bit"),
]


@pytest.mark.parametrize("keys,error,fragment", CASES)
def test_bad_batches(shared_client, loaded, keys, error, fragment):
    name, tree = loaded
    with pytest.raises(error) as info:
        shared_client.get_batch(keys, dataset=name)
    assert fragment.format(name=name) in str(info.value)
    assert_still_serving(shared_client, name, tree)


def test_status_codes_on_the_wire(shared_daemon, loaded):
    name, _ = loaded
    channel, stub = raw_stub(shared_daemon.address)
    with channel:
        cases = [
            (pb.GetBatchRequest(dataset=name, ids=[99]), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.GetBatchRequest(dataset=name, paths=["zz"]), grpc.StatusCode.NOT_FOUND),
            (pb.GetBatchRequest(dataset="no-such", ids=[0]), grpc.StatusCode.NOT_FOUND),
            (pb.GetBatchRequest(dataset="bad name!", ids=[0]), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.GetBatchRequest(dataset=name, ids=[0], paths=["d/00.bin"]),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]
        for request, code in cases:
            with pytest.raises(grpc.RpcError) as info:
                list(stub.GetBatch(request, timeout=10))
            assert info.value.code() == code, request
        with pytest.raises(grpc.RpcError) as info:
            stub.Stat(pb.StatRequest(dataset=name, path="missing"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            stub.DeleteDataset(pb.DeleteDatasetRequest(dataset="no-such"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_unknown_dataset(shared_client):
    with pytest.raises(dlfs.NotFound, match="no dataset named 'nope'"):
        shared_client.dataset("nope")
    with pytest.raises(dlfs.InvalidArgument, match="dataset name '../x' is malformed"):
        shared_client.dataset("../x")


def test_oversized_batch_names_the_limit(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--batch-ids-max", "8", "--batch-bytes-max", "100"])
    write_tree(tmp_path / "src", {f"{i}": b"x" * 30 for i in range(10)})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "small")
        with pytest.raises(dlfs.InvalidArgument, match=r"batch of 9 samples exceeds the limit of 8 \(--batch-ids-max\)"):
            client.get_batch(list(range(9)), dataset="small")
        with pytest.raises(dlfs.InvalidArgument, match=r"holds 120 bytes, over the limit of 100 \(--batch-bytes-max\)"):
            client.get_batch([0, 1, 2, 3], dataset="small")
        assert len(client.get_batch([0, 1, 2], dataset="small")) == 3
        # The data path sends a duplicate each time it is asked for: the limit counts it.
        with pytest.raises(dlfs.InvalidArgument, match=r"holds 150 bytes"):
            client.get_batch([0, 0, 0, 0, 0], dataset="small")
    with Client(daemon.address, data_path=False) as client:
        assert len(client.get_batch([0, 0, 0, 0, 0], dataset="small")) == 5  # duplicates read once


def test_both_front_doors_refuse_an_oversized_batch_with_one_message(daemon_factory, tmp_path):
    # One set of batch limits in the daemon: the data path and gRPC give the same
    # InvalidArgument, word for word, for too many samples, too many bytes, too long a range.
    daemon = daemon_factory(extra_args=["--batch-ids-max", "8", "--batch-bytes-max", "100"])
    write_tree(tmp_path / "src", {f"{i}": b"x" * 30 for i in range(10)} | {"big": b"y" * 300})
    answers = {}
    for data_path in (True, False):
        with Client(daemon.address, data_path=data_path) as client:
            if data_path:
                client.ingest(str(tmp_path / "src"), "small")
            ds = client.dataset("small")
            for name, call in (("ids", lambda: ds.get_batch(list(range(9)))),
                               ("bytes", lambda: ds.get_batch(list(range(4)))),
                               ("range", lambda: ds.read("big", 0, 200))):
                with pytest.raises(dlfs.InvalidArgument) as raised:
                    call()
                answers[name, data_path] = str(raised.value)
    for name in ("ids", "bytes", "range"):
        assert answers[name, True] == answers[name, False], name
    assert "batch of 9 samples exceeds the limit of 8 (--batch-ids-max)" in answers["ids", True]
    assert "holds 120 bytes, over the limit of 100 (--batch-bytes-max)" in answers["bytes", True]
    assert "a range of 200 bytes is over the limit of 100 (--batch-bytes-max)" in \
        answers["range", True]


def test_daemon_down_is_unavailable_with_the_address(daemon):
    address = daemon.address
    daemon.stop()
    with Client(address, reconnect_timeout_s=0.3) as client:
        with pytest.raises(dlfs.Unavailable, match=f"DLFS daemon at {address} is unavailable"):
            client.datasets()
        with pytest.raises(dlfs.Unavailable, match=address):
            client.get_batch([0], dataset="x")


def test_reads_wait_for_a_restarting_daemon(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"alpha"})
    with Client(daemon.address, reconnect_timeout_s=20) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        port = daemon.address.rpartition(":")[2]
        daemon.stop()
        restarter = threading.Timer(1.0, daemon.start, args=(f"127.0.0.1:{port}",))
        restarter.start()
        try:
            assert bytes(client.get_batch([0], dataset="ds")[0]) == b"alpha"
        finally:
            restarter.join()


def test_corrupt_extent_is_data_loss_naming_the_sample(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000, "c.bin": b"C" * 1000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    extent_dir = os.path.join(daemon.data_dir, "extents")
    [dataset_dir] = os.listdir(extent_dir)
    extent = os.path.join(extent_dir, dataset_dir, "000000.ext")
    with open(extent, "r+b") as f:
        data = f.read()
        position = data.index(b"B" * 1000) + 500
        f.seek(position)
        f.write(b"X")
    daemon.restart()  # drop any cached handle; the corruption is on disk
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.DataCorruption, match="checksum mismatch for sample 1 'b.bin' of dataset 'ds'"):
            client.get_batch([0, 1, 2], dataset="ds")
        assert [bytes(s) for s in client.get_batch([0, 2], dataset="ds")] == [b"A" * 1000, b"C" * 1000]
        assert bytes(client.get_batch([1], dataset="ds", verify=False)[0]).count(b"X") == 1


def test_reingest_needs_replace_and_replace_is_atomic(shared_client, tmp_path):
    name = unique_name()
    write_tree(tmp_path / "v1", {"a": b"one"})
    write_tree(tmp_path / "v2", {"a": b"two", "b": b"new"})
    shared_client.ingest(str(tmp_path / "v1"), name)
    with pytest.raises(dlfs.AlreadyExists, match=f"dataset '{name}' exists; pass --replace"):
        shared_client.ingest(str(tmp_path / "v2"), name)
    assert bytes(shared_client.get_batch([0], dataset=name)[0]) == b"one"
    info = shared_client.ingest(str(tmp_path / "v2"), name, replace=True)
    assert info.samples == 2
    assert [bytes(s) for s in shared_client.get_batch(["a", "b"], dataset=name)] == [b"two", b"new"]


def test_delete(shared_client, tmp_path):
    name = unique_name()
    write_tree(tmp_path, {"a": b"1"})
    shared_client.ingest(str(tmp_path), name)
    assert name in shared_client.datasets()
    assert shared_client.delete(name).samples == 1
    assert name not in shared_client.datasets()
    with pytest.raises(dlfs.NotFound):
        shared_client.get_batch([0], dataset=name)
    with pytest.raises(dlfs.NotFound):
        shared_client.delete(name)


def test_ingest_errors_keep_nothing(shared_client, tmp_path):
    with pytest.raises(dlfs.NotFound, match="source directory"):
        shared_client.ingest(str(tmp_path / "missing"), unique_name())
    with pytest.raises(dlfs.InvalidArgument, match="malformed"):
        shared_client.ingest(str(tmp_path), "bad/name")


def test_malformed_ingest_streams_are_refused(shared_daemon, shared_client):
    channel, stub = raw_stub(shared_daemon.address)
    name = unique_name()

    def piece(**kw):
        return pb.IngestPiece(**kw)

    def ended(messages, files=None, data_bytes=None):
        """`messages` closed with a correct `end` (or the counts given)."""
        pieces = [p for m in messages for p in m.pieces]
        end = pb.IngestEnd(files=sum(bool(p.path) for p in pieces) if files is None else files,
                           bytes=sum(len(p.data) for p in pieces) if data_bytes is None
                           else data_bytes)
        return [*messages, pb.IngestMessage(end=end)]

    def started(*pieces):
        return [pb.IngestMessage(start=pb.IngestStart(dataset=name)),
                pb.IngestMessage(pieces=list(pieces))]

    complete = started(piece(path="a", size=1, data=b"x"))
    streams = {
        "no start": [pb.IngestMessage(pieces=[piece(path="a", size=1, data=b"x")])],
        "too much data": ended(started(piece(path="a", size=1, data=b"xy"))),
        "short file": ended(started(piece(path="a", size=5, data=b"x"))),
        "no end": complete,
        "end miscounts files": ended(complete, files=2),
        "end miscounts bytes": ended(complete, data_bytes=7),
        "message after end": [*ended(complete), pb.IngestMessage()],
        "duplicate": ended(started(piece(path="a", size=1, data=b"x"),
                                   piece(path="a", size=1, data=b"y"))),
        "file and dir": ended(started(piece(path="a", size=1, data=b"x"),
                                      piece(path="a/b", size=1, data=b"y"))),
        "bad path": ended(started(piece(path="../etc/passwd", size=1, data=b"x"))),
        "bad crc": ended(started(piece(path="a", size=1, data=b"x", crc32c=123))),
        "empty": [],
    }
    expected = {"bad crc": grpc.StatusCode.DATA_LOSS, "no end": grpc.StatusCode.CANCELLED}
    with channel:
        for label, messages in streams.items():
            with pytest.raises(grpc.RpcError) as info:
                stub.Ingest(iter(messages), timeout=10)
            assert info.value.code() == expected.get(label, grpc.StatusCode.INVALID_ARGUMENT), label
            assert name not in shared_client.datasets(), label
    extents = os.path.join(shared_daemon.data_dir, "extents")
    live = {d.name for d in shared_client.dataset_infos()}
    assert len(os.listdir(extents)) == len(live)  # aborted ingests left no extents behind


def test_numpy_ids_and_empty_batches(shared_client, loaded):
    name, tree = loaded
    ids = np.array([5, 1, 5], dtype=np.int32)
    assert [bytes(s) for s in shared_client.get_batch(ids, dataset=name)] == [
        tree["d/05.bin"], tree["d/01.bin"], tree["d/05.bin"]]
    assert shared_client.get_batch([], dataset=name) == []
