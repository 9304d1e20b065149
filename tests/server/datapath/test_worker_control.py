"""The control channel between the main process and a data path worker."""

from __future__ import annotations

import os
import socket

import pytest

from dlfs import limits
from dlfs.server.datapath.control import ChannelClosed, ControlChannel
from dlfs.server.datapath.workers import worker_shares


@pytest.fixture
def channels():
    mine, theirs = ControlChannel.pair()
    other = ControlChannel(theirs)
    yield mine, other
    mine.close()
    other.close()


def test_messages_keep_their_order_and_carry_descriptors(channels, tmp_path):
    mine, theirs = channels
    path = tmp_path / "f"
    path.write_bytes(b"shared")
    fd = os.open(path, os.O_RDONLY)
    try:
        mine.send({"type": "publish", "seq": 1}, [fd])
        mine.send({"type": "remove", "seq": 2})
    finally:
        os.close(fd)  # the peer holds its own copy
    message, fds = theirs.receive()
    assert message == {"type": "publish", "seq": 1} and len(fds) == 1
    assert os.pread(fds[0], 6, 0) == b"shared"
    os.close(fds[0])
    assert theirs.receive() == ({"type": "remove", "seq": 2}, [])


def test_bounds_are_enforced_before_sending(channels):
    mine, theirs = channels
    with pytest.raises(ValueError, match="over the limit"):
        mine.send({"type": "x", "pad": "a" * limits.worker_control_message_bytes_max})
    with pytest.raises(ValueError, match="descriptors"):
        mine.send({"type": "x"}, [0] * (limits.worker_control_fds_max + 1))
    mine.send({"type": "after"})  # the channel is still in step
    assert theirs.receive() == ({"type": "after"}, [])


def test_a_closed_peer_and_a_bad_message_are_told_apart(channels):
    mine, theirs = channels
    theirs.sock.send(b"not json")
    with pytest.raises(ValueError):
        mine.receive()
    theirs.sock.send(b'["no type"]')
    with pytest.raises(ValueError, match="type"):
        mine.receive()
    theirs.close()
    with pytest.raises(ChannelClosed):
        mine.receive()
    with pytest.raises(ChannelClosed):
        mine.send({"type": "x"})


def test_a_peer_that_stops_reading_times_a_send_out():
    mine, theirs = ControlChannel.pair(send_timeout_s=0.2)
    try:
        with pytest.raises(socket.timeout):
            for _ in range(100_000):  # the buffer fills; the send then gives up
                mine.send({"type": "x", "pad": "a" * 60_000})
    finally:
        mine.close()
        theirs.close()


@pytest.mark.parametrize("total, count", [(256, 16), (4, 2), (5, 2), (3, 3), (17, 5)])
def test_worker_shares_sum_to_the_daemon_limit(total, count):
    shares = worker_shares(total, count)
    assert sum(shares) == total and len(shares) == count
    assert max(shares) - min(shares) <= 1
