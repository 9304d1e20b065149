"""Stalled and hostile clients cannot starve the daemon: probes and metadata always answer."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dlfs
from dlfs import Client
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.trees import write_tree
from helpers.waiting import wait_until

MiB = 1024 * 1024
# Long enough that all six calls below are admitted or refused before the watchdog
# cancels the first stalled one, even on a loaded 2-core machine (at 3 s a slow
# start let a cancelled stream's slot go to a fifth call now and then).
STALL_S = 15


@pytest.fixture
def busy(daemon_factory, tmp_path):
    """A daemon with 8 RPC threads (4 for long calls) and a short stall timeout."""
    write_tree(tmp_path / "src", {f"big{i}": bytes([i]) * (9 * MiB) for i in range(4)})
    daemon = daemon_factory(extra_args=["--rpc-threads", "8", "--stream-stall-timeout-s",
                                        str(STALL_S)])
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    return daemon


def test_stalled_streams_leave_probes_and_metadata_answering(busy):
    # No BDP probing: the client's HTTP/2 window stays small, so a stream whose
    # reader stopped cannot be drained into the client's buffers and really
    # stalls (with the probe, gRPC sometimes grew the windows enough to take
    # all 36 MB, the calls finished, and the watchdog had nothing to cancel).
    options = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.http2.bdp_probe", 0)]
    channels = [grpc.insecure_channel(busy.address, options=options) for _ in range(6)]
    try:
        stalled = []
        for channel in channels:  # each asks for 36 MB and never reads a byte of it
            stream = dlfs_pb2_grpc.DlfsStub(channel).GetBatch(
                pb.GetBatchRequest(dataset="ds", ids=[0, 1, 2, 3]), timeout=120)
            stalled.append(stream)
        codes = []
        for stream in stalled:
            try:
                next(stream)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        # Four long calls at most (8 threads less the 4 kept for quick calls): the others
        # were refused at once, naming the limit.
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2
        with grpc.insecure_channel(busy.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with Client(busy.address, timeout_s=5) as client:
            assert client.status().uptime_s > 0
            assert client.stat("ds", "big1").size == 9 * MiB
            assert client.datasets() == ["ds"]
        # The watchdog cancels the streams that stopped moving: their threads come back.
        give_up = time.monotonic() + STALL_S + 30
        while True:
            with Client(busy.address) as client:
                if client.status().rpcs_in_flight <= 1:
                    break
            assert time.monotonic() < give_up, "stalled streams were never cancelled"
            time.sleep(0.2)
        assert "made no progress" in busy.log()
        with Client(busy.address, data_path=False) as client:
            assert bytes(client.get_batch([2], dataset="ds")[0][:3]) == b"\x02" * 3
    finally:
        for channel in channels:
            channel.close()


def test_an_ingest_that_sends_nothing_is_closed(busy):
    gate = threading.Event()

    def nothing():
        gate.wait(60)  # the stream opens, and no message ever comes
        return
        yield

    with grpc.insecure_channel(busy.address) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            dlfs_pb2_grpc.DlfsStub(channel).Ingest(nothing(), timeout=120)
        gate.set()
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert time.monotonic() - started < STALL_S + 30  # cancelled, not left to its deadline
    assert "Ingest" in busy.log() and "made no progress" in busy.log()


def test_a_lookup_reply_too_large_for_a_message_is_refused_before_it_is_built(daemon_factory,
                                                                              tmp_path):
    long_dir = "d" * 200
    write_tree(tmp_path / "src", {f"{long_dir}/{'n' * 200}{i:05d}": b"x" for i in range(3000)})
    daemon = daemon_factory(extra_args=["--message-bytes-max", str(3 * MiB),
                                        "--chunk-bytes", str(MiB)])
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        ds = client.dataset("ds")
        with pytest.raises(dlfs.InvalidArgument, match="ask for fewer at once"):
            ds.lookup(range(3000))
        assert len(ds.lookup(range(100))) == 100


def test_a_call_refused_for_its_token_takes_no_ticket(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("admin a-token-that-may-read-and-ingest\n")
    os.chmod(tokens, 0o600)
    token = "a-token-that-may-read-and-ingest"
    bearer = (("authorization", f"Bearer {token}"),)
    write_tree(tmp_path / "src", {"a": b"alpha"})
    daemon = daemon_factory(extra_args=["--rpc-threads", "8", "--stream-stall-timeout-s",
                                        str(STALL_S), "--tokens-file", str(tokens)])
    with Client(daemon.address, token=token) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    gate = threading.Event()

    def nothing():
        gate.wait(60)  # the stream opens, and no message comes until the test ends
        return
        yield

    channels = [grpc.insecure_channel(daemon.address) for _ in range(5)]
    ingests = []
    try:
        # Four authorized ingests that send nothing take every ticket for long calls (8
        # threads less the 4 kept for quick ones) until the stall watchdog ends them.
        ingests += [dlfs_pb2_grpc.DlfsStub(channel).Ingest.future(nothing(), timeout=60,
                                                                    metadata=bearer)
                    for channel in channels[:4]]
        with Client(daemon.address, token=token) as client:
            wait_until(lambda: client.status().rpcs_in_flight >= 5,  # and this Status call
                       "four ingests running", 30)
        stub = dlfs_pb2_grpc.DlfsStub(channels[4])
        # A call without a token is refused for that, and takes no ticket: it is not
        # told the tickets are gone (it was not entitled to one).
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.GetBatch(pb.GetBatchRequest(dataset="ds", ids=[0]), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # An authorized one is told the tickets are gone: they were.
        with pytest.raises(grpc.RpcError) as full:
            next(stub.GetBatch(pb.GetBatchRequest(dataset="ds", ids=[0]), timeout=30,
                               metadata=bearer))
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        gate.set()
        for ingest in ingests:
            ingest.cancel()
        for channel in channels:
            channel.close()


def test_a_stream_read_a_trickle_at_a_time_is_cut_off_at_its_deadline(daemon_factory, tmp_path):
    write_tree(tmp_path / "src", {"big": b"b" * (9 * MiB)})
    daemon = daemon_factory(extra_args=["--chunk-bytes", str(64 * 1024),
                                        "--stream-stall-timeout-s", "4"])
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    options = [("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(daemon.address, options=options) as channel:
        stream = dlfs_pb2_grpc.DlfsStub(channel).GetBatch(
            pb.GetBatchRequest(dataset="ds", ids=[0]), timeout=120)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as cut:
            for _message in stream:
                # One 64 KiB message a second: never a stall (4 s), but 144 s for 9 MiB.
                # The sleep is the client's pace under test, not a wait for the daemon.
                assert time.monotonic() - started < 40, "a trickle reader was never cut off"
                time.sleep(1.0)
    # Cut off at its deadline as a whole: 4 s plus the bytes it moved at 1 MiB/s (well
    # under a second's worth), found by the watchdog within a second or two.
    assert cut.value.code() == grpc.StatusCode.CANCELLED
    assert time.monotonic() - started < 20
    assert "slower than" in daemon.log()
