"""Frames of the data path: every encoder's output parses back; garbage raises FrameError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlfs
from dlfs import errors
from dlfs.formats import datapath_frames as frames


def split(frame: bytes) -> tuple[int, bytes]:
    kind, _flags, length = frames.parse_frame(frame[:frames.FRAME.size])
    body = frame[frames.FRAME.size:]
    assert len(body) == length
    return kind, body


def test_hello_round_trip_carries_the_clients_release():
    kind, body = split(frames.hello("s3cr3t-token-0123"))
    assert kind == frames.Kind.HELLO
    assert frames.parse_hello(body) == (frames.VERSION, dlfs.__version__, "s3cr3t-token-0123")
    other = split(frames.hello("", release="0.2.0"))[1]
    assert frames.parse_hello(other).release == "0.2.0"


def test_a_hello_of_another_layout_is_read_as_far_as_its_version():
    """A client of another layout (a release before HELLO carried releases): its version
    is read, the rest is not, so the daemon can say why it refuses."""
    older = frames.HELLO_MAGIC + (1).to_bytes(2, "little") + (5).to_bytes(2, "little") + b"token"
    assert frames.parse_hello(older) == (1, "", "")
    with pytest.raises(frames.FrameError, match="bad HELLO magic"):
        frames.parse_hello(b"DLFSDAT")


def test_get_batch_round_trip():
    ids = np.array([5, 3, 5, 2**40], dtype=np.int64)
    kind, body = split(b"".join(bytes(b) for b in frames.get_batch(
        "ds.v1", ids, generation=7, hints=np.array([9]), request_id="step-3")))
    assert kind == frames.Kind.GET_BATCH
    request = frames.parse_get_batch(memoryview(body))
    assert (request.dataset, request.generation, request.request_id) == ("ds.v1", 7, "step-3")
    assert request.ids.tolist() == ids.tolist() and request.hints.tolist() == [9]


def test_read_range_and_stat_round_trip():
    kind, body = split(frames.read_range("ds", 12, 100, 0, generation=3))
    assert kind == frames.Kind.READ_RANGE
    assert frames.parse_read_range(body)[:5] == ("ds", 3, 12, 100, 0)
    kind, body = split(frames.stat_dataset("ds", "id-1"))
    assert frames.parse_stat_dataset(body) == ("ds", "id-1")


def test_welcome_carries_the_daemons_release_and_limits():
    told = frames.DaemonLimits(1000, 2 << 30, frames.request_bytes_max(1000))
    kind, body = split(frames.welcome(4 << 20, b"i" * 16, told))
    assert kind == frames.Kind.WELCOME
    assert frames.parse_welcome(body) == (frames.VERSION, 4 << 20, b"i" * 16,
                                          dlfs.__version__, told)
    assert frames.parse_welcome(split(frames.welcome(
        4 << 20, b"i" * 16, told, release="0.2.0"))[1]).release == "0.2.0"
    # Another layout: its version alone, so the client can say why it stops.
    assert frames.parse_welcome((1).to_bytes(2, "little") + bytes(22)) == (1, 0, b"", "", None)
    with pytest.raises(frames.FrameError):
        frames.parse_welcome(frames.WELCOME.pack(frames.VERSION, 0, 4 << 20, b"i" * 16, b"")
                             + frames.LIMITS.pack(0, 0, 0))
    with pytest.raises(frames.FrameError):
        frames.parse_welcome(body + b"x")


def test_a_get_batch_tells_its_ids_from_its_fixed_part():
    request = b"".join(bytes(b) for b in frames.get_batch("ds", np.arange(70_000)))
    assert frames.get_batch_ids(request[frames.FRAME.size:][:frames.GET_BATCH.size]) == 70_000
    with pytest.raises(frames.FrameError):
        frames.get_batch_ids(b"short")


def test_block_crcs_round_trip():
    kind, body = split(frames.block_crcs("ds", 12, generation=4, request_id="r-1"))
    assert kind == frames.Kind.BLOCK_CRCS
    assert frames.parse_block_crcs(body) == ("ds", 4, 12, "r-1")
    kind, body = split(frames.crcs_reply(4, 1 << 20, np.array([1, 2**32 - 1])))
    assert kind == frames.Kind.CRCS
    generation, block_bytes, crcs = frames.parse_crcs_reply(body)
    assert (generation, block_bytes, crcs.tolist()) == (4, 1 << 20, [1, 2**32 - 1])
    # A sample whose blocks have no CRCs (ingested before them): none.
    assert frames.parse_crcs_reply(split(frames.crcs_reply(4, 1 << 20, None))[1])[2] is None


def test_batch_header_round_trip():
    lengths = np.array([3, 0, 5], dtype=np.uint64)
    crcs = np.array([1, 2, 3], dtype=np.uint32)
    kind, body = split(b"".join(bytes(b) for b in frames.batch_header(9, lengths, crcs,
                                                                         frames.BATCH_CRCS)))
    reply = frames.parse_batch_header(memoryview(body))
    assert (reply.generation, reply.payload_bytes, reply.flags) == (9, 8, frames.BATCH_CRCS)
    assert reply.lengths.tolist() == [3, 0, 5] and reply.crcs.tolist() == [1, 2, 3]


@pytest.mark.parametrize("error", [errors.NotFound("no dataset 'x'"),
                                   errors.StorageFull("disk full"),
                                   errors.DataCorruption("sample 3 is damaged")])
def test_errors_keep_their_class_and_message(error):
    kind, body = split(frames.error(error))
    assert kind == frames.Kind.ERROR
    back = frames.parse_error(body, "host:1")
    assert type(back) is type(error) and back.message == error.message


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bodies_raise_frame_errors_only(body):
    for parse in (frames.parse_hello, frames.parse_get_batch, frames.parse_read_range,
                  frames.parse_stat_dataset, frames.parse_batch_header,
                  frames.parse_welcome, frames.parse_dataset_reply,
                  frames.parse_block_crcs, frames.parse_crcs_reply):
        try:
            parse(memoryview(body))
        except frames.FrameError:
            pass
