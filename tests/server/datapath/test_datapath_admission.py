"""The data path's budgets without a daemon: `Admission` (the handshake budget and each
peer's share of the served connections) and `WindowBuffers` (each peer's share of the
window buffers), on real socket pairs."""

from __future__ import annotations

import os
import socket
import time

import pytest

import dlfs
from dlfs.server.datapath.admission import Admission, peer_of
from dlfs.server.datapath.window_buffers import WindowBuffers


@pytest.fixture
def pairs():
    made = []

    def make():
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        made.extend((a, b))
        return a

    yield make
    for sock in made:
        sock.close()


def admission(**overrides) -> Admission:
    settings = dict(connections_max=4, per_peer_max=2, handshakes_max=3,
                    handshakes_per_peer_max=2, hello_timeout_s=10.0)
    settings.update(overrides)
    return Admission(**settings)


def test_a_peer_is_a_process_on_a_unix_socket(pairs):
    assert peer_of(pairs()) == f"pid {os.getpid()}"


def test_pending_connections_never_take_a_served_slot(pairs):
    budget = admission()
    served = [budget.arrive(pairs()) for _ in range(2)]
    for entry in served:
        budget.admit(entry)
    # Handshakes come and go in their own budget: the served ones are untouched.
    waiting = [budget.arrive(pairs()) for _ in range(3)]
    assert budget.served == 2 and budget.pending == 2  # the peer's own oldest was evicted
    assert waiting[0].evicted and not any(e.evicted for e in served)


def test_a_new_connection_evicts_the_oldest_pending_one(pairs):
    budget = admission(handshakes_per_peer_max=3)
    first, second, third = (budget.arrive(pairs()) for _ in range(3))
    fourth = budget.arrive(pairs())
    assert first.evicted and not (second.evicted or third.evicted or fourth.evicted)
    # Its thread wakes: the socket was shut for reading.
    first.sock.settimeout(1)
    assert first.sock.recv(1) == b""
    with pytest.raises(dlfs.Overloaded, match="waited longest") as refused:
        budget.admit(first)
    assert refused.value.refusal == "handshake_evicted"
    budget.leave(first)
    budget.admit(second)
    assert budget.served == 1 and budget.pending == 2


def test_a_peer_holds_at_most_its_share_and_the_daemon_its_limit(pairs):
    budget = admission(handshakes_per_peer_max=3)
    entries = [budget.arrive(pairs()) for _ in range(3)]
    budget.admit(entries[0])
    budget.admit(entries[1])
    with pytest.raises(dlfs.Overloaded, match=r"already holds 2 .* its share") as refused:
        budget.admit(entries[2])
    assert refused.value.refusal == "peer_share"
    budget.leave(entries[2])
    budget.leave(entries[0])
    budget.leave(entries[0])  # leaving twice changes nothing
    assert budget.served == 1 and budget.pending == 0


def test_the_connection_limit_counts_every_peer(pairs):
    budget = admission(connections_max=2, per_peer_max=2)
    entries = [budget.arrive(pairs()) for _ in range(2)]
    for entry in entries:
        budget.admit(entry)
    late = budget.arrive(pairs())
    with pytest.raises(dlfs.Overloaded, match="limit of 2 data connections") as refused:
        budget.admit(late)
    assert refused.value.refusal == "connections"


def test_a_peer_takes_at_most_its_share_of_the_window_buffers():
    buffers = WindowBuffers(4096, 4 * 4096)  # four buffers, two a peer
    assert buffers.per_peer_max == 2
    with buffers.take("a"), buffers.take("a"):
        started = time.monotonic()
        with pytest.raises(dlfs.Overloaded, match="a holds 2 of .* its share"):
            with buffers.take("a", deadline=time.monotonic() + 0.2):
                pass
        assert time.monotonic() - started >= 0.2
        with buffers.take("b") as one, buffers.take("b") as other:  # the rest is b's
            assert one is not other and len(one) == 4096
        assert buffers.held("a") == 2 and buffers.held("b") == 0
    assert buffers.held("a") == 0
