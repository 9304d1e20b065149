"""Resuming a DataLoader mid-epoch, against a real daemon: every sample of the epoch once.

Each test reads part of an epoch, saves the loader's state (torchdata's
StatefulDataLoader, or the samplers' own state with a plain DataLoader),
throws the loader away, builds a new one, loads the state and reads on to
the end of the epoch: the samples before and after the restart together are
the epoch's, each exactly once, in the uninterrupted run's order.
"""

from __future__ import annotations

import collections
import pickle

import pytest

torch = pytest.importorskip("torch")
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
from torch.utils.data import DataLoader  # noqa: E402

from dlfs import Client  # noqa: E402
from dlfs.torch import DLFSDataset, PrefetchHints, ReadAhead, ShuffleShardSampler  # noqa: E402
from helpers.trees import unique_name, write_tree  # noqa: E402

StatefulDataLoader = stateful_dataloader.StatefulDataLoader
# torchdata 0.11 calls a torch function that torch 2.13 deprecates; nothing to act on here.
pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")

SAMPLES = 45  # batches of 4 leave a short last one
RECORD_BYTES = 64
BATCH = 4


def record(path: str) -> bytes:
    return path.encode().ljust(RECORD_BYTES, b"\0")


def names(samples) -> list[str]:
    if isinstance(samples, torch.Tensor) and samples.dim() == 2:
        rows = list(samples)
    else:
        rows = samples
    return [bytes(r.numpy() if isinstance(r, torch.Tensor) else r).rstrip(b"\0").decode()
            for r in rows]


def as_record(sample) -> torch.Tensor:
    """A transform: the sample as a uint8 tensor (collated by the DataLoader's workers)."""
    return torch.frombuffer(bytearray(sample), dtype=torch.uint8)


@pytest.fixture(scope="module")
def records(shared_daemon, tmp_path_factory):
    files = {f"c{i % 3}/{i:03d}.rec": None for i in range(SAMPLES)}
    files = {path: record(path) for path in files}
    root = tmp_path_factory.mktemp("records")
    write_tree(root, files)
    name = unique_name("resume")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name, sorted(files)


def run(loader, stop_after: int | None = None) -> tuple[list[str], dict | None]:
    """Paths read by `loader` (to the end, or `stop_after` batches) and its state then."""
    seen = []
    for number, (samples, _labels) in enumerate(loader):
        seen += names(samples)
        if stop_after is not None and number + 1 == stop_after:
            # Through pickle: what a checkpoint file would hold.
            return seen, pickle.loads(pickle.dumps(loader.state_dict()))
    return seen, None


def check_once(before, after, whole):
    assert before + after == whole
    assert collections.Counter(before + after) == collections.Counter(whole)


@pytest.mark.parametrize("workers", (0, 2))
def test_stateful_dataloader_resumes_with_and_without_workers(records, workers):
    address, name, paths = records
    ds = DLFSDataset(address, name, transform=as_record)

    def loader():
        sampler = ShuffleShardSampler(len(ds), seed=7)
        sampler.set_epoch(3)
        return StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)

    whole, _ = run(loader())
    assert sorted(whole) == paths
    for stop in (1, 5, 11):  # the first batch, the middle, the last (short) one
        before, state = run(loader(), stop_after=stop)
        after, _ = run_resumed(loader(), state)
        check_once(before, after, whole)


def run_resumed(loader, state):
    loader.load_state_dict(state)
    return run(loader)


def test_read_ahead_resumes_under_a_stateful_dataloader(records):
    address, name, paths = records
    ds = DLFSDataset(address, name)
    made = []

    def loader(batch_size=BATCH):
        sampler = ShuffleShardSampler(len(ds), seed=2)
        sampler.set_epoch(1)
        read_ahead = ReadAhead(sampler, ds, batch_size=batch_size, batches=2)
        made.append(read_ahead)
        return StatefulDataLoader(ds, batch_size=None, sampler=read_ahead)

    try:
        whole, _ = run(loader())
        assert sorted(whole) == paths
        for stop in (1, 6, 12):
            before, state = run(loader(), stop_after=stop)
            after, _ = run_resumed(loader(), state)
            check_once(before, after, whole)
        # The state names samples, not batches: it resumes at another batch size too.
        before, state = run(loader(), stop_after=3)
        after, _ = run_resumed(loader(batch_size=5), state)
        check_once(before, after, whole)
    finally:
        for read_ahead in made:
            read_ahead.close()


