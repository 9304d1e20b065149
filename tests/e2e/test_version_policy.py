"""The version policy (dlfs/version.py): client and daemon of one minor release talk,
others are refused once, at the handshake or the first gRPC call, naming both
releases and what to install.  A real daemon, raw peers of other releases."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest

import dlfs
from dlfs import Client
from dlfs.client.transport.datapath_conn import DataPathConnection, Endpoint
from dlfs.formats import datapath_frames as frames
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from dlfs.version import VERSION_METADATA, interoperates
from helpers.hostile_peers import connect, read_frame

OTHER_MINOR = "0.99.0"


def test_releases_interoperate_within_one_minor_only():
    assert interoperates("0.1.7", "0.1.0") and interoperates(dlfs.__version__)
    assert not interoperates("0.2.0", "0.1.0") and not interoperates("1.1.0", "0.1.0")
    assert not interoperates("", "0.1.0") and not interoperates("garbage", "0.1.0")


def data_path_port(daemon) -> int:
    with Client(daemon.address, data_path="tcp") as client:
        return client.transport.data_path().tcp_port


@pytest.mark.parametrize("hello", [
    frames.hello("", release=OTHER_MINOR),
    # A HELLO of the layout before releases (version 1): read as far as its version.
    frames.frame(frames.Kind.HELLO, 12) + frames.HELLO_MAGIC + (1).to_bytes(2, "little")
    + (0).to_bytes(2, "little"),
], ids=["another minor", "another layout"])
def test_a_client_of_another_release_is_refused_at_hello(daemon, hello):
    with connect(("tcp", data_path_port(daemon))) as sock:
        sock.sendall(hello)
        kind, body = read_frame(sock)
        assert kind == frames.Kind.ERROR
        error = frames.parse_error(body, "daemon")
        assert type(error) is dlfs.VersionMismatch
        assert f"this daemon is DLFS {dlfs.__version__}" in error.message
        assert "from a checkout of DLFS 0.1: pip install ." in error.message
        if b"0.99" in hello:
            assert "the client is DLFS 0.99.0" in error.message
        assert read_frame(sock) == (0, b"")  # and closed


def test_a_daemon_of_another_release_is_refused_at_welcome(tmp_path):
    """The client checks WELCOME's release: a scripted daemon of another minor."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(frames.welcome(4 << 20, b"i" * 16, frames.DaemonLimits(
                1024, 1 << 30, frames.request_bytes_max(1024)), release=OTHER_MINOR))
            conn.recv(1)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    endpoint = Endpoint(socket.AF_INET, listener.getsockname(), "scripted")
    with pytest.raises(dlfs.VersionMismatch, match=r"this client is DLFS .* and the daemon is "
                                                  r"DLFS 0\.99\.0"):
        DataPathConnection(endpoint, "", b"", connect_timeout_s=5.0, reply_timeout_s=5.0)
    listener.close()
    server.join(10)


def test_a_grpc_call_of_another_release_is_refused_and_one_without_is_served(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListDatasets(pb.ListDatasetsRequest(), timeout=10,
                              metadata=((VERSION_METADATA, OTHER_MINOR),))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "the client is DLFS 0.99.0" in refused.value.details()
        assert dict(refused.value.trailing_metadata())["dlfs-error"] == "VersionMismatch"
        stub.ListDatasets(pb.ListDatasetsRequest(), timeout=10)  # grpcurl, a probe
        stub.ListDatasets(pb.ListDatasetsRequest(), timeout=10,
                          metadata=((VERSION_METADATA, dlfs.__version__),))
    with Client(daemon.address) as client:  # a client of this release says so, and is served
        assert client.datasets() == []
