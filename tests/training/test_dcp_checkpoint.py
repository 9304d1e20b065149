"""dlfs.torch.checkpoint: torch.distributed.checkpoint into checkpoint spaces, against a real
daemon; several ranks are spawned processes on gloo (dcp_ranks)."""

from __future__ import annotations

import io
import multiprocessing
import queue
import re
import signal
import socket
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import dcp_ranks
from helpers.daemons import metric_samples
from dlfs.errors import InvalidArgument
from dlfs.torch.checkpoint import DLFSReader, DLFSWriter, parse_checkpoint_id
from dlfs.torch.checkpoint import dcp_reader
from dlfs.torch.checkpoint.read_runs import PiecesReader, ReadRun, pieces, plan_runs

RANKS_TIMEOUT_S = 240  # a bound for a hang on a loaded machine, not a speed target


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # no_dist=True says "assuming ... a single process"
        warnings.simplefilter("ignore", UserWarning)
        yield


def _id(daemon, path: str) -> str:
    return f"dlfs://{daemon.address}/{path}"


def _save(state, checkpoint_id, **options):
    dcp.save(state, storage_writer=DLFSWriter(checkpoint_id, **options), no_dist=True)


def _load(state, checkpoint_id, **options) -> DLFSReader:
    reader = DLFSReader(checkpoint_id, **options)
    dcp.load(state, storage_reader=reader, no_dist=True)
    return reader


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(target, world: int, base: str):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=target, args=(rank, world, port, base, results))
                 for rank in range(world)]
    for p in processes:
        p.start()
    return processes, results


def _reports(processes, results, count: int) -> dict:
    found = {}
    try:
        while len(found) < count:
            rank, report = results.get(timeout=RANKS_TIMEOUT_S)
            found[rank] = report
    except queue.Empty:
        pytest.fail(f"ranks reported only {found} within {RANKS_TIMEOUT_S} s")
    finally:
        for p in processes:
            p.join(RANKS_TIMEOUT_S)
            if p.is_alive():
                p.kill()
    return found


# --- checkpoint ids ---------------------------------------------------------------------

def test_checkpoint_ids_name_a_daemon_a_space_and_a_directory(monkeypatch):
    location = parse_checkpoint_id("dlfs://10.0.0.5:7011/ckpt/run1/step100/")
    assert (location.address, location.space, location.directory) == \
        ("10.0.0.5:7011", "ckpt", "run1/step100")
    assert location.path(".metadata") == "run1/step100/.metadata"
    assert str(location) == "dlfs://10.0.0.5:7011/ckpt/run1/step100"
    root = parse_checkpoint_id("dlfs://[::1]:7010/ckpt")
    assert (root.address, root.space, root.directory, root.path("x")) == \
        ("[::1]:7010", "ckpt", "", "x")
    monkeypatch.delenv("DLFS_SERVER", raising=False)
    assert parse_checkpoint_id("dlfs:///ckpt/a").address == "127.0.0.1:7010"
    monkeypatch.setenv("DLFS_SERVER", "host7:9000")
    assert parse_checkpoint_id("dlfs:///ckpt/a").address == "host7:9000"


@pytest.mark.parametrize("bad", ["/tmp/ckpt", "s3://bucket/ckpt", "dlfs://host:1/",
                                 "dlfs://host:1/ckpt/../x", "dlfs://host:1/ckpt/a?x=1",
                                 "dlfs://host:1/bad name!/a", Path("/tmp/ckpt"), 7])
def test_validate_checkpoint_id_accepts_dlfs_ids_only(bad):
    assert DLFSWriter.validate_checkpoint_id("dlfs://host:1/ckpt/step1")
    assert DLFSReader.validate_checkpoint_id("dlfs:///ckpt")
    assert not DLFSWriter.validate_checkpoint_id(bad)
    assert not DLFSReader.validate_checkpoint_id(bad)
    with pytest.raises(InvalidArgument):
        DLFSWriter(bad)


# --- how a restore reads ------------------------------------------------------------------

def test_plan_runs_sorts_and_joins_neighbours_within_the_bounds():
    spans = [("b", 0, 10), ("a", 100, 50), ("a", 0, 100), ("a", 160, 40),  # 10 B gap
             ("a", 1000, 10),  # 800 B gap: a run of its own
             ("a", 1010, 5000),  # would grow that run past 4096 B: a new run
             ("a", 1010, 5)]  # inside the item before it: joins its run
    runs = plan_runs(spans, gap_bytes_max=64, run_bytes_max=4096)
    assert runs == [ReadRun("a", 0, 200, [(2, 0, 100), (1, 100, 50), (3, 160, 40)]),
                    ReadRun("a", 1000, 10, [(4, 0, 10)]),
                    ReadRun("a", 1010, 5000, [(5, 0, 5000), (6, 0, 5)]),
                    ReadRun("b", 0, 10, [(0, 0, 10)])]
    assert pieces(runs[2], 2048) == [(1010, 2048), (3058, 2048), (5106, 904)]
    assert pieces(ReadRun("a", 7, 0), 2048) == [(7, 0)]


