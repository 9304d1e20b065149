"""The `dlfs` command line as users and scripts meet it, against real daemons: global options
anywhere, --version, help, --json, rm of several names, addresses, and advice run as
printed."""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import shlex
import subprocess
import sys
import tarfile
import time

import pytest

import dlfs
from dlfs import Client, limits
from dlfs.cli import main
from dlfs.client.transport.call_policy import call_with_retry
from dlfs.tools.launch import DaemonProcess
from helpers.trees import write_tree
from helpers.waiting import wait_until


def dlfs_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "dlfs.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def run_advice(command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a `dlfs ...` command line a tool printed, as a user pasting it would."""
    argv = shlex.split(command)
    assert argv[0] == "dlfs", command
    return dlfs_cli(*argv[1:], env=env)


@pytest.fixture
def pets(daemon, tmp_path):
    write_tree(tmp_path / "src", {"train/cat/1.jpg": b"meow", "train/dog/2.jpg": b"woof!",
                                  "readme": b"hi\n"})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "pets")
    return daemon.address


def test_global_options_are_taken_before_and_after_the_command(pets):
    before = dlfs_cli("--server", pets, "ls", "pets")
    after = dlfs_cli("ls", "pets", "--server", pets)
    between = dlfs_cli("ls", "--server", pets, "-l", "pets/train")
    assert before.returncode == after.returncode == between.returncode == 0, after.stderr
    assert before.stdout == after.stdout == "readme\ntrain/\n"
    assert between.stdout.splitlines()[0].endswith("cat/")
    # The value after the command wins over $DLFS_SERVER, as a flag before it does.
    assert dlfs_cli("datasets", "--server", pets, env={"DLFS_SERVER": "127.0.0.1:1"}) \
        .stdout.startswith("pets\t3 samples")
    assert dlfs_cli("datasets", env={"DLFS_SERVER": pets}).stdout.startswith("pets\t")


def test_version_on_every_command():
    for argv in (["--version"], ["ls", "--version"], ["ingest", "--version"],
                 ["status", "--version"]):
        done = dlfs_cli(*argv)
        assert (done.returncode, done.stdout) == (0, f"dlfs {dlfs.__version__}\n"), argv


def test_every_command_has_a_description_and_no_empty_default(capsys):
    commands = ("ingest", "datasets", "ls", "stat", "cat", "status", "warm", "scrub",
                "rebalance", "mkspace", "rm", "discard")
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out.split("  COMMAND\n", 1)[1].split("\n\n")[0]
    assert [line.split()[0] for line in listed.splitlines() if line.startswith("    ")
            and not line.startswith("     ")] == list(commands)
    for name in commands:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        description = text.split("\n\n")[1]
        assert not description.startswith(("positional arguments", "options")), name
        assert "(default: None)" not in text and "(default: )" not in text, name
        assert all(entry.count("(default:") <= 1 for entry in text.split("\n  -")), name


def test_json_output_of_the_listing_commands(pets):
    datasets = json.loads(dlfs_cli("--json", "datasets", "--server", pets).stdout)
    assert [(d["name"], d["samples"], d["bytes"], d["state"]) for d in datasets] == \
        [("pets", 3, 12, "sealed")]
    listing = json.loads(dlfs_cli("ls", "pets/train", "--json", "--server", pets).stdout)
    assert [(e["name"], e["type"], e["entries"], e["size"]) for e in listing] == \
        [("cat", "directory", 1, None), ("dog", "directory", 1, None)]
    entry = json.loads(dlfs_cli("stat", "pets/train/dog/2.jpg", "--json", "--server",
                                pets).stdout)
    assert (entry["path"], entry["type"], entry["size"], entry["entries"]) == \
        ("train/dog/2.jpg", "file", 5, None)
    with Client(pets) as client:
        assert entry["id"] == client.stat("pets", "train/dog/2.jpg").id
    [status] = json.loads(dlfs_cli("status", "--json", "--server", pets).stdout)
    assert (status["address"], status["up"], status["datasets"], status["samples"]) == \
        (pets, True, 1, 3)
    down = dlfs_cli("status", "--json", "--server", "127.0.0.1:1")
    assert down.returncode == 1
    [entry] = json.loads(down.stdout)
    assert (entry["up"], entry["error"]["type"]) == (False, "Unavailable")
    refused = dlfs_cli("cat", "pets/readme", "--json", "--server", pets)
    assert refused.returncode == 2 and "`dlfs cat` has no JSON output" in refused.stderr


def test_rm_takes_several_names_and_goes_on_past_a_missing_one(pets, tmp_path):
    with Client(pets) as client:
        client.ingest(str(tmp_path / "src"), "more")
    done = dlfs_cli("rm", "pets", "nope", "more", "--server", pets)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["removed pets: 3 samples, 12 B freed",
                                        "removed more: 3 samples, 12 B freed"]
    assert done.stderr.startswith("dlfs: NotFound: no dataset named 'nope'")
    assert dlfs_cli("datasets", "--server", pets).stdout == ""


