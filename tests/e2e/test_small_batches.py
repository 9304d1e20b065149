"""GetSmallBatch: small batches as one unary call, and the fall-back to the stream."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from dlfs import Client, limits
from dlfs.formats import grpc_chunks
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.daemons import metric_samples
from helpers.trees import write_tree

CHUNK = 64 * 1024  # the daemon's --chunk-bytes: one unary reply carries at most this


@pytest.fixture
def loaded(daemon_factory, tmp_path):
    rng = np.random.default_rng(3)
    files = {f"small/{i:02d}": rng.bytes(1000 + i) for i in range(40)}
    files.update({f"large/{i}": rng.bytes(CHUNK + 1 + i) for i in range(3)})
    write_tree(tmp_path / "src", files)
    daemon = daemon_factory(extra_args=["--chunk-bytes", str(CHUNK), "--metrics-listen",
                                        "127.0.0.1:0"])
    with Client(daemon.address, data_path=False) as client:  # the gRPC read methods
        client.ingest(str(tmp_path / "src"), "ds")
    return daemon, files


def served_by_method(client: Client) -> dict[str, float]:
    """dlfs_reads_total per method, from the daemon's Prometheus endpoint."""
    return {dict(labels)["method"]: value for (name, labels), value in
            metric_samples(client).items() if name == "dlfs_reads_total"}


def test_small_batches_take_one_unary_call(loaded):
    daemon, files = loaded
    paths = sorted(files)
    with Client(daemon.address, data_path=False) as client:  # the gRPC read methods
        ds = client.dataset("ds")
        ids = [paths.index(f"small/{i:02d}") for i in (5, 1, 5, 30)]
        assert [bytes(s) for s in ds.get_batch(ids)] == [files[paths[i]] for i in ids]
        assert bytes(ds.read("small/07")) == files["small/07"]  # a whole sample: a batch of one
        assert bytes(ds.read("small/07", 10, 5)) == files["small/07"][10:15]  # a range: stream
        big = list(range(limits.small_batch_samples_max + 1))
        assert [bytes(s) for s in ds.get_batch(big)] == [files[paths[i]] for i in big]
        counts = served_by_method(client)
    assert counts == {"GetSmallBatch": 2, "ReadRange": 1, "GetBatch": 1}


def test_a_reply_larger_than_one_message_falls_back_to_the_stream(loaded):
    daemon, files = loaded
    with Client(daemon.address, data_path=False) as client:  # the gRPC read methods
        got = client.get_batch(["large/0", "small/00", "large/2"], dataset="ds")
        assert [bytes(s) for s in got] == [files["large/0"], files["small/00"], files["large/2"]]
        assert served_by_method(client) == {"GetBatch": 1}  # refused unary calls serve nothing
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetSmallBatch(pb.GetBatchRequest(dataset="ds", paths=["large/1"]), timeout=10)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert dict(caught.value.trailing_metadata())["dlfs-error"] == "ReplyTooLarge"
        assert "use GetBatch" in caught.value.details()
        raw = channel.unary_unary("/dlfs.v1.Dlfs/GetSmallBatch",
                                  request_serializer=pb.GetBatchRequest.SerializeToString,
                                  response_deserializer=None)
        header, payload = grpc_chunks.decode_chunk(raw(pb.GetBatchRequest(
            dataset="ds", paths=["small/03", "small/04"]), timeout=10))
        assert header.payload_bytes == len(payload) == 1003 + 1004
        assert bytes(payload) == files["small/03"] + files["small/04"]
