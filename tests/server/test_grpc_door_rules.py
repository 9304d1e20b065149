"""The gRPC door's rules without sockets: what it reads of HTTP/2 (door_frames) and who
may hold what (door_admission), the latter as a random walk checked after each step."""

from __future__ import annotations

import random

import pytest

from dlfs import limits
from dlfs.server.grpc import door_frames
from dlfs.server.grpc.door import client_peer
from dlfs.server.grpc.door_admission import (CALLING, GONE, OPEN, PENDING, Door,
                                             DoorAdmission, DoorRefused)


def h2(kind: int, body: bytes = b"", flags: int = 0) -> bytes:
    return door_frames._frame(kind, flags, body)


SETTINGS = h2(door_frames.SETTINGS, bytes(12))


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_a_handshake_is_whole_once_the_preface_and_settings_came(step):
    data = door_frames.PREFACE + SETTINGS + h2(0x8, bytes(4))  # a WINDOW_UPDATE after
    handshake = door_frames.Handshake()
    whole_at = len(door_frames.PREFACE) + len(SETTINGS)
    for at in range(0, len(data), step):
        done = handshake.feed(data[at:at + step])
        assert done == (at + step >= whole_at), at
    assert bytes(handshake.data) == data  # everything read is passed on


@pytest.mark.parametrize("data, said", [
    (b"GET / HTTP/1.1\r\n", "preface is wrong"),
    (b"\x16\x03\x01\x02\x00", "preface is wrong"),  # TLS to a plaintext port
    (door_frames.PREFACE + h2(0x1, b"x"), "not followed by the client's SETTINGS"),
    (door_frames.PREFACE + h2(door_frames.SETTINGS, bytes(7)), "not followed"),
    (door_frames.PREFACE + h2(door_frames.SETTINGS, b"", door_frames.SETTINGS_ACK),
     "not followed"),
    (door_frames.PREFACE + h2(door_frames.SETTINGS, bytes(6 * 200))[:9], "not followed"),
])
def test_what_is_not_a_grpc_client_is_told_apart_early(data, said):
    with pytest.raises(door_frames.NotHttp2, match=said):
        door_frames.Handshake().feed(data)


@pytest.mark.parametrize("step", [1, 3, 9, 4096])
def test_a_call_is_seen_at_its_first_headers_frame_however_bytes_split(step):
    stream = (SETTINGS + h2(0x6, bytes(8)) + h2(0x8, bytes(4)) + h2(0x0, b"\x01" * 40)
              + h2(door_frames.HEADERS, b"\x82" * 30))
    watch = door_frames.CallWatch()
    headers_at = len(stream) - 9 - 30
    for at in range(0, len(stream), step):
        called = watch.feed(stream[at:at + step])
        assert called == (at + step >= headers_at + 9), at  # its whole header came


def test_a_refusal_is_the_servers_preface_and_a_goaway_saying_why():
    data = door_frames.refusal("no room: retry")
    assert data[:9] == h2(door_frames.SETTINGS)
    assert data[9:] == h2(door_frames.GOAWAY, bytes(4) + b"\x00\x00\x00\x0b" + b"no room: retry")
    assert len(door_frames.refusal("x" * 10_000)) == 9 + 9 + 8 + \
        limits.grpc_refusal_text_bytes_max


def test_client_peer_names_the_client_behind_the_door():
    assert client_peer("unix-abstract:dlfs-door-77-3/ipv4:10.0.0.5:4711") == "ipv4:10.0.0.5:4711"
    assert client_peer("unix-abstract:dlfs-door-77-4/ipv6:[::1]:5") == "ipv6:[::1]:5"
    assert client_peer("ipv4:10.0.0.5:4711") == "ipv4:10.0.0.5:4711"
    assert client_peer("unix-abstract:other") == "unix-abstract:other"


def admission(**given) -> DoorAdmission:
    bounds = dict(connections_max=4, per_peer_max=2, handshakes_max=4, handshakes_per_peer_max=2)
    return DoorAdmission(**(bounds | given))


def test_the_oldest_pending_of_a_host_is_evicted_first():
    a = admission()
    doors = [Door("h1", 0.0), Door("h1", 0.0)]
    assert [a.arrive(d) for d in doors] == [None, None]
    newcomer = Door("h1", 0.0)
    assert a.arrive(newcomer) is doors[0] and doors[0].evicted and doors[0].state == GONE
    others = [Door("h2", 0.0), Door("h2", 0.0)]
    for d in others:
        a.arrive(d)
    third = Door("h3", 0.0)
    assert a.arrive(third) is doors[1]  # the budget in all: the oldest of all
    a.check_invariants()


def test_a_calling_connection_never_gives_way():
    a = admission(connections_max=2, per_peer_max=2)
    held = []
    for _ in range(2):
        door = Door("h1", 0.0)
        a.arrive(door)
        assert a.hand_off(door) is None
        held.append(door)
    a.called(held[0])
    newcomer = Door("h1", 0.0)
    a.arrive(newcomer)
    assert a.hand_off(newcomer) is held[1]  # the open one, not the calling one
    a.called(newcomer)
    late = Door("h2", 0.0)
    a.arrive(late)
    with pytest.raises(DoorRefused) as refused:
        a.hand_off(late)
    assert refused.value.reason == "connections" and late.state == GONE
    assert a.counts() == {PENDING: 0, OPEN: 0, CALLING: 2}
    a.check_invariants()


def test_a_random_walk_keeps_every_bound():
    rng = random.Random(55)
    a = admission(connections_max=6, per_peer_max=3, handshakes_max=5, handshakes_per_peer_max=3)
    live: list[Door] = []
    for _ in range(5000):
        live = [d for d in live if d.state != GONE]
        move = rng.randrange(4)
        if move == 0 or not live:
            door = Door(rng.choice("abc"), 0.0)
            a.arrive(door)
            live.append(door)
        else:
            door = rng.choice(live)
            if move == 1 and door.state == PENDING:
                try:
                    a.hand_off(door, calling=rng.random() < 0.2)
                except DoorRefused:
                    pass
            elif move == 2:
                a.called(door)
            else:
                a.leave(door)
        a.check_invariants()