def test_a_folder_of_archives_suggests_archives_and_the_suggestion_works(daemon, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for n in range(2):
        with tarfile.open(shards / f"{n:04d}.tar", "w") as tar:
            for key in ("a", "b"):
                data = f"{n}{key}".encode()
                info = tarfile.TarInfo(f"{n:04d}{key}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    done = dlfs_cli("--server", daemon.address, "ingest", str(shards), "web",
                    "--progress", "none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ingested web: 2 samples")  # the tars themselves
    note, _, command = done.stderr.strip().partition("; to store their members instead: ")
    assert note == f"note: {shards} holds only tar archives, stored as one sample each"
    again = run_advice(command)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("ingested web: 4 samples")
    assert "note:" not in again.stderr
    with Client(daemon.address) as client:
        assert bytes(client.get_batch(["0001b.txt"], dataset="web")[0]) == b"1b"


@pytest.mark.daemons
def test_a_host_without_a_port_means_port_7010(tmp_path):
    # A loopback address of its own, so that port 7010 is free whatever else runs here.
    host = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    daemon = DaemonProcess(str(tmp_path / "data"), str(tmp_path / "daemon.log"), ["--demo"])
    daemon.start(listen=f"{host}:{limits.daemon_port_default}")
    try:
        assert dlfs_cli("--server", host, "datasets").stdout.startswith("demo\t")
        with Client(host) as client:
            assert client.datasets() == ["demo"]
            assert client.address == f"{host}:7010"
    finally:
        daemon.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_that_is_not_a_dlfs_daemon_says_so(daemon_factory):
    data_port = _free_port()
    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0", "--data-port",
                                        str(data_port)])
    with Client(daemon.address) as client:
        metrics = client.status().metrics_address
    for wrong in (metrics, f"127.0.0.1:{data_port}"):
        done = dlfs_cli("--server", wrong, "datasets")
        assert done.returncode == 1
        assert done.stderr == (f"dlfs: InvalidArgument: {wrong} is not a DLFS daemon (is it "
                               "the data-path or metrics port?)\n")


def test_a_grpc_server_without_the_dlfs_service_is_not_a_daemon():
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(f"127.0.0.1:{port}") as client:
            with pytest.raises(dlfs.InvalidArgument, match=re.escape(
                    f"127.0.0.1:{port} is not a DLFS daemon (is it the data-path or metrics "
                    "port?)")):
                client.datasets()
    finally:
        server.stop(None)


def test_a_daemon_never_reached_is_given_up_after_the_first_contact_bound():
    """A process that never reached a daemon stops retrying after
    `limits.first_contact_timeout_s`; one it reached is waited for the caller's whole
    window (it is restarting).  A fake clock: the bound, not the machine's speed."""
    now = [0.0]

    def down():
        raise dlfs.Unavailable("down")

    def attempt_times(address: str) -> float:
        now[0] = 0.0
        with pytest.raises(dlfs.Unavailable):
            call_with_retry(down, address=address, timeout_s=10.0, clock=lambda: now[0],
                            sleep=lambda s: now.__setitem__(0, now[0] + s))
        return now[0]

    assert attempt_times("never-reached:7010") <= limits.first_contact_timeout_s
    assert call_with_retry(lambda: 1, address="reached:7010", timeout_s=0) == 1
    assert limits.first_contact_timeout_s < attempt_times("reached:7010") <= 10.0


def test_the_client_of_a_down_daemon_fails_as_fast_as_the_cli():
    started = time.monotonic()
    with pytest.raises(dlfs.Unavailable, match="DLFS daemon at 127.0.0.1:1 is unavailable"):
        with Client("127.0.0.1:1") as client:
            client.datasets()
    # The whole reconnect window (10 s) is for daemons this process has reached.
    assert time.monotonic() - started < limits.reconnect_timeout_s_default


def test_one_failover_warning_per_outage(cluster, tmp_path, caplog):
    daemons = cluster.start(3, ["--member-lease-ttl-s", "60"])  # outlives the test
    addresses = sorted(d.address for d in daemons)
    victim = next(d for d in daemons if d.address == addresses[1])
    write_tree(tmp_path / "src", {f"f{i:03d}": bytes([i]) * 1000 for i in range(96)})
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "ds", replicas=2)
    victim.kill()  # its lease lives on: it is listed, and does not answer
    with caplog.at_level(logging.WARNING, logger="dlfs"):
        with cluster.client() as client:
            for _ in range(3):  # parts of each batch go to every member at once
                assert len(client.get_batch(range(96), dataset="ds")) == 96
            placement = client.transport.placement("ds")
            paths = client.dataset("ds").paths()
    # A sample whose first holder is the killed member: a new process asks it first.
    first_on_victim = next(paths[i] for i in range(96)
                           if placement.members[placement.holders[i][0]] == victim.address)
    warnings = [r.getMessage() for r in caplog.records if "replicas" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"reads go to the replicas of DLFS daemon {addresses[1]} "
                                  f"for {limits.member_down_s:.0f} s: DLFS daemon at "
                                  f"{addresses[1]} is unavailable")
    assert warnings[0].count("DLFS daemon at") == 1
    # The CLI prints it once, as a warning line of its own.
    done = dlfs_cli(*cluster.cli(), "cat", f"ds/{first_on_victim}")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("dlfs: warning: reads go to the replicas") == 1, done.stderr


