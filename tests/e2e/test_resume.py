"""Resumable ingests: a client killed, a daemon restarted, then `--resume`; real daemons.

The dataset ends identical to its source (sha256 per file), stays invisible
until sealed, and a parked ingest goes away after its timeout or `dlfs discard`.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dlfs
from dlfs import Client
from helpers.cli_advice import run_as_printed, the_command
from helpers.daemons import read_dataset
from helpers.trees import unique_name, write_tree
from helpers.waiting import wait_until

# Small checkpoints, so that a daemon killed a moment into an ingest holds something.
CHECKPOINTS = ["--ingest-checkpoint-bytes", str(2 * 1024 * 1024),
               "--ingest-checkpoint-interval-s", "0.2"]
KILL_POINTS = int(os.environ.get("DLFS_RESUME_KILL_POINTS", "6"))
# Ingests a test interrupts are capped (--max-rate) so that they last about a second
# or more however fast the machine: uncapped, 40 MiB went in 0.1 s on CI's machine,
# before a kill could land.
PACED = ["--max-rate", "32MiB"]


def source_tree(root, n=600, seed=3) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    files = {f"d{i % 9}/f{i:05d}.bin": rng.bytes(int(rng.integers(0, 150_000))) for i in range(n)}
    write_tree(root, files)
    return files


def digests(files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: hashlib.sha256(data).digest() for path, data in files.items()}


def dataset_digests(client, name) -> dict[str, bytes]:
    return digests(read_dataset(client, name))


def progress(address, name):
    with Client(address) as client:
        try:
            return client.transport.control.ingest_progress(name)
        except dlfs.NotFound:
            return None


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ("T": stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def ingest_process(address, source, name, *args):
    return subprocess.Popen([sys.executable, "-m", "dlfs.cli", "--server", address, "ingest",
                             str(source), name, "--progress", "none", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_durable(address, name, at_least: int, process, timeout_s=30.0):
    """Wait until the daemon holds `at_least` files of `name` durably (or the ingest ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        state = progress(address, name)
        if state is not None and state.samples >= at_least:
            return state.samples
        time.sleep(0.02)
    return 0


def test_client_killed_at_random_points_then_resumed_ends_identical(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=CHECKPOINTS)
    files = source_tree(tmp_path / "src", n=600)
    chooser = random.Random(16)
    outcomes = []
    for point in range(KILL_POINTS):
        name = f"resumed{point}"
        via = ("datapath", "grpc")[point % 2]
        kills = 0
        args = ["--readers", str(chooser.choice([1, 2, 8])), "--via", via, *PACED]
        process = ingest_process(daemon.address, tmp_path / "src", name, *args)
        while True:  # kill it at a random point, then resume; sometimes kill a resume too
            wait_for_durable(daemon.address, name, chooser.randint(1, 500), process)
            time.sleep(chooser.uniform(0, 0.05))
            if process.poll() is None and kills < 3:
                process.send_signal(signal.SIGKILL)
                kills += 1
            out, err = process.communicate(timeout=120)
            if process.returncode == 0:
                break
            if process.returncode == 1 and "is already ingested (sealed)" in err:
                break  # the kill landed after the whole stream: the daemon sealed it meanwhile
            assert process.returncode == -signal.SIGKILL, err
            with Client(daemon.address) as client:
                try:  # invisible until sealed
                    client.dataset(name)
                except dlfs.NotFound:
                    pass
                else:  # the whole stream had arrived before the kill: the daemon sealed it
                    assert {i.name: i for i in client.dataset_infos()}[name].sealed
                    break
            process = ingest_process(daemon.address, tmp_path / "src", name, "--resume", *args)
        outcomes.append((kills, out.splitlines()[1] if out else ""))
        with Client(daemon.address) as client:
            assert dataset_digests(client, name) == digests(files)
            client.delete(name)
    assert any("resumed after" in line for _, line in outcomes), outcomes
    assert sum(kills for kills, _ in outcomes) >= KILL_POINTS // 2
    assert os.listdir(os.path.join(daemon.data_dir, "extents")) == []


@pytest.mark.parametrize("how", ["kill", "term"])
def test_daemon_restarted_mid_ingest_then_resume(daemon_factory, tmp_path, how):
    daemon = daemon_factory(extra_args=CHECKPOINTS)
    files = source_tree(tmp_path / "src", n=1500, seed=5)
    name = unique_name()
    process = ingest_process(daemon.address, tmp_path / "src", name, "--readers", "1", *PACED)
    durable = wait_for_durable(daemon.address, name, 100, process)
    assert durable, "the ingest finished before the daemon could be stopped"
    port = daemon.address.rpartition(":")[2]
    if how == "kill":
        daemon.kill()
    else:
        daemon.stop()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "--resume" in err, err
    daemon.start(f"127.0.0.1:{port}")
    state = progress(daemon.address, name)
    assert state is not None, daemon.log()[-3000:]
    assert state.state == "parked" and state.samples >= (durable if how == "kill" else 1)
    with Client(daemon.address) as client:
        info = {i.name: i for i in client.dataset_infos()}[name]
        assert not info.sealed and info.ingest_state == "parked"
    process = ingest_process(daemon.address, tmp_path / "src", name, "--resume")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert f"resumed after {state.samples:,} files" in out
    with Client(daemon.address) as client:
        assert dataset_digests(client, name) == digests(files)


def test_resume_refuses_a_changed_source_and_discard_ends_the_parked_ingest(daemon_factory,
                                                                           tmp_path):
    daemon = daemon_factory(extra_args=CHECKPOINTS)
    source_tree(tmp_path / "src", n=500, seed=7)
    name = unique_name()
    process = ingest_process(daemon.address, tmp_path / "src", name, "--readers", "1", *PACED)
    assert wait_for_durable(daemon.address, name, 50, process)
    process.kill()
    process.communicate(timeout=60)
    # Not resuming: the parked ingest blocks the name and says what to do.
    proc = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                           "ingest", str(tmp_path / "src"), name], capture_output=True, text=True)
    assert proc.returncode == 1 and "--resume" in proc.stderr and "dlfs discard" in proc.stderr
    discard = the_command(proc.stderr, "dlfs discard")
    with open(tmp_path / "src" / "d0" / "f00000.bin", "ab") as f:  # among the durable ones
        f.write(b"changed")
    proc = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                           "ingest", "--resume", str(tmp_path / "src"), name],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "ResumeConflict" in proc.stderr, proc.stderr
    with Client(daemon.address) as client:
        removed = run_as_printed(daemon.address, discard)  # the advice, as printed
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.startswith(f"discarded the parked ingest of {name}: ")
        assert progress(daemon.address, name) is None
        assert os.listdir(os.path.join(daemon.data_dir, "extents")) == []
        client.ingest(str(tmp_path / "src"), name)  # the name is free again


