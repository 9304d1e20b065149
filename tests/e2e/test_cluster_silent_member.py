"""A striped replace or ingest right after a member's kill -9 (issue 55, item 5), against
real daemons and a real etcd: it goes ahead with the members that answer when they
can hold the replicas, else waits for the silent one's lease or its return, and never
fails on a member the cluster is about to drop; the CLI says which it did."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from helpers.daemons import addresses, read_dataset
from helpers.trees import write_tree

LONG_LEASE = ["--member-lease-ttl-s", "60"]  # outlives each test: the member stays listed


@pytest.fixture
def versions(tmp_path):
    rng = np.random.default_rng(55)
    trees = []
    for version in range(2):
        files = {f"v/{i:03d}.bin": rng.bytes(int(rng.integers(10, 4000))) for i in range(80)}
        write_tree(tmp_path / f"v{version}", files)
        trees.append((tmp_path / f"v{version}", files))
    return trees


def test_a_replace_after_a_kill_goes_to_the_members_that_answer(cluster, versions):
    """Three members, two replicas, one killed (its lease lives on for a minute): the
    replace goes to the two that answer at once, and the CLI says so."""
    three = cluster.start(3, LONG_LEASE)
    (old, _), (new, files) = versions
    run = [sys.executable, "-m", "dlfs.cli", *cluster.cli()]
    done = subprocess.run(run + ["ingest", "--replicas", "2", str(old), "ds"],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    three[1].kill()
    done = subprocess.run(run + ["ingest", "--replace", "--replicas", "2", str(new), "ds"],
                          capture_output=True, timeout=120)
    said = done.stderr.decode()
    assert done.returncode == 0, said
    live = sorted(addresses([three[0], three[2]]))
    assert (f"dlfs: warning: the replace of 'ds' goes to the 2 members that answer: "
            f"{three[1].address} does not (its lease in etcd ends within 60 s, and the "
            "cluster drops it then)") in said, said
    with cluster.client() as client:
        ds = client.dataset("ds")
        assert ds.info.members == tuple(live) and ds.info.replicas == 2
        assert read_dataset(client, "ds") == files


def test_an_ingest_that_needs_every_member_waits_for_the_killed_ones_return(cluster,
                                                                           versions):
    """Two members, two replicas: without the killed one the replicas cannot be placed,
    so the ingest waits; the member restarts within its lease and the ingest goes to
    both."""
    two = cluster.start(2, LONG_LEASE)
    (source, files), _ = versions
    two[1].kill()
    run = [sys.executable, "-m", "dlfs.cli", *cluster.cli()]
    ingest = subprocess.Popen(run + ["ingest", "--replicas", "2", str(source), "ds"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = ingest.stderr.readline()  # the CLI waits: now the member comes back
        assert first == (f"dlfs: warning: {two[1].address} does not answer; the ingest of "
                         "'ds' waits up to 62 s for it to answer again or for its lease in "
                         "etcd to end\n"), first
        two[1].start_again()  # as systemd would
        out, rest = ingest.communicate(timeout=180)
    finally:
        ingest.kill()
    assert ingest.returncode == 0, first + rest
    assert (f"dlfs: warning: the ingest of 'ds' goes to 2 members "
            f"({', '.join(sorted(addresses(two)))})") in rest, rest
    with cluster.client() as client:
        assert client.dataset("ds").info.members == tuple(sorted(addresses(two)))
        assert read_dataset(client, "ds") == files


def test_a_member_killed_mid_ingest_is_left_out_of_a_second_try(cluster, versions, caplog):
    """The member dies while the ingest streams to it: the client sees it silent and
    starts the ingest once more over the members that answer."""
    three = cluster.start(3, LONG_LEASE)
    victim = three[2]
    victim.stop()
    victim.extra_env = {"DLFS_FAULT": "write:3:kill"}  # dies at its third write
    victim.start_again()
    (_, files), _ = versions
    with cluster.client(reconnect_timeout_s=1) as client, \
            caplog.at_level(logging.WARNING, logger="dlfs"):
        info = client.ingest(str(versions[0][0]), "ds", replicas=2)
        assert (f"the ingest of 'ds' broke off: {victim.address} stopped answering; "
                "starting it again") in caplog.text, caplog.text
        assert info.samples == len(files)
        assert client.dataset("ds").info.members == tuple(sorted(addresses(three[:2])))
        assert read_dataset(client, "ds") == files
    assert "fault injected" in victim.log()