def test_rebalance_says_a_member_down_removes_its_copy_itself(cluster, tmp_path):
    """A member left out while it is down is not given a command to run: it deletes its
    copy itself when it reads etcd again, as the CLI says."""
    a, b, c = cluster.start(3, ["--member-lease-ttl-s", "60"])
    write_tree(tmp_path / "src", {f"f{i:03d}": bytes([i]) * 500 for i in range(40)})
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "ds", replicas=2)
    b.kill()  # the member being dropped is down when the old copies are removed
    done = dlfs_cli("rebalance", "ds", "--members", f"{a.address},{c.address}", *cluster.cli())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rebalanced ds onto 2 daemons (2x): 40 samples")
    assert done.stderr.strip().splitlines()[-1] == (
        f"{b.address} left the dataset but had not removed its copy yet: each does so when it "
        "reads etcd again (at its start, if it is down)")
    assert "`" not in done.stderr  # no command to run
    b.start_again()
    with Client(b.address) as member:
        wait_until(lambda: member.dataset_infos() == [], "the dropped member to remove its copy",
                   60)
    assert not os.listdir(os.path.join(b.data_dir, "extents"))
    listed = dlfs_cli(*cluster.cli(), "datasets")
    assert listed.returncode == 0 and listed.stdout.startswith("ds\t40 samples"), listed.stderr


def test_a_cluster_is_named_by_etcd_anywhere_on_the_line(cluster, tmp_path):
    cluster.start(2)
    write_tree(tmp_path / "src", {"a.txt": b"alpha", "b.txt": b"beta"})
    done = dlfs_cli("ingest", str(tmp_path / "src"), "pair", "--progress", "none", *cluster.cli())
    assert done.returncode == 0, done.stderr
    env = {"DLFS_ETCD": cluster.urls, "DLFS_CLUSTER": cluster.name}
    assert dlfs_cli("cat", "pair/a.txt", env=env).stdout == "alpha"
    # $DLFS_ETCD wins over $DLFS_SERVER; a --server flag wins over $DLFS_ETCD.
    assert dlfs_cli("datasets", env={**env, "DLFS_SERVER": "127.0.0.1:1"}) \
        .stdout.startswith("pair\t2 samples")
    both = dlfs_cli("datasets", "--server", "127.0.0.1:1", *cluster.cli())
    assert both.returncode == 2 and "give --server (one daemon) or --etcd (a cluster), not " \
        "both" in both.stderr
    several = dlfs_cli("datasets", "--server", "127.0.0.1:1,127.0.0.1:2")
    assert several.returncode == 1
    assert "form a cluster through etcd: start them with --etcd URL" in several.stderr


def test_status_lists_the_members_etcd_holds(cluster):
    daemons = cluster.start(2)
    done = dlfs_cli("status", *cluster.cli())
    assert done.returncode == 0, done.stderr
    for daemon in daemons:
        assert f"member {daemon.address}: serving, dlfs {dlfs.__version__}" in done.stdout
        assert f"daemon {daemon.address}: up " in done.stdout
    listed = json.loads(dlfs_cli("--json", "status", *cluster.cli()).stdout)
    assert sorted(entry["address"] for entry in listed) == sorted(d.address for d in daemons)
    for entry in listed:
        assert entry["up"] and entry["member"]["address"] == entry["address"]
        assert entry["member"]["state"] == "serving" and entry["member"]["capacity_bytes"] > 0
    empty = dlfs_cli("status", "--etcd", cluster.urls, "--cluster", "nobody-here")
    assert empty.returncode == 1
    assert "no DLFS cluster 'nobody-here' in etcd" in empty.stderr


def test_a_missing_dataset_names_the_listing_command(pets):
    missing = dlfs_cli("ls", "nope", "--server", pets)
    assert missing.returncode == 1
    command = re.search(r"`([^`]+)`", missing.stderr).group(1)
    assert command == "dlfs datasets"
    listed = run_advice(command, env={"DLFS_SERVER": pets})
    assert listed.returncode == 0 and listed.stdout.startswith("pets\t")