def test_a_parked_ingest_is_discarded_after_its_timeout(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=CHECKPOINTS + ["--resumable-ingest-timeout-s", "1.5"],
                            start=False)
    # The daemon stands still at a disk write mid-ingest: the client is killed while the
    # ingest runs, however fast this machine is (it could finish first otherwise).
    daemon.extra_env = {"DLFS_FAULT": "write:40:stop"}
    daemon.start()
    source_tree(tmp_path / "src", n=400, seed=9)
    name = unique_name()
    process = ingest_process(daemon.address, tmp_path / "src", name, "--readers", "1")
    try:
        wait_until(lambda: process_state(daemon.pid) == "T", "the daemon stopped mid-ingest",
                   60)
        process.kill()
        process.communicate(timeout=60)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5
    while (state := progress(daemon.address, name)) is not None and state.state != "parked":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert state is not None and 0 < state.expires_in_s <= 1.5
    time.sleep(2.5)
    assert progress(daemon.address, name) is None
    assert os.listdir(os.path.join(daemon.data_dir, "extents")) == []
    assert "not resumed within 2 s" in daemon.log() or "not resumed within" in daemon.log()


def test_resume_with_nothing_parked_starts_a_new_ingest(shared_daemon, tmp_path):
    files = source_tree(tmp_path / "src", n=20)
    name = unique_name()
    with Client(shared_daemon.address) as client:
        client.ingest(str(tmp_path / "src"), name, resume=True)
        assert dataset_digests(client, name) == digests(files)


def test_a_striped_ingest_killed_then_resumed(cluster, tmp_path):
    daemons = cluster.start(2, CHECKPOINTS)
    files = source_tree(tmp_path / "src", n=500, seed=11)
    name = unique_name()
    run = [sys.executable, "-m", "dlfs.cli", *cluster.cli(), "ingest", str(tmp_path / "src"),
           name, "--progress", "none", "--replicas", "2"]
    process = subprocess.Popen(run + ["--readers", "1"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert wait_for_durable(daemons[0].address, name, 60, process)
    process.kill()
    process.communicate(timeout=60)
    held = [progress(d.address, name) for d in daemons]
    assert all(h is not None for h in held)
    with cluster.client() as client:  # the dead client's change goes with its lease
        wait_until(lambda: not client.transport.view.refresh().intents,
                   "the killed client's intent to expire in etcd", 60)
    process = subprocess.Popen(run + ["--resume"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    with cluster.client() as client:
        assert dataset_digests(client, name) == digests(files)
    for d in daemons:  # each member alone holds every sample (2 replicas of 2)
        with Client(d.address) as client:
            assert dataset_digests(client, name) == digests(files)
