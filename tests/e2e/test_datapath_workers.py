"""The data path served by worker processes: deaths, replaces, limits and counters.

Real daemons with two data path workers (`--datapath-workers 2`, so the
tests mean the same on any machine), real clients, real signals.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest

import dlfs
from dlfs import Client, limits
from dlfs.formats import datapath_frames as frames
from dlfs.sockio import recv_exactly
from helpers.trees import write_tree
from helpers.waiting import wait_until

MiB = 1024 * 1024
WORKERS = ["--datapath-workers", "2"]


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(11)
    files = {f"s/{i:03d}.bin": rng.bytes(int(rng.integers(1, 20000))) for i in range(120)}
    files["big/volume.raw"] = rng.bytes(9 * MiB + 7)
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


def workers_of(client) -> list:
    return list(client.status().data_workers)


def serving_worker(client):
    """The one worker that serves a connection now."""
    busy = [w for w in workers_of(client) if w.connections]
    assert len(busy) == 1, busy
    return busy[0]


def unread_request_on(port: int) -> bool:
    """Whether an accepted TCP connection on `port` holds request bytes nobody read yet
    (/proc/net/tcp: rx_queue of the connection whose local port is `port`)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == port and remote != "00000000:0000" and \
                    int(queues.split(":")[1], 16) > 0:
                return True
    return False


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (SIGSTOP is delivered when a
    thread next runs; one still in recv() could take a request first)."""
    task = f"/proc/{pid}/task"
    states = []
    for tid in os.listdir(task):
        with open(f"{task}/{tid}/stat") as f:
            stat = f.read()
        states.append(stat[stat.rindex(")") + 2])
    return all(state in "tT" for state in states)


def second_client_on_another_worker(address: str, taken: int) -> Client:
    """A client whose data connection a worker other than `taken` serves (the kernel
    hands each connection to one waiting worker; try a few)."""
    for _ in range(8):
        client = Client(address, data_path="tcp")
        ds = client.dataset("ds")
        ds.get_batch([0])
        mine = [w for w in workers_of(client) if w.connections and w.index != taken]
        if mine:
            return client
        client.close()
    raise AssertionError("every new connection landed on the same worker")


def test_a_worker_killed_mid_batch_costs_its_client_nothing(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=WORKERS)
    paths = sorted(files)
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(root), "ds")
        ds = client.dataset("ds")
        assert [bytes(s) for s in ds.get_batch([0, 1])] == [files[paths[0]], files[paths[1]]]
        victim = serving_worker(client)
        other = second_client_on_another_worker(daemon.address, victim.index)
        try:
            others = {w.index: w.pid for w in workers_of(client) if w.index != victim.index}
            port = client.transport.data_path().tcp_port
            # Stopped, the worker cannot answer: the next request waits in its socket.
            os.kill(victim.pid, signal.SIGSTOP)
            wait_until(lambda: stopped(victim.pid), "the worker stopped", 30)
            got = {}
            ids = list(range(len(paths)))
            reader = threading.Thread(target=lambda: got.update(
                batch=[bytes(s) for s in ds.get_batch(ids)]))
            reader.start()
            wait_until(lambda: unread_request_on(port), "the request reached the worker", 30)
            os.kill(victim.pid, signal.SIGKILL)
            reader.join(60)
            assert got["batch"] == [files[p] for p in paths]  # from another worker, no error
            # The other worker served on, undisturbed, and the slot has a new worker.
            assert bytes(other.dataset("ds").get_batch([2])[0]) == files[paths[2]]
            wait_until(lambda: workers_of(client)[victim.index].state == "serving"
                       and workers_of(client)[victim.index].pid not in (0, victim.pid),
                       "a new worker serves in the dead one's slot", 60)
            now = workers_of(client)
            assert {w.index: w.pid for w in now if w.index != victim.index} == others
            assert now[victim.index].restarts == 1
            assert sum(w.connections for w in now if w.index != victim.index) >= 1
        finally:
            other.close()
    assert "was killed by signal 9" in daemon.log()


def versions(root, size: int = 3000, count: int = 64):
    for tag in (b"1", b"2"):
        write_tree(root / tag.decode(), {f"{i:03d}": tag * size for i in range(count)})
    return root / "1", root / "2"


def test_a_replace_while_four_clients_read_is_never_mixed_or_stale(daemon_factory, tmp_path):
    v1, v2 = versions(tmp_path)
    daemon = daemon_factory(extra_args=WORKERS)
    with Client(daemon.address) as writer:
        writer.ingest(str(v1), "ds")
    acknowledged = threading.Event()
    stop = threading.Event()
    seen: list[tuple[bool, frozenset]] = []
    failures: list[BaseException] = []

    def read():
        try:
            with Client(daemon.address, data_path="tcp") as client:
                ds = client.dataset("ds")
                while not stop.is_set():
                    after = acknowledged.is_set()
                    batch = frozenset(bytes(s)[:1] for s in ds.get_batch(range(64)))
                    seen.append((after, batch))
        except BaseException as exc:  # noqa: BLE001 - the test thread raises it
            failures.append(exc)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for thread in readers:
        thread.start()
    wait_until(lambda: len(seen) >= 8, "the readers read", 60)
    with Client(daemon.address) as writer:
        writer.ingest(str(v2), "ds", replace=True)
    acknowledged.set()
    count = len(seen)
    wait_until(lambda: len(seen) >= count + 8, "the readers read the new version", 60)
    stop.set()
    for thread in readers:
        thread.join(60)
    assert not failures, failures
    assert all(batch in ({b"1"}, {b"2"}) for _, batch in seen)  # never mixed
    assert all(batch == {b"2"} for after, batch in seen if after)  # never stale once acked
    # Both workers served, and the old version's extents went once nobody read them.
    with Client(daemon.address) as client:
        assert sum(1 for w in client.status().data_workers if w.requests) == 2
    wait_until(lambda: len(os.listdir(os.path.join(daemon.data_dir, "extents"))) == 1,
               "the replaced version's extents are freed", 30)


def read_frame(sock):
    header = bytearray(frames.FRAME.size)
    recv_exactly(sock, memoryview(header))
    kind, _flags, length = frames.parse_frame(header)
    body = bytearray(length)
    recv_exactly(sock, memoryview(body))
    return kind, body


def test_a_worker_reading_a_replaced_version_keeps_its_extents_until_it_ends(
        daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=WORKERS)
    extents = os.path.join(daemon.data_dir, "extents")
    with Client(daemon.address) as client:
        client.ingest(str(root), "ds")
        big = sorted(files).index("big/volume.raw")
        port = client.transport.data_path().tcp_port
        # A reply the client does not read: its worker holds the version in a send.
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(frames.hello(""))
        assert read_frame(stalled)[0] == frames.Kind.WELCOME
        for part in frames.get_batch("ds", np.array([big] * 16)):
            stalled.sendall(part)
        assert read_frame(stalled)[0] == frames.Kind.BATCH  # the reply is under way
        client.ingest(str(root), "ds", replace=True)  # acknowledged: nobody reads it anew
        assert len(os.listdir(extents)) == 2  # the stalled read keeps the old extents
        assert bytes(client.dataset("ds").get_batch([big])[0]) == files["big/volume.raw"]
        stalled.close()  # the worker's send fails, its lease ends, the main process frees
        wait_until(lambda: len(os.listdir(extents)) == 1, "the old extents are freed", 60)


def test_a_stuck_worker_cannot_hold_a_replace_up(daemon_factory, tmp_path):
    v1, v2 = versions(tmp_path)
    daemon = daemon_factory(extra_args=WORKERS)
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(v1), "ds")
        stuck = workers_of(client)[0]
        os.kill(stuck.pid, signal.SIGSTOP)  # it cannot apply the replace
        wait_until(lambda: stopped(stuck.pid), "the worker stopped", 30)
        started = time.monotonic()
        client.ingest(str(v2), "ds", replace=True)
        assert time.monotonic() - started >= 5  # it waited for the worker, then killed it
        for _ in range(4):  # whichever worker a connection lands on serves the new version
            with Client(daemon.address, data_path="tcp") as reader:
                assert {bytes(s)[:1] for s in reader.get_batch(range(64), dataset="ds")} \
                    == {b"2"}
    assert "did not apply a dataset change" in daemon.log()


def connect(port: int):
    """A raw data connection's answer to HELLO: (kind, body)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(30)
    sock.sendall(frames.hello(""))
    return sock, read_frame(sock)


