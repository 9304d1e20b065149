"""dlfs.training.profile.Timeline: per-batch wait/decode/step, summary, and a valid Chrome/Perfetto
trace."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time

import pytest

from dlfs import Client
from dlfs.training.pipeline import iter_batches
from dlfs.training.profile import SPOOL_PREFIX, Timeline, format_summary, spool_span
from helpers.trees import unique_name, write_tree

SAMPLES = 40
STEP_S = 0.02
LOADER_TIMEOUT_S = 60  # a hung worker fails the test instead of hanging it


@pytest.fixture(scope="module")
def dataset(shared_daemon, tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    write_tree(root, {f"{c}/{i:03d}.bin": bytes([i]) * 1000 for i in range(SAMPLES)
                      for c in ["a" if i % 2 else "b"]})
    name = unique_name("prof")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name


def check_chrome_trace(document: dict) -> list[dict]:
    """Assert the JSON object format of the Chrome trace event spec (what Perfetto imports).

    Returns the complete ("X") events.
    """
    assert set(document) <= {"traceEvents", "displayTimeUnit", "otherData"}
    assert document["displayTimeUnit"] in ("ms", "ns")
    assert all(isinstance(v, str) for v in document.get("otherData", {}).values())
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    named_processes, named_threads, spans = set(), set(), []
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["name"], str) and e["name"]
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index")
            assert isinstance(e["args"], dict)
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
        else:
            assert e["ph"] == "X", e
            assert isinstance(e["cat"], str)
            for key in ("ts", "dur"):
                assert isinstance(e[key], (int, float)) and math.isfinite(e[key]) and e[key] >= 0
            assert isinstance(e.get("args", {}), dict)
            spans.append(e)
    assert {e["pid"] for e in spans} <= named_processes
    assert {(e["pid"], e["tid"]) for e in spans} <= named_threads
    # On one track, complete events must nest or be disjoint (ours never nest).
    by_track: dict = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in by_track.values():
        track.sort(key=lambda e: e["ts"])
        for a, b in zip(track, track[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
    return spans


def test_pipeline_timeline_summary_and_trace(dataset, tmp_path, capsys):
    address, name = dataset
    trace = tmp_path / "trace.json"
    with Client(address) as client, Timeline(trace) as tl:
        ds = client.dataset(name)
        for epoch in range(2):
            batches = iter_batches(ds, list(range(SAMPLES)), 8, prefetch=2, timeline=tl)
            for ids, samples in tl.wrap(batches, label=f"epoch {epoch}"):
                with tl.decode():
                    [bytes(s) for s in samples]
                with tl.step():
                    time.sleep(STEP_S)
    printed = capsys.readouterr().out
    assert "epoch 0" in printed and "epoch 1" in printed and str(trace) in printed
    summary = tl.summary()
    assert summary["batches"] == 10 and summary["samples"] == 2 * SAMPLES
    assert [p["batches"] for p in summary["phases"]] == [5, 5]
    assert summary["step_s"] >= 10 * STEP_S
    for part in summary["phases"] + [summary]:
        assert part["wait_s"] + part["decode_s"] + part["step_s"] <= part["wall_s"] + 1e-6
        assert part["utilisation"] == pytest.approx(part["step_s"] / part["wall_s"])
        assert part["io_bound_fraction"] == pytest.approx(part["wait_s"] / part["wall_s"])
        assert part["samples_per_s"] == pytest.approx(part["samples"] / part["wall_s"])
    spans = check_chrome_trace(json.loads(trace.read_text()))
    names = [e["name"] for e in spans]
    assert names.count("wait") == names.count("step") == names.count("decode") == 10
    fetches = [e for e in spans if e["name"] == "get_batch"]
    assert len(fetches) == 10
    main_tid = next(e["tid"] for e in spans if e["name"] == "step")
    assert all(e["tid"] != main_tid for e in fetches)  # fetched on the pool's threads


def test_dataloader_workers_spans_show_the_overlap(dataset, tmp_path):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from dlfs.torch import DLFSDataset, ShuffleShardSampler

    class FetchDuringFirstStep(DLFSDataset):
        """Holds the fetch of batch `held` until the first step has started; tells when done.

        The DataLoader asks for batch 4 when it hands out batch 0, so a worker
        fetches it while step 0 runs, whatever the scheduling: step 0 starts
        the fetch and waits for it to end.
        """

        def __init__(self, *args, held: list[int], **kwargs):
            super().__init__(*args, **kwargs)
            self.held = held
            self.step_started = multiprocessing.Event()
            self.fetched = multiprocessing.Event()

        def __getitems__(self, indices):
            if list(indices) != self.held:
                return super().__getitems__(indices)
            assert self.step_started.wait(LOADER_TIMEOUT_S)
            items = super().__getitems__(indices)
            self.fetched.set()
            return items

    address, name = dataset
    trace = tmp_path / "loader.json"
    sampler = ShuffleShardSampler(SAMPLES, seed=0)
    ds = FetchDuringFirstStep(address, name, held=sampler.indices()[16:20])
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2,
                        timeout=LOADER_TIMEOUT_S)
    with Timeline(trace, print_summary=False) as tl:
        for number, (_samples, _labels) in enumerate(tl.wrap(loader)):
            with tl.step():
                if number == 0:
                    ds.step_started.set()
                    assert ds.fetched.wait(LOADER_TIMEOUT_S)
    assert tl.summary()["batches"] == 10 and tl.summary()["samples"] == SAMPLES
    document = json.loads(trace.read_text())
    spans = check_chrome_trace(document)
    fetches = [e for e in spans if e["name"] == "get_batch"]
    # One get_batch round trip per batch, each in a worker process.
    assert len(fetches) == 10 and all(e["args"]["samples"] == 4 for e in fetches)
    assert len({e["pid"] for e in fetches}) == 2 and os.getpid() not in {e["pid"] for e in fetches}
    steps = [e for e in spans if e["name"] == "step"]
    overlapping = [f for f in fetches for s in steps
                   if f["ts"] < s["ts"] + s["dur"] and s["ts"] < f["ts"] + f["dur"]]
    assert overlapping, "no fetch ran while the training step did"
    assert json.loads(document["otherData"]["dlfs_summary"])["batches"] == 10
    assert tl._spool_dir is None  # the workers' spool directory was merged and removed


def test_read_ahead_helper_spans_are_on_the_helper_track(dataset, tmp_path):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from dlfs.torch import DLFSDataset, ReadAhead, ShuffleShardSampler

    address, name = dataset
    trace = tmp_path / "read-ahead.json"
    ds = DLFSDataset(address, name)
    read_ahead = ReadAhead(ShuffleShardSampler(len(ds), seed=0), ds, batch_size=4, batches=2)
    try:
        with Timeline(trace, print_summary=False) as tl:
            for _samples, _labels in tl.wrap(DataLoader(ds, batch_size=None, sampler=read_ahead)):
                with tl.step():
                    time.sleep(STEP_S)
    finally:
        read_ahead.close()
    assert tl.summary()["batches"] == 10 and tl.summary()["samples"] == SAMPLES
    spans = check_chrome_trace(json.loads(trace.read_text()))
    fetches = [e for e in spans if e["name"] == "get_batch"]
    # One get_batch per batch, on the threads of the helper process.
    assert len(fetches) == 10 and all(e["args"]["samples"] == 4 for e in fetches)
    helpers = {e["pid"] for e in fetches}
    assert len(helpers) == 1 and os.getpid() not in helpers
    # (Whether a fetch overlaps a step depends on timing: the helper refills a buffer as soon
    # as the training thread lets go of one, which may be just before the step starts.)


def test_spool_files_merge_and_a_torn_line_is_counted_not_fatal(tmp_path):
    tl = Timeline(tmp_path / "t.json", print_summary=False)
    spool = tl.spool_dir()
    now = time.perf_counter_ns()
    spool_span(spool, "get_batch", now, now + 1000, args={"samples": 3})
    with open(os.path.join(spool, f"{SPOOL_PREFIX}999999.jsonl"), "w") as f:
        f.write('{"name": "get_ba')  # a worker killed mid-write
    tl.close()
    assert not os.path.exists(spool)
    spans = check_chrome_trace(json.loads((tmp_path / "t.json").read_text()))
    assert [e["name"] for e in spans] == ["get_batch"]
    assert tl.summary()["spans_dropped"] == 1
    assert "1 spans dropped" in format_summary(tl.summary())
    spool_span(spool, "late", now, now + 1)  # after close: ignored, never raises


def test_no_path_keeps_everything_in_memory(tmp_path):
    with Timeline(print_summary=False) as tl:
        for _ in tl.wrap([([1, 2], "labels"), [3], 4]):
            with tl.step():
                pass
    # len(batch[0]) of a (samples, labels) batch, len(batch) of a flat one, else 1.
    assert tl.summary()["samples"] == 2 + 1 + 1
    assert check_chrome_trace(tl.trace())
    assert list(tmp_path.iterdir()) == []
