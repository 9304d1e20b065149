"""The gRPC port's door against floods (issue 55, item 1), each against a real daemon.

- an idle flood (thousands of TCP connections that never send HTTP/2's
  preface) costs itself its slots: new clients from the flooding host and
  from another one get Status and health checks at once, the descriptors the
  flood holds are bounded, the evicted are told why, and the rest are closed
  at the handshake deadline;
- connections that complete HTTP/2's handshake and answer PINGs but make no
  call hold at most their host's share, give way to new clients of that host
  and of others, and never evict a connection that made a call;
- the daemon's servicers see each client's own address through the door.
"""

from __future__ import annotations

import os
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers.daemons import metric_samples
from helpers.waiting import wait_until
from dlfs import Client, limits
from dlfs.proto import dlfs_pb2, dlfs_pb2_grpc
from helpers.hostile_grpc_peers import (PREFACE, SETTINGS, Http2Idlers, SourceForwarder,
                                closed_by_daemon, frame, goaway_text, idle_flood)

OTHER_HOST = "127.0.0.2"  # another client host to the daemon (all of 127.0.0.0/8 is this one)


def address_of(daemon) -> tuple[str, int]:
    host, _, port = daemon.address.rpartition(":")
    return host, int(port)


def fresh_channel(address: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (channels in one process share their
    connections otherwise)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def serving(address: str) -> bool:
    """A new client at `address`, on a new connection, gets Status and a health check
    answered."""
    with fresh_channel(address) as channel:
        dlfs_pb2_grpc.DlfsStub(channel).Status(dlfs_pb2.StatusRequest(), timeout=10)
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def door_counts(client) -> dict[str, float]:
    """{state: connections} at the door, and {reason: refused} (as "refused:REASON")."""
    counts = {}
    for (name, labels), value in metric_samples(client).items():
        labels = dict(labels)
        if name == "dlfs_grpc_connections":
            counts[labels["state"]] = value
        elif name == "dlfs_grpc_refused_connections_total":
            counts[f"refused:{labels['reason']}"] = value
    return counts


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def forwarder(request):
    made = []

    def make(daemon) -> SourceForwarder:
        made.append(SourceForwarder(address_of(daemon), OTHER_HOST))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_an_idle_flood_costs_only_itself_its_slots(daemon_factory, forwarder):
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    other = forwarder(daemon)
    with Client(daemon.address, data_path=False) as watcher:
        before = door_counts(watcher)
        fds_before = open_fds(daemon.pid)
        # 2,000 connections from this host that never send a byte, 500 from another.
        flood = idle_flood(address_of(daemon), 2000)
        flood += idle_flood(address_of(daemon), 500, source=OTHER_HOST)
        evicted = 2500 - 2 * limits.grpc_handshakes_per_peer_max
        wait_until(lambda: door_counts(watcher).get("refused:handshake_evicted", 0)
                   - before.get("refused:handshake_evicted", 0) >= evicted,
                   "the door evicted the flood's oldest connections", 120)
        try:
            # Each host holds at most its share of the handshake budget: a descriptor
            # each, and nothing else.
            assert open_fds(daemon.pid) - fds_before <= 2 * limits.grpc_handshakes_per_peer_max \
                + 8, (fds_before, open_fds(daemon.pid))
            # New clients of the flooding host and of another are served at once: each
            # evicts the oldest of its host's waiting connections.
            assert serving(daemon.address)
            assert serving(other.address)
            # The evicted were told why before the close.
            said = goaway_text(flood[0])
            assert said is not None and "waited longest" in said, said
            # The rest are closed once the handshake's deadline passed.
            wait_until(lambda: all(map(closed_by_daemon, flood[-40:])),
                       "the door closed connections whose preface never came",
                       limits.grpc_handshake_timeout_s + 60)
            counts = door_counts(watcher)
            assert counts["refused:handshake_deadline"] >= 2 * \
                limits.grpc_handshakes_per_peer_max - 2, counts
            assert counts["pending"] == 0, counts
        finally:
            for sock in flood:
                sock.close()
    log = daemon.log()
    assert "an idle flood?" in log and "Traceback" not in log
    assert log.count("(handshake_evicted;") <= 3  # a line an episode, not one a connection


def test_handshaken_idle_connections_give_way_to_clients_that_call(daemon_factory, forwarder):
    daemon = daemon_factory(extra_args=["--metrics-listen", "0", "--grpc-connections-max", "8"])
    other = forwarder(daemon)
    share = 4  # half of --grpc-connections-max
    with Client(daemon.address, data_path=False) as watcher:
        watcher.status()  # its connection made a call: idlers never evict it
        idlers = Http2Idlers(address_of(daemon), 3 * share)
        far_idlers = Http2Idlers(address_of(daemon), 3 * share, source=OTHER_HOST)
        for each in (idlers, far_idlers):
            each.start()
        try:
            # Each host holds at most its share (the watcher's connection counts toward
            # this host's); a newcomer evicted the oldest idle one of its own host.
            wait_until(lambda: idlers.alive() <= share - 1 and far_idlers.alive() <= share,
                       "the door held each host to its share", 60)
            counts = door_counts(watcher)
            assert counts["open"] + counts["calling"] <= 8, counts
            assert counts["calling"] == 1, counts  # the watcher
            assert counts["refused:idle_evicted"] >= 6 * share - (2 * share - 1), counts
            # New clients of both hosts are served: they evict idle ones, never the
            # watcher's calling connection, which goes on being served.
            for _ in range(3):
                assert serving(daemon.address)
                assert serving(other.address)
            watcher.status()
            counts = door_counts(watcher)
            assert counts.get("refused:peer_share", 0) == 0, counts
            assert counts.get("refused:connections", 0) == 0, counts
            # The idlers left are past HTTP/2's handshake (gRPC's SETTINGS came, acked).
            wait_until(lambda: idlers.settled() == idlers.alive() and
                       far_idlers.settled() == far_idlers.alive() > 0,
                       "the idlers left got gRPC's SETTINGS", 30)
        finally:
            idlers.close()
            far_idlers.close()
    assert "Traceback" not in daemon.log()


def test_when_every_slot_has_calls_a_newcomer_is_told_why(daemon_factory):
    """Connections that made calls are never evicted: at the bound, a new one is
    refused with a GOAWAY that names the limit, and served once one closes."""
    daemon = daemon_factory(extra_args=["--grpc-connections-max", "2",
                                        "--grpc-connections-per-peer-max", "2"])
    holders = [fresh_channel(daemon.address) for _ in range(2)]
    try:
        for holder in holders:
            health_pb2_grpc.HealthStub(holder).Check(health_pb2.HealthCheckRequest(),
                                                     timeout=10)
        sock = socket.create_connection(address_of(daemon), timeout=10)
        sock.sendall(PREFACE + frame(SETTINGS))
        said = goaway_text(sock)
        sock.close()
        assert said == ("127.0.0.1 already holds 2 of the daemon's gRPC connections, its "
                        "share (--grpc-connections-per-peer-max), each with calls; close idle "
                        "channels, or retry later"), said
        holders.pop().close()
        wait_until(lambda: serving(daemon.address), "a slot came free", 30)
    finally:
        for holder in holders:
            holder.close()


def test_servicers_see_each_clients_own_address(daemon_factory, forwarder):
    """The call guard's per-host share counts the client behind the door, not the door:
    slow-call logs name it too."""
    daemon = daemon_factory(extra_args=["--log-level", "DEBUG"])
    other = forwarder(daemon)
    with Client(other.address, data_path=False) as client:
        client.dataset_infos()
    wait_until(lambda: f"from ipv4:{OTHER_HOST}:" in daemon.log(),
               "the daemon logged the call from the other host's address", 30)
    assert "unix-abstract:" not in daemon.log()