def test_the_connection_limit_holds_across_workers(daemon_factory, tmp_path):
    write_tree(tmp_path / "src", {"a": b"alpha"})
    daemon = daemon_factory(extra_args=WORKERS + ["--datapath-connections-max", "4"])
    with Client(daemon.address, data_path=False) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        port = Client(daemon.address).transport.data_path().tcp_port
        answers = [connect(port) for _ in range(12)]
        welcomed = [sock for sock, (kind, _) in answers if kind == frames.Kind.WELCOME]
        refused = [body for _, (kind, body) in answers if kind == frames.Kind.ERROR]
        assert len(welcomed) + len(refused) == 12
        assert 2 <= len(welcomed) <= 4  # each worker its share (2), never more in all
        assert all(b"RESOURCE_EXHAUSTED" in bytes(body) or b"Overloaded" in bytes(body)
                   or b"data connections" in bytes(body) for body in refused)
        wait_until(lambda: client.status().data_connections == len(welcomed),
                   "the refused connections are closed", 30)
        assert sum(w.connections for w in client.status().data_workers) == len(welcomed)
        for sock, _ in answers:
            sock.close()


def metric(address: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == name and all(
                   s.labels.get(k) == v for k, v in labels.items()))


def test_status_and_metrics_add_up_over_the_workers(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=WORKERS + ["--metrics-listen", "0"])
    paths = sorted(files)
    with Client(daemon.address, data_path="tcp") as first:
        first.ingest(str(root), "ds", via="grpc")  # no INGEST_START among the requests
        ds = first.dataset("ds")
        ds.get_batch([0])
        one = serving_worker(first)
        second = second_client_on_another_worker(daemon.address, one.index)
        try:
            wait_until(lambda: first.status().data_connections == 2,
                       "only the two clients' connections remain", 30)
            before = first.status()
            read = 0
            for client, ids in ((first, [1, 2, 3]), (second, [4, 5])):
                read += sum(len(s) for s in client.dataset("ds").get_batch(ids))
            assert read == sum(len(files[paths[i]]) for i in range(1, 6))
            status = first.status()
            expected = status.bytes_served
            assert expected - before.bytes_served == read
            assert status.batches_served - before.batches_served == 2
            assert sum(w.bytes_served for w in status.data_workers) == expected
            assert sum(w.requests for w in status.data_workers) == status.batches_served
            assert all(w.requests and w.cpu_s > 0 and w.pid for w in status.data_workers)
            assert status.data_connections == 2 == sum(w.connections
                                                       for w in status.data_workers)
            address = status.metrics_address
            assert metric(address, "dlfs_served_bytes_total") == expected
            assert metric(address, "dlfs_reads_total", method="DataBatch") == \
                status.batches_served
            assert sum(metric(address, "dlfs_data_worker_served_bytes_total", worker=str(k))
                       for k in range(2)) == expected
            # A worker that dies takes nothing back from the daemon's totals.
            os.kill(status.data_workers[0].pid, signal.SIGKILL)
            wait_until(lambda: first.status().data_workers[0].restarts == 1,
                       "the worker is restarted", 60)
            assert first.status().bytes_served == expected
            assert metric(address, "dlfs_served_bytes_total") == expected
        finally:
            second.close()


