"""What a newcomer types in the first hour, run as typed, with what it prints checked
line by line: counts in words ("1 sample"), the ingest's usage line, a NAME that
defaults to the source's base name, a warning for a source that gave nothing,
`ls -l`'s size column, a single file that is no archive, a malformed address, an
address nobody listens on, and `./dev demo`'s ready line."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.cli_advice import run_dlfs
from helpers.trees import write_tree
from dlfs import Client, InvalidArgument, Unavailable


def test_one_of_each_reads_as_one(daemon, tmp_path):
    write_tree(tmp_path / "one", {"x.bin": b"abcdef"})
    os.symlink("x.bin", tmp_path / "one" / "link")
    done = run_dlfs(daemon.address, ["ingest", str(tmp_path / "one"), "one"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ingested one: 1 sample, 6 bytes"
    assert lines[1].startswith("sent 1 file, 6 B in ")
    assert lines[2] == "skipped: 1 symlink"
    assert run_dlfs(daemon.address, ["datasets"]).stdout.startswith("one\t1 sample\t6 B")
    dry = run_dlfs(daemon.address, ["ingest", "--dry-run", str(tmp_path / "one"), "again"])
    assert dry.stdout.splitlines()[-1] == (
        "would ingest again: 1 file, 6 bytes from 1 tree; skipped: 0 hidden, 1 symlink, "
        "0 special files, 0 symlink loops, 0 unreadable")


def test_the_usage_line_makes_one_dataset():
    done = subprocess.run([sys.executable, "-m", "dlfs.cli", "ingest", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[0] == "usage: dlfs ingest [options] SOURCE... [NAME]"


def test_one_source_alone_names_the_dataset_by_its_base_name(daemon, tmp_path):
    write_tree(tmp_path / "flowers", {"a.jpg": b"1", "b.jpg": b"22"})
    done = run_dlfs(daemon.address, ["ingest", str(tmp_path / "flowers") + "/"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "ingested flowers: 2 samples, 3 bytes"
    with Client(daemon.address) as client:
        assert client.datasets() == ["flowers"]


def test_a_source_alone_without_a_usable_name_asks_for_one(daemon, tmp_path):
    done = run_dlfs(daemon.address, ["ingest", str(tmp_path / "shards") + "/*.tar"])
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"dlfs: InvalidArgument: name the dataset: dlfs ingest '{tmp_path}/shards/*.tar' NAME ")
    assert len(done.stderr.splitlines()) == 1


def test_a_source_that_gives_no_file_is_ingested_with_a_warning(daemon, tmp_path):
    write_tree(tmp_path / "src", {".hidden": b"h"})
    done = run_dlfs(daemon.address, ["ingest", str(tmp_path / "src"), "nothing"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "ingested nothing: 0 samples, 0 bytes"
    assert done.stderr.splitlines() == [
        f"dlfs: warning: nothing has no file: {tmp_path}/src held none to ingest "
        "(skipped: 1 hidden)"]


def test_ls_long_shows_a_directory_size_not_its_entries(daemon, tmp_path):
    write_tree(tmp_path / "src", {f"d/{i}.bin": b"x" for i in range(7)})
    run_dlfs(daemon.address, ["ingest", str(tmp_path / "src"), "ds"])
    with Client(daemon.address) as client:
        size = client.stat("ds", "d").size
    line = run_dlfs(daemon.address, ["ls", "-l", "ds"]).stdout.splitlines()[0]
    assert line.split()[1] == str(size) != "7" and line.endswith(" d/")


def test_a_single_file_that_is_no_archive_is_a_one_sample_dataset(daemon, tmp_path):
    data = os.urandom(70_000)
    (tmp_path / "train.h5").write_bytes(data)
    done = run_dlfs(daemon.address, ["ingest", str(tmp_path / "train.h5")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "ingested train.h5: 1 sample, 70000 bytes (68.4 KiB)"
    cat = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address, "cat",
                          "train.h5/train.h5"], capture_output=True, timeout=60)
    assert cat.returncode == 0 and cat.stdout == data
    with Client(daemon.address) as client:  # the Python API takes it too, with other files
        write_tree(tmp_path / "more", {"labels.csv": b"a,b\n"})
        client.ingest([str(tmp_path / "train.h5"), str(tmp_path / "more")], "both")
        assert sorted(e.name for e in client.listdir("both", "")) == ["labels.csv", "train.h5"]


def test_a_malformed_address_is_a_usage_error_before_any_connection():
    for wrong, why in (("127.0.0.1:notaport", "the port 'notaport' is not a number from 1 "
                        "to 65535"), (":7010", "names no host"),
                       ("127.0.0.1:70100", "the port '70100' is not a number")):
        done = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", wrong, "datasets"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"dlfs: error: --server: daemon address {wrong!r}") and why in last
        with pytest.raises(InvalidArgument, match=why):
            Client(wrong)


def test_an_address_nobody_listens_on_is_reported_at_once_in_one_line():
    """A refused connection (ECONNREFUSED) is one Unavailable line with what to do, with
    no retries for a daemon this process never reached.  The CLI's bound is over the
    time its interpreter takes to start and refuse a malformed address (the same
    imports, no connection): the machine's speed is not what is checked."""
    with socket.socket() as bound:  # bound, not listening: connects are refused
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", address,
                               "datasets"], capture_output=True, text=True, timeout=60)
        elapsed_s = time.monotonic() - started
        started = time.monotonic()
        usage = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server",
                                "127.0.0.1:notaport", "datasets"], capture_output=True,
                               text=True, timeout=60)
        start_s = time.monotonic() - started
        assert (done.returncode, usage.returncode) == (1, 2), done.stderr
        assert done.stdout == "" and done.stderr.splitlines() == [
            f"dlfs: Unavailable: DLFS daemon at {address} is unavailable: nothing listens "
            "there (connection refused); start dlfs-server there, or give the address one "
            "listens on (--server HOST:PORT or $DLFS_SERVER)"]
        assert elapsed_s < start_s + 1.0, (elapsed_s, start_s)
        started = time.monotonic()
        with pytest.raises(Unavailable, match="nothing listens there") as raised:
            Client(address).datasets()
        assert raised.value.refused and raised.value.tried == ()
        assert time.monotonic() - started < 1.0
        if importlib.util.find_spec("torch") is None:
            return  # dlfs.torch needs the torch extra
        from dlfs.torch import DLFSDataset
        started = time.monotonic()
        with pytest.raises(Unavailable, match="nothing listens there"):
            DLFSDataset(address, "demo")
        assert time.monotonic() - started < 1.0
        with pytest.raises(InvalidArgument, match="the port 'notaport' is not a number"):
            DLFSDataset("127.0.0.1:notaport", "demo")


def test_dev_demo_says_ready_with_the_address_and_ctrl_c_stops_it(tmp_path):
    """`./dev demo` as typed (its options passed on to dlfs-server: a data dir and port of
    this test's, so a demo the user runs is left alone; the ready file is the checkout's
    .dlfs-demo/address)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    demo = subprocess.Popen(["./dev", "demo", "--data-dir", str(tmp_path / "data"),
                             "--listen", "127.0.0.1:0"], cwd=repo, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        ready = None
        for line in demo.stderr:
            if line.startswith("dev: ready: "):
                ready = line.rstrip("\n")
                break
        assert ready is not None, "./dev demo ended without a ready line"
        address = ready.split("dlfs-server serves ", 1)[1].split(";", 1)[0]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), ready
        hint = ready.split("in another shell try: ", 1)[1]
        tried = subprocess.run(hint.split(), cwd=repo, capture_output=True, text=True,
                               timeout=60, env={**os.environ, "DLFS_SERVER": address})
        assert tried.returncode == 0 and tried.stdout.split() == ["bird/", "cat/", "dog/"], \
            tried
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C in its terminal
        rest = demo.stderr.read()
        assert demo.wait(60) == 0, rest
        assert "stopped; catalog flushed" in rest
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