def test_pieces_reader_reads_across_pieces_and_seeks():
    data = bytes(range(256)) * 40
    views = [memoryview(data[at:at + 1000]) for at in range(0, len(data), 1000)]
    reader = PiecesReader(views, 990, 3000)
    assert reader.read(25) == data[990:1015]
    assert reader.seek(-10, io.SEEK_END) == 2990
    assert reader.read() == data[3980:3990]
    reader.seek(0)
    assert reader.read() == data[990:3990]
    with pytest.raises(ValueError):
        PiecesReader(views, 10000, 300)


def test_a_restore_reads_each_file_in_few_sorted_ranges(daemon_factory):
    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0"])
    state = {f"layer{i}": torch.full((256,), float(i)) for i in range(64)}
    state.update({f"blob{i}": io.BytesIO(bytes([i]) * 100) for i in range(5)})
    checkpoint = _id(daemon, "ckpt/small")
    _save(state, checkpoint, thread_count=2)
    out = {f"layer{i}": torch.zeros(256) for i in range(64)}
    out.update({f"blob{i}": io.BytesIO() for i in range(5)})
    from dlfs import Client

    with Client(daemon.address) as client:
        before = metric_samples(client).get(("dlfs_reads_total", (("method", "DataRange"),)), 0)
        reader = _load(out, checkpoint, client=client)
        after = metric_samples(client)[("dlfs_reads_total", (("method", "DataRange"),))]
        files = [e.name for e in client.space("ckpt").listdir("small")]
    assert files == [".metadata", "__0_0.distcp", "__0_1.distcp"]
    # 69 items in two files: one run and one data-path request per file, after the
    # .metadata's (the daemon counted them all).
    assert reader.last_read.items == 69
    assert reader.last_read.runs == reader.last_read.requests == 2
    assert after - before == 1 + 2
    assert dcp_ranks.differences(out, state) == []


def test_a_tensor_larger_than_a_piece_comes_in_several_requests(daemon, monkeypatch):
    monkeypatch.setattr(dcp_reader, "PIECE_BYTES", 64 * 1024)
    state = {"big": torch.rand(300_000), "small": torch.arange(10)}
    checkpoint = _id(daemon, "ckpt/big")
    _save(state, checkpoint, thread_count=1)
    out = {"big": torch.zeros(300_000), "small": torch.zeros(10, dtype=torch.long)}
    reader = _load(out, checkpoint, read_threads=3)
    assert reader.last_read.runs == 2  # the small tensor alone; the big one alone
    assert reader.last_read.requests == 2 + 1_200_000 // (64 * 1024)
    assert dcp_ranks.differences(out, state) == []


# --- save and load ---------------------------------------------------------------------

def test_save_and_load_a_model_optimizer_and_other_values(daemon):
    from dlfs import Client

    state = dcp_ranks.state_dict(0, 0)
    checkpoint = _id(daemon, "new-space/run/step1")  # the space and directories appear
    _save(state, checkpoint, thread_count=3)
    out = dcp_ranks.state_dict(0, 0, zeros=True)
    assert dcp_ranks.differences(out, state) != []
    _load(out, checkpoint)
    assert dcp_ranks.differences(out, state) == []
    with Client(daemon.address) as client:
        names = sorted(e.name for e in client.space("new-space").listdir("run/step1"))
    assert names == [".metadata", "__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]


def test_the_files_are_dcps_own_format_both_ways(daemon, tmp_path):
    from dlfs import Client

    state = {"w": torch.rand(10, 10), "blob": io.BytesIO(b"abc"), "n": 5}
    _save(state, _id(daemon, "ckpt/compat"))
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "theirs")), no_dist=True)
    (tmp_path / "ours").mkdir()
    with Client(daemon.address) as client:
        space = client.space("ckpt")
        for entry in space.listdir("compat"):  # out of the space, for FileSystemReader
            (tmp_path / "ours" / entry.name).write_bytes(
                bytes(space.read(f"compat/{entry.name}")))
        space.mkdir("theirs")
        for path in (tmp_path / "theirs").iterdir():  # into the space, for DLFSReader
            with space.open(f"theirs/{path.name}", "wb") as f:
                f.write(path.read_bytes())
    out = {"w": torch.zeros(10, 10), "blob": io.BytesIO(), "n": 0}
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(tmp_path / "ours")), no_dist=True)
    assert dcp_ranks.differences(out, state) == []
    out = {"w": torch.zeros(10, 10), "blob": io.BytesIO(), "n": 0}
    _load(out, _id(daemon, "ckpt/theirs"))
    assert dcp_ranks.differences(out, state) == []