def test_without_workers_the_main_process_serves_the_data_path(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=["--datapath-workers", "0"])
    paths = sorted(files)
    with Client(daemon.address, data_path="tcp") as client:
        client.ingest(str(root), "ds")
        assert [bytes(s) for s in client.dataset("ds").get_batch([5, 0])] == \
            [files[paths[5]], files[paths[0]]]
        status = client.status()
        assert status.data_workers == () and status.data_connections == 1
    assert "worker_main" not in open(f"/proc/{daemon.pid}/cmdline").read()


def test_ingests_over_the_data_path_are_handed_to_the_main_process(daemon_factory, tree):
    root, files = tree
    daemon = daemon_factory(extra_args=WORKERS)
    with Client(daemon.address) as client:
        info = client.ingest(str(root), "ds", via="datapath")
        assert info.samples == len(files)
        with pytest.raises(dlfs.AlreadyExists):
            client.ingest(str(root), "ds", via="datapath")  # the main process answers it
        paths = sorted(files)
        assert bytes(client.dataset("ds").get_batch([7])[0]) == files[paths[7]]


def test_reads_of_a_dataset_being_published_never_hold_the_publish_up(daemon_factory, tmp_path):
    """A worker that lacks a dataset asks the main process why, while the main process may
    be publishing that very dataset and waiting for the worker's acknowledgement: the
    question must not block the acknowledgement (nor kill the worker)."""
    write_tree(tmp_path / "src", {f"{i:02d}": bytes([i]) * 100 for i in range(16)})
    daemon = daemon_factory(extra_args=WORKERS)
    stop = threading.Event()
    answers = {"found": 0, "missing": 0}

    def ask():
        with Client(daemon.address, data_path="tcp") as client:
            data = client.transport.data_path()
            while not stop.is_set():
                try:
                    data.get_batch("churn", np.array([0]))
                    answers["found"] += 1
                except (dlfs.NotFound, dlfs.StaleGeneration):
                    answers["missing"] += 1

    askers = [threading.Thread(target=ask) for _ in range(4)]
    for thread in askers:
        thread.start()
    try:
        with Client(daemon.address) as writer:
            for _ in range(6):
                started = time.monotonic()
                writer.ingest(str(tmp_path / "src"), "churn", via="grpc")
                writer.delete("churn")
                assert time.monotonic() - started < limits.worker_ack_timeout_s
    finally:
        stop.set()
        for thread in askers:
            thread.join(60)
    assert answers["missing"] and answers["found"]
    assert "did not apply a dataset change" not in daemon.log()
    with Client(daemon.address) as client:
        assert all(w.restarts == 0 for w in client.status().data_workers)