def test_read_ahead_over_a_plain_sampler_skips_the_samples_done(records):
    """A sampler without a positional state: the state counts samples done and skips them."""
    address, name, paths = records
    ds = DLFSDataset(address, name)
    made = []

    def loader():
        read_ahead = ReadAhead(range(len(ds)), ds, batch_size=BATCH, batches=2)
        made.append(read_ahead)
        return StatefulDataLoader(ds, batch_size=None, sampler=read_ahead)

    try:
        before, state = run(loader(), stop_after=4)
        assert state["_index_sampler_state"] == {"samples_done": 16}
        after, _ = run_resumed(loader(), state)
        check_once(before, after, paths)
    finally:
        for read_ahead in made:
            read_ahead.close()


def test_plain_dataloader_with_workers_resumes_from_the_samples_trained_on(records):
    """The documented recipe without torchdata: the workers draw ahead, the loop counts."""
    address, name, _paths = records
    ds = DLFSDataset(address, name, transform=as_record)
    sampler = ShuffleShardSampler(len(ds), seed=4)
    sampler.set_epoch(2)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2)
    whole, _ = run(loader)
    before = []
    for step, (samples, _labels) in enumerate(loader):
        before += names(samples)
        if step + 1 == 6:
            state = sampler.state_dict(consumed=(step + 1) * BATCH)
            break
    assert state["position"] == 24
    resumed = ShuffleShardSampler(len(ds), seed=4)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    after, _ = run(DataLoader(ds, batch_size=BATCH, sampler=resumed, num_workers=2))
    check_once(before, after, whole)


def test_prefetch_hints_resume_where_the_hinted_sampler_left_off(records):
    address, name, _paths = records
    ds = DLFSDataset(address, name, transform=as_record)

    def loader():
        sampler = ShuffleShardSampler(len(ds), seed=9)
        hinted = PrefetchHints(sampler, ds, ahead=3 * BATCH, chunk=BATCH)
        hinted.set_epoch(0)
        return StatefulDataLoader(ds, batch_size=BATCH, sampler=hinted)

    whole, _ = run(loader())
    before, state = run(loader(), stop_after=5)
    after, _ = run_resumed(loader(), state)
    check_once(before, after, whole)


@pytest.mark.parametrize("workers", (0, 2))
def test_elastic_order_resumes_at_another_world_size(records, workers):
    """Two ranks read 3 batches each; three ranks load rank 0's state and finish the epoch."""
    address, name, paths = records
    ds = DLFSDataset(address, name, transform=as_record)

    def loader(rank, world_size):
        sampler = ShuffleShardSampler(len(ds), seed=1, rank=rank, world_size=world_size,
                                      elastic=True)
        sampler.set_epoch(5)
        return StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)

    before, states = [], []
    for rank in range(2):
        seen, state = run(loader(rank, 2), stop_after=3)
        before += seen
        states.append(state)
    after = []
    for rank in range(3):
        resumed = loader(rank, 3)
        resumed.load_state_dict(states[0])
        seen, _ = run(resumed)
        after.append(seen)
    # Equal shares after the restart: 45 - 24 = 21 samples, 7 per rank, 2 batches each.
    assert [len(part) for part in after] == [7, 7, 7]
    seen = before + [p for part in after for p in part]
    assert collections.Counter(seen) == collections.Counter(paths)  # each exactly once
    # The global order is the seed's and the epoch's: the first 24 done are its head.
    order = ShuffleShardSampler(len(ds), seed=1, rank=0, world_size=1).indices(5)
    assert sorted(before) == sorted(paths[i] for i in order[:24])
