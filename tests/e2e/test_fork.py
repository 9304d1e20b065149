"""Forked processes (DataLoader workers, the read-ahead helper) read without gRPC.

gRPC after `fork` hangs (docs/DESIGN.md, "Forked processes"): DLFS leaves
gRPC's fork support off, so a fork never waits on gRPC's handlers, and a
child of a process that used gRPC reads, hints and follows a replaced
dataset over the data path; a call that needs gRPC there raises
FailedPrecondition at once instead of hanging.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import traceback

import pytest

import dlfs
from dlfs import Client, DatasetTicket
from dlfs.client.transport.grpc_channel import FORK_SUPPORT_ENV, fork_support_enabled
from helpers.trees import write_tree

CHILD_TIMEOUT_S = 60


def in_forked_child(work) -> dict:
    """`work()` (-> a JSON-able dict) run in a forked child; its result, or the child's
    traceback as an assertion.  A child that does not answer in time is killed: hung."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os.close(read_end)
        try:
            result = {"ok": work()}
        except BaseException:
            result = {"error": traceback.format_exc()}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], CHILD_TIMEOUT_S)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the forked child hung (no answer in {CHILD_TIMEOUT_S} s)")
        with os.fdopen(read_end, "rb") as pipe:
            result = json.loads(pipe.read() or b'{"error": "the child died"}')
    finally:
        os.waitpid(pid, 0)
    assert "error" not in result, result["error"]
    return result["ok"]


@pytest.fixture
def without_fork_support():
    if fork_support_enabled():
        pytest.skip(f"{FORK_SUPPORT_ENV} is on in this environment: gRPC may be used after fork")


def test_dlfs_leaves_grpc_fork_support_off():
    # Importing dlfs must not switch it on: with it on, a fork while another thread
    # is in a gRPC call hangs the parent inside os.fork or the child (measured).
    if os.environ.get(FORK_SUPPORT_ENV) is None:
        assert not fork_support_enabled()


def test_a_forked_child_reads_hints_and_follows_a_replace_without_grpc(
        daemon, tmp_path, without_fork_support):
    write_tree(tmp_path / "v1", {f"{i:02d}": b"1" * 300 for i in range(20)})
    write_tree(tmp_path / "v2", {f"{i:02d}": b"2" * 300 for i in range(30)})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "v1"), "ds")
        ticket = DatasetTicket.of(client.dataset("ds"))
        client.ingest(str(tmp_path / "v2"), "ds", replace=True)
        newest = client.dataset("ds").info.generation
        assert newest != ticket.info.generation

        def child():
            ds = ticket.open()
            hinted = ds.prefetch(range(10))  # over the data path: gRPC is unusable here
            samples = ds.get_batch([0, 29])  # stale version: refreshed over the data path
            with pytest.raises(dlfs.FailedPrecondition, match="forked from one that had used"):
                ds.stat("")
            return {"hinted": hinted, "samples": [bytes(s).decode() for s in samples],
                    "generation": ds.info.generation, "len": len(ds)}

        # The parent's channel is open and has been used: the case that hung 12 of 12 children.
        assert in_forked_child(child) == {"hinted": True, "samples": ["2" * 300, "2" * 300],
                                          "generation": newest, "len": 30}
        # The parent's gRPC is untouched by the child.
        assert client.dataset("ds").stat("").name == ""


def test_a_client_made_in_a_forked_child_reads_by_id_and_refuses_the_rest(
        daemon, tmp_path, without_fork_support):
    """Where the parent's data path is known, a new client reads by ids over it; a path
    (a Lookup) or a daemon the parent never reached gets the clear error at once."""
    write_tree(tmp_path / "src", {"a": b"x", "b": b"yy"})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        client.dataset("ds").get_batch([0])  # the parent learns where the data path listens
        port = daemon.address.rpartition(":")[2]

        def child():
            with Client(daemon.address) as fresh:
                ds = fresh.dataset("ds")  # STAT_DATASET over the data path
                samples = [bytes(s).decode() for s in ds.get_batch([1, 0])]
                with pytest.raises(dlfs.FailedPrecondition, match="forkserver"):
                    ds.get_batch(["a"])
            with Client(f"localhost:{port}") as elsewhere:  # never reached by the parent
                with pytest.raises(dlfs.FailedPrecondition, match="forkserver"):
                    elsewhere.dataset("ds")
            return {"samples": samples, "len": len(ds)}

        assert in_forked_child(child) == {"samples": ["yy", "x"], "len": 2}


def test_a_forked_child_reads_a_striped_dataset_without_grpc(
        cluster, tmp_path, without_fork_support):
    """The ticket carries the placement: the child reads each member's part directly,
    asking neither etcd nor a member over gRPC."""
    files = {f"{i:03d}": bytes([i]) * (100 + i) for i in range(60)}
    write_tree(tmp_path / "src", files)
    cluster.start(2)
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "striped", replicas=1)
        ticket = DatasetTicket.of(client.dataset("striped"))
        paths = client.dataset("striped").paths()

        def child():
            ds = ticket.open()
            return {"samples": [bytes(s).hex() for s in ds.get_batch(range(60))]}

        got = in_forked_child(child)["samples"]
    assert {path: bytes.fromhex(data) for path, data in zip(paths, got)} == files


CORE_SCRIPT = """
import gc, glob, os, sys
from dlfs import Client
from dlfs.client.transport.grpc_channel import grpc_core_held

def grpc_threads():
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            names.append(open(path).read().strip())
        except OSError:
            pass  # a thread that just ended
    return sorted(n for n in names if n.startswith("grpc"))

with Client(sys.argv[1]) as client:
    client.status()
gc.collect()  # what frees gRPC's last object in practice: a collection, at any time
held, threads = grpc_core_held(), grpc_threads()
pid = os.fork()  # as a DataLoader does right after DLFSDataset closed its client
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print(held, threads)
"""


def test_grpc_core_stays_up_after_the_last_client_closes(shared_daemon):
    # gRPC shuts its core down on a thread of its own when its last object goes, and a
    # fork meanwhile can deadlock in gRPC's fork handlers (seen in CI: os.fork never
    # returned).  A process that used gRPC therefore keeps the core up: its timer
    # thread is still there after every client closed, and the fork returns.
    out = subprocess.run([sys.executable, "-c", CORE_SCRIPT, shared_daemon.address],
                         capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    held, _, threads = out.stdout.strip().partition(" ")
    assert held == "True" and "grpc_global_tim" in threads, out.stdout