def test_a_worker_at_its_share_of_a_split_limit_does_not_refuse_a_client_the_daemon_has_room_for(
        daemon_factory, tmp_path):
    """The client's share (4 connections) is split between the 2 workers, and the
    kernel hands each connection to the next worker waiting, not to one with room.
    With both of worker A's connections closed and worker B's two still open, a new
    connection B takes is refused (its share is full) while the daemon has room on
    A: the client tries again, and gets A.  Where every worker is full, the refusal
    comes after those tries, saying the limit is split."""
    write_tree(tmp_path / "src", {"a": b"alpha"})
    daemon = daemon_factory(extra_args=WORKERS + ["--datapath-connections-per-peer-max", "4"])
    with Client(daemon.address, data_path=False) as control, \
            Client(daemon.address, data_path="tcp") as client:
        control.ingest(str(tmp_path / "src"), "ds")
        data = client.transport.data_path()
        held: list[tuple[object, int]] = []  # (connection, the worker that took it)
        while len(held) < 4:  # until each worker holds its share, 2
            before = [w.connections for w in workers_of(control)]
            try:
                connection = data.dedicated()
            except dlfs.Overloaded:
                raise AssertionError("a connection the daemon had room for was refused")
            wait_until(lambda: sum(w.connections for w in workers_of(control)) > sum(before),
                       "the new connection is counted", 30)
            after = [w.connections for w in workers_of(control)]
            held.append((connection, next(k for k in (0, 1) if after[k] > before[k])))
        assert sorted(index for _, index in held) == [0, 0, 1, 1]
        with pytest.raises(dlfs.Overloaded) as refused:  # the daemon's share for this host
            data.dedicated()
        assert refused.value.split == 2 and "2 serving processes" in refused.value.message
        a = 0
        for connection, index in held:
            if index == a:
                connection.close()
        wait_until(lambda: workers_of(control)[a].connections == 0,
                   "worker A's connections are closed", 30)
        # The kernel hands these two to the workers in turn: one of them to B first.
        again = [data.dedicated(), data.dedicated()]
        wait_until(lambda: [w.connections for w in workers_of(control)] == [2, 2],
                   "both workers hold their share again", 30)
        assert all(c.stat_dataset("ds")[1] == 1 for c in again)
        for connection in again + [c for c, index in held if index != a]:
            connection.close()


def test_a_burst_of_connections_from_one_host_is_served_whole(daemon_factory, tmp_path):
    """The handshake budget is split too: 16 workers leave one host 2 connections
    waiting for their HELLO per worker.  64 connections at once from one host (a
    training job's loader workers starting) overrun some worker's 2, which evicts
    the oldest; the evicted client is told the budget is split, connects again at
    once, and every connection is served."""
    write_tree(tmp_path / "src", {"a": b"alpha"})
    daemon = daemon_factory(extra_args=["--datapath-workers", "16"])
    with Client(daemon.address, data_path=False) as control:
        control.ingest(str(tmp_path / "src"), "ds")
        wait_until(lambda: all(w.state == "serving" for w in workers_of(control)),
                   "every worker serves", 120)
    with Client(daemon.address, data_path="tcp") as client:
        data = client.transport.data_path()
        start = threading.Barrier(64)
        connected, failed = [], []

        def connect_one():
            start.wait()
            try:
                connected.append(data.dedicated())
            except dlfs.DlfsError as exc:
                failed.append(exc)

        threads = [threading.Thread(target=connect_one) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        try:
            assert not failed, failed[0]
            assert len(connected) == 64
            assert all(c.stat_dataset("ds")[1] == 1 for c in connected)
        finally:
            for connection in connected:
                connection.close()