def test_the_training_doc_snippet_runs_as_written(daemon):
    doc = Path(__file__).resolve().parents[2] / "docs" / "training.md"
    mark = "<!-- runs: tests/training/test_dcp_checkpoint.py -->"
    [code] = re.findall(re.escape(mark) + r"\n```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert "127.0.0.1:7010" in code
    namespace: dict = {}
    exec(compile(code.replace("127.0.0.1:7010", daemon.address), "docs/training.md", "exec"),
         namespace)
    assert namespace["state"]["step"] == 100
    saved = namespace["optimizer"].state_dict()["state"][0]["exp_avg"]
    assert saved.abs().sum() > 0  # the first job's optimizer state, not a fresh one's


def test_overwriting_replaces_the_checkpoint_and_overwrite_false_refuses(daemon):
    checkpoint = _id(daemon, "ckpt/again")
    _save({"w": torch.ones(4)}, checkpoint)
    _save({"w": torch.full((4,), 2.0)}, checkpoint)
    out = {"w": torch.zeros(4)}
    _load(out, checkpoint)
    assert torch.equal(out["w"], torch.full((4,), 2.0))
    with pytest.raises(CheckpointException, match="holds a checkpoint already"):
        _save({"w": torch.full((4,), 3.0)}, checkpoint, overwrite=False)
    _load(out, checkpoint)
    assert torch.equal(out["w"], torch.full((4,), 2.0))


def test_loading_a_directory_without_a_finished_checkpoint_says_so(daemon):
    _save({"w": torch.ones(4)}, _id(daemon, "ckpt/exists"))
    with pytest.raises(CheckpointException, match="holds no finished checkpoint: it has no .metadata"):
        _load({"w": torch.zeros(4)}, _id(daemon, "ckpt/never-saved"))


def test_a_space_that_is_a_dataset_is_refused(daemon, tmp_path):
    from dlfs import Client

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"x")
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "images")
    with pytest.raises(CheckpointException, match="is a dataset, not a checkpoint space"):
        _save({"w": torch.ones(4)}, _id(daemon, "images/step1"))


# --- several ranks ---------------------------------------------------------------------

def test_three_ranks_save_and_async_save_then_load(daemon):
    from dlfs import Client

    base = _id(daemon, "ckpt/three")
    processes, results = _spawn(dcp_ranks.save_then_load, 3, base)
    reports = _reports(processes, results, 3)
    assert reports == {0: [], 1: [], 2: []}
    with Client(daemon.address) as client:
        names = {e.name for e in client.space("ckpt").listdir("three/sync")}
    assert {f"__{rank}_0.distcp" for rank in range(3)} <= names
    assert ".metadata" in names and ".metadata.tmp" not in names


def test_async_save_with_the_process_executor(daemon):
    processes, results = _spawn(dcp_ranks.async_save_in_a_process, 2, _id(daemon, "ckpt/proc"))
    assert _reports(processes, results, 2) == {0: [], 1: []}


def test_a_coordinator_killed_before_its_commit_leaves_no_checkpoint(daemon):
    from dlfs import Client

    base = _id(daemon, "ckpt/killed")
    processes, results = _spawn(dcp_ranks.save_twice_dying_in_the_second, 2, base)
    try:
        assert sorted(results.get(timeout=RANKS_TIMEOUT_S) for _ in range(2)) == \
            [(0, "step1 saved"), (1, "step1 saved")]
        processes[0].join(RANKS_TIMEOUT_S)
        assert processes[0].exitcode == -signal.SIGKILL
        assert results.empty()  # neither rank finished step2
    finally:
        for p in processes:
            p.kill()
            p.join(RANKS_TIMEOUT_S)
    with Client(daemon.address) as client:
        names = {e.name for e in client.space("ckpt").listdir("killed/step2")}
    # Every data file was committed, the metadata written aside, never renamed.
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata.tmp"} <= names
    assert ".metadata" not in names
    with pytest.raises(CheckpointException, match="killed/step2 holds no finished checkpoint"):
        _load({"step": 0}, f"{base}/step2")
    # The step before it loads whole, every rank's part and the sharded tensor.
    out = dcp_ranks.state_dict(0, 0, zeros=True)
    out["rank1"] = dcp_ranks.state_dict(1, 0, zeros=True)["rank1"]
    out["sharded"] = torch.zeros(dcp_ranks.SHARDED_ROWS, 5)
    _load(out, f"{base}/step1")
    want = dcp_ranks.state_dict(0, 0)
    want["rank1"] = dcp_ranks.state_dict(1, 0)["rank1"]
    want["sharded"] = torch.arange(dcp_ranks.SHARDED_ROWS * 5.0).reshape(-1, 5)
    assert dcp_ranks.differences(out, want) == []
