"""SIGKILL the daemon in the middle of ingests: sealed data survives, partial data never shows."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest

import dlfs
from dlfs import Client
from helpers.daemons import read_dataset
from helpers.trees import write_tree

KILL_POINTS = int(os.environ.get("DLFS_CRASH_KILL_POINTS", "20"))


@pytest.mark.slow
def test_kill_9_mid_ingest_then_restart(daemon, tmp_path):
    rng = np.random.default_rng(7)
    sealed_tree = {f"keep/{i:03d}.bin": rng.bytes(int(rng.integers(0, 20000))) for i in range(100)}
    big_tree = {f"big/{i:04d}.bin": rng.bytes(100_000) for i in range(300)}
    write_tree(tmp_path / "sealed", sealed_tree)
    write_tree(tmp_path / "big", big_tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "sealed"), "sealed")
    # How long a full ingest takes here, to spread the kill points over it.
    started = time.monotonic()
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "big"), "probe")
        client.delete("probe")
    duration = time.monotonic() - started
    chooser = random.Random(11)
    outcomes = []
    for attempt in range(KILL_POINTS):
        name = f"crash{attempt}"
        ingest = subprocess.Popen(
            [sys.executable, "-m", "dlfs.cli", "--server", daemon.address, "ingest",
             str(tmp_path / "big"), name, "--no-resumable"],  # test_resume.py: resumable ones
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if attempt == 0:
            wait_for_new_extents(daemon.data_dir, ingest)  # surely mid-stream
        else:
            time.sleep(chooser.uniform(0.0, duration * 1.2))
        daemon.kill()
        out, err = ingest.communicate(timeout=60)
        daemon.start_again()
        with Client(daemon.address) as client:
            assert read_dataset(client, "sealed") == sealed_tree
            infos = {i.name: i for i in client.dataset_infos()}
            if name in infos:
                # The kill came after the seal: then the dataset is complete.
                assert ingest.returncode == 0 or b"Unavailable" in err
                assert infos[name].sealed
                assert read_dataset(client, name) == big_tree
                outcomes.append("sealed")
                client.delete(name)
            else:
                assert ingest.returncode != 0, out
                with pytest.raises(dlfs.NotFound):
                    client.dataset(name)
                outcomes.append("discarded")
        extents = os.listdir(os.path.join(daemon.data_dir, "extents"))
        assert len(extents) == 1, "an interrupted ingest left extents behind"
    assert "discarded" in outcomes
    assert "discarding incomplete ingest of dataset 'crash0'" in daemon.log()


def wait_for_new_extents(data_dir, process, timeout_s=30.0):
    extents = os.path.join(data_dir, "extents")
    before = set(os.listdir(extents))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        new = set(os.listdir(extents)) - before
        if new and any(os.path.getsize(os.path.join(extents, d, f)) > 1_000_000
                       for d in new for f in os.listdir(os.path.join(extents, d))):
            return
        time.sleep(0.005)
    raise AssertionError("the ingest never started writing extents")
