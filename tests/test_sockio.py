"""sockio's whole-buffer receive that waits in the kernel (`recv_waiting`): the bytes, a
stalled peer, a trickling one against the whole deadline, a peer gone mid-frame, and the
socket left as it was found."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from dlfs.sockio import recv_waiting


@pytest.fixture
def pair():
    """A connected loopback TCP pair (receiver, sender)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sender = socket.create_connection(listener.getsockname())
        receiver, _ = listener.accept()
    with receiver, sender:
        yield receiver, sender


def _send_later(sock: socket.socket, chunks: list[bytes], pause_s: float) -> threading.Thread:
    def run():
        for chunk in chunks:
            time.sleep(pause_s)
            try:
                sock.sendall(chunk)
            except OSError:
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _rcvtimeo(sock: socket.socket) -> tuple[int, int]:
    return struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))


def test_a_payload_sent_in_pieces_arrives_whole(pair):
    receiver, sender = pair
    receiver.settimeout(5)
    payload = bytes(range(256)) * 4096  # 1 MiB
    _send_later(sender, [payload[i:i + 100_000] for i in range(0, len(payload), 100_000)],
                0.01)
    view = memoryview(bytearray(len(payload)))
    recv_waiting(receiver, view, deadline=time.monotonic() + 10)
    assert view.tobytes() == payload
    # As it was found: the same timeout, no SO_RCVTIMEO left behind.
    assert receiver.gettimeout() == 5 and _rcvtimeo(receiver) == (0, 0)


def test_a_stalled_peer_times_out_after_the_sockets_timeout(pair):
    receiver, sender = pair
    receiver.settimeout(0.3)
    sender.sendall(b"x" * 1000)
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        recv_waiting(receiver, memoryview(bytearray(2000)), deadline=started + 30)
    assert 0.25 <= time.monotonic() - started < 3
    assert receiver.gettimeout() == 0.3 and _rcvtimeo(receiver) == (0, 0)


def test_a_trickle_is_cut_off_at_the_whole_deadline(pair):
    """Each wait sees bytes within the socket's timeout; the deadline still ends it."""
    receiver, sender = pair
    receiver.settimeout(1.0)
    _send_later(sender, [b"y"] * 1000, 0.02)
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        recv_waiting(receiver, memoryview(bytearray(100_000)), deadline=started + 0.5)
    assert 0.45 <= time.monotonic() - started < 3


def test_a_peer_gone_mid_frame_is_a_reset(pair):
    receiver, sender = pair
    receiver.settimeout(5)
    sender.sendall(b"z" * 10)
    sender.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionResetError):
        recv_waiting(receiver, memoryview(bytearray(20)), deadline=time.monotonic() + 10)
