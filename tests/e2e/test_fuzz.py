"""Hostile requests straight at the service: each gets a clear status, the daemon survives,
nothing on disk changes."""

from __future__ import annotations

import hashlib
import os

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlfs import Client
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.trees import write_tree

CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED}

ids = st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-5, 40))
nasty_text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(["", "/", "..", "../x", "/etc/passwd", "a//b", "a/./b", "\x00", "a\x00b",
                     "x" * 5000, "ü/" * 3000, "d/../../etc", "d/00.bin/", " "]),
)
names = st.one_of(st.sampled_from(["fz", "nope", "", "../fz", "a" * 500, "fz\x00"]), nasty_text)


@pytest.fixture(scope="module")
def target(shared_daemon, tmp_path_factory):
    source = tmp_path_factory.mktemp("fz")
    write_tree(source, {f"d/{i:02d}.bin": bytes([i]) * 100 for i in range(30)})
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), "fz")
    channel = grpc.insecure_channel(shared_daemon.address)
    yield dlfs_pb2_grpc.DlfsStub(channel), shared_daemon
    channel.close()


def disk_state(data_dir):
    digest = hashlib.sha256()
    for root, _dirs, files in sorted(os.walk(data_dir)):
        for name in sorted(files):
            if name in ("LOCK", "daemon-token"):
                continue
            with open(os.path.join(root, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()


def call(stub, method, request):
    try:
        reply = getattr(stub, method)(request, timeout=10)
        if method in ("GetBatch", "ReadRange", "GetIndex", "Scrub"):
            list(reply)
        return None
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


requests = st.one_of(
    st.builds(lambda d, i, p: ("GetBatch", pb.GetBatchRequest(dataset=d, ids=i, paths=p)),
              names, st.lists(ids, max_size=5), st.lists(nasty_text, max_size=3)),
    st.builds(lambda d, i, h: ("GetBatch", pb.GetBatchRequest(dataset=d, ids=i, prefetch_ids=h)),
              st.just("fz"), st.lists(st.integers(0, 29), max_size=3), st.lists(ids, max_size=3)),
    st.builds(lambda d, p: ("Stat", pb.StatRequest(dataset=d, path=p)), names, nasty_text),
    st.builds(lambda d, p, a, n: ("ListDir", pb.ListDirRequest(dataset=d, path=p, start_after=a,
                                                                page_size=n)),
              names, nasty_text, nasty_text, st.integers(0, 2**32 - 1)),
    st.builds(lambda d, i, p: ("Lookup", pb.LookupRequest(dataset=d, ids=i, paths=p)),
              names, st.lists(ids, max_size=4), st.lists(nasty_text, max_size=3)),
    st.builds(lambda d, i, p, o, n: ("ReadRange", pb.ReadRangeRequest(dataset=d, id=i, path=p,
                                                                      offset=o, length=n)),
              names, ids, nasty_text, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    st.builds(lambda d, i: ("Prefetch", pb.PrefetchRequest(dataset=d, ids=i)),
              names, st.lists(ids, max_size=5)),
    st.builds(lambda d: ("GetDataset", pb.GetDatasetRequest(dataset=d)), names),
    st.builds(lambda d: ("GetIndex", pb.GetIndexRequest(dataset=d)), names),
    st.builds(lambda d: ("DeleteDataset", pb.DeleteDatasetRequest(dataset=d)),
              names.filter(lambda n: n != "fz")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests)
def test_hostile_requests_get_clear_errors(target, request):
    stub, daemon = target
    before = disk_state(daemon.data_dir)
    method, message = request
    outcome = call(stub, method, message)
    if outcome is not None:
        code, details = outcome
        assert code in CLEAR, (method, message, code, details)
        assert details and "internal error" not in details
    assert disk_state(daemon.data_dir) == before
    assert call(stub, "GetBatch", pb.GetBatchRequest(dataset="fz", ids=[3])) is None


def test_hostile_ingest_paths_are_refused(target):
    stub, daemon = target
    for path in ["../escape", "/abs", "a/../../b", "a\x00b", "", "a//b", "x" * 5000]:
        messages = [pb.IngestMessage(start=pb.IngestStart(dataset="evil")),
                    pb.IngestMessage(pieces=[pb.IngestPiece(path=path or "ok", size=1, data=b"x"),
                                             pb.IngestPiece(path=path, size=1, data=b"y")])]
        with pytest.raises(grpc.RpcError) as info:
            stub.Ingest(iter(messages), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
    assert not any("evil" in d for d in os.listdir(daemon.data_dir))


def test_invalid_utf8_on_the_wire_is_refused(target):
    stub, daemon = target
    channel = grpc.insecure_channel(daemon.address)
    raw = channel.unary_unary("/dlfs.v1.Dlfs/Stat", request_serializer=None,
                              response_deserializer=None)
    # StatRequest with dataset "fz" and a path of invalid UTF-8 bytes, hand-encoded.
    request = b"\x0a\x02fz" + b"\x12\x03\xff\xfe/"
    with pytest.raises(grpc.RpcError) as info:
        raw(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be UTF-8" in info.value.details()
    channel.close()
    assert call(stub, "GetBatch", pb.GetBatchRequest(dataset="fz", ids=[3])) is None
