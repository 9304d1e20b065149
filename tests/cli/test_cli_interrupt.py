"""Ctrl-C during `dlfs ingest`: a real SIGINT to the real command against a real daemon."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest

from dlfs import Client
from helpers.daemons import read_dataset
from helpers.trees import write_tree
from helpers.waiting import wait_until

# Checkpoints every 128 KiB: files are durable long before the daemon stops.
CHECKPOINTS = ["--ingest-checkpoint-bytes", str(128 * 1024),
               "--ingest-checkpoint-interval-s", "0.05"]
# The daemon stands still at its 20th disk write after it serves (DLFS_FAULT's
# `stop`), in the middle of the ingest: a SIGINT then lands mid-stream every time.
STOP_AT_WRITE = "write:20:stop"


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ("T": stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def run_advice(command: str, **kwargs) -> subprocess.CompletedProcess:
    """Run a `dlfs ...` command line the tool printed, as a user pasting it would."""
    argv = shlex.split(command)
    assert argv[0] == "dlfs", command
    return subprocess.run([sys.executable, "-m", "dlfs.cli", *argv[1:]], capture_output=True,
                          text=True, timeout=120, **kwargs)


def interrupt_an_ingest(daemon_factory, tmp_path, via: str = "datapath"):
    """Start `dlfs ingest` of 600 files, stop the daemon mid-stream, SIGINT the command,
    let the daemon go on; (daemon, files, the command's result)."""
    daemon = daemon_factory(extra_args=CHECKPOINTS, start=False)
    daemon.extra_env = {"DLFS_FAULT": STOP_AT_WRITE}
    daemon.start()
    rng = np.random.default_rng(40)
    files = {f"d{i % 4}/f{i:04d}.bin": rng.bytes(64 * 1024) for i in range(600)}
    write_tree(tmp_path / "src", files)
    ingest = subprocess.Popen(
        [sys.executable, "-m", "dlfs.cli", "--server", daemon.address, "ingest",
         str(tmp_path / "src"), "pets", "--progress", "none", "--via", via],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: process_state(daemon.pid) == "T", "the daemon stopped mid-ingest",
                   60)
        assert ingest.poll() is None, ingest.communicate()
        ingest.send_signal(signal.SIGINT)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    out, err = ingest.communicate(timeout=60)
    return daemon, files, subprocess.CompletedProcess(ingest.args, ingest.returncode, out, err)


@pytest.mark.parametrize("via", ["datapath", "grpc"])
def test_ctrl_c_keeps_the_durable_files_and_prints_the_resume_command(daemon_factory,
                                                                      tmp_path, via):
    daemon, files, done = interrupt_an_ingest(daemon_factory, tmp_path, via)
    out, err = done.stdout, done.stderr
    assert done.returncode == 130, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    kept = re.fullmatch(r"dlfs: interrupted: the daemon keeps ([\d,]+) files \(([\d.]+ \w+)\) "
                        r"of 'pets', parked; continue with: (dlfs .*)", lines[0])
    assert kept, lines[0]
    files_kept = int(kept.group(1).replace(",", ""))
    assert 0 < files_kept < len(files)
    assert kept.group(3) == shlex.join(["dlfs", "--server", daemon.address, "ingest",
                                        str(tmp_path / "src"), "pets", "--progress", "none",
                                        "--via", via, "--resume"])
    resumed = run_advice(kept.group(3))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed after {files_kept:,} files already on the daemon" in resumed.stdout
    with Client(daemon.address) as client:
        assert read_dataset(client, "pets") == files


def test_the_advice_for_a_parked_ingest_discards_it(daemon_factory, tmp_path):
    daemon, _, done = interrupt_an_ingest(daemon_factory, tmp_path)
    assert done.returncode == 130, done.stderr
    env = {**os.environ, "DLFS_SERVER": daemon.address}  # the daemon's advice names no server
    listed = run_advice(f"dlfs --server {daemon.address} datasets")
    assert listed.returncode == 0, listed.stderr
    line, = listed.stdout.splitlines()
    assert line.startswith("pets\t") and "(ingest broke off: run the same `dlfs ingest` with " \
        "--resume to continue it, or `" in line
    discard = re.findall(r"`([^`]+)`", line)[1]
    assert discard == f"dlfs --server {daemon.address} discard pets"
    # Ingesting again without --resume is refused with advice of the daemon's own.
    again = run_advice(f"dlfs ingest {shlex.quote(str(tmp_path / 'src'))} pets --progress none",
                       env=env)
    assert again.returncode == 1
    assert "run the same `dlfs ingest` command with --resume to continue it, or " \
           "`dlfs discard pets` to end it" in again.stderr
    assert run_advice("dlfs discard pets", env=env).returncode == 0
    assert run_advice(discard).returncode == 1  # the first one ended it already
    with Client(daemon.address) as client:
        assert client.dataset_infos() == []


def test_ctrl_c_in_a_cluster_parks_on_the_members_and_both_advices_work(cluster, tmp_path):
    """Ctrl-C during a striped `dlfs --etcd ... ingest`: the members park what they hold
    durably, the message says so with the --resume command; `dlfs datasets` lists the
    parked ingest with the discard command naming the cluster; each advice, run as
    printed, does what it says."""
    first, second = cluster.start(2, CHECKPOINTS)
    first.stop()
    first.extra_env = {"DLFS_FAULT": STOP_AT_WRITE}  # stands still mid-ingest
    first.start_again()
    rng = np.random.default_rng(41)
    files = {f"d{i % 4}/f{i:04d}.bin": rng.bytes(64 * 1024) for i in range(600)}
    write_tree(tmp_path / "src", files)
    ingest = subprocess.Popen(
        [sys.executable, "-m", "dlfs.cli", *cluster.cli(), "ingest", str(tmp_path / "src"),
         "pets", "--progress", "none", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: process_state(first.pid) == "T", "a member stopped mid-ingest", 60)
        assert ingest.poll() is None, ingest.communicate()
        ingest.send_signal(signal.SIGINT)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = ingest.communicate(timeout=60)
    assert ingest.returncode == 130, err
    kept = re.search(r"dlfs: interrupted: 2 members keep ([\d,]+) files \([\d.]+ \w+\) of "
                     r"'pets', parked; continue with: (dlfs .*)", err)
    assert kept, err
    resume = kept.group(2)
    assert resume == shlex.join(["dlfs", *cluster.cli(), "ingest", str(tmp_path / "src"),
                                 "pets", "--progress", "none", "--replicas", "2", "--resume"])
    listed = run_advice(shlex.join(["dlfs", *cluster.cli(), "datasets"]))
    assert listed.returncode == 0, listed.stderr
    line, = listed.stdout.splitlines()
    assert line.startswith("pets\t") and "(ingest broke off: " in line
    discard = re.findall(r"`([^`]+)`", line)[1]
    assert discard == shlex.join(["dlfs", *cluster.cli(), "discard", "pets"])
    ended = run_advice(discard)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith("discarded the parked ingest of pets")
    for member in (first, second):
        with Client(member.address) as client:
            assert client.dataset_infos() == []
    resumed = run_advice(resume)  # nothing parked any more: a whole new ingest
    assert resumed.returncode == 0, resumed.stderr
    with cluster.client() as client:
        assert read_dataset(client, "pets") == files
