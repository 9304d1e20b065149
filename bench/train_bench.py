"""Emulated training, in the spirit of the DLIO benchmark: does the loader keep the accelerator busy?

    python -m bench.train_bench            # full sweep, about 9 minutes on 2 cores (+ data once)
    python -m bench.train_bench --quick    # small, under a minute: checks that it all runs
    python -m bench.train_bench --first-example   # README's DataLoader vs ext4 (./dev bench)

A training step is a fixed sleep per batch (the accelerator's compute
time); the main process sleeps, so the loader's workers get the CPUs.  Per
compute time and loader, one cold epoch (page cache dropped first: as root
``sync; echo 3 > /proc/sys/vm/drop_caches``, else ``posix_fadvise(DONTNEED)``
on every data file; then checked: `bench.measure.CacheControl.make_cold`
evicts again until every extent and a sample of the files left the page
cache, or fails the run) then one warm epoch (a new permutation, data cached).

Loaders, all ``torch.utils.data.DataLoader(num_workers=W, batch_size=B)``
with `dlfs.torch.ShuffleShardSampler` (same order for all):

- ``no-io``: the ceiling of every DataLoader row: the same DataLoader over
  a dataset that reads nothing (each item a new, unfilled 110 KiB uint8
  tensor and its label, collated as the others are).  What it loses is
  the DataLoader's own cost per batch (worker IPC, the shared-memory batch
  handed to the main process): about 1 ms a batch on the 2-core VM, so at
  8 ms of compute no worker-based loader can pass about 87% there.
- ``ext4-folder``: the ImageFolder baseline on the ext4 source tree.
  torchvision is not installed beside the CPU torch build here, so
  `FolderDataset` emulates ImageFolder: it lists the class folders
  (sorted), their files (sorted), and ``__getitem__`` opens and reads one
  file (no decode: the step is emulated, as in DLIO).
  Every loader turns a sample into a uint8 tensor (`dlfs.torch.to_tensor`)
  so batches reach the main process as shared-memory tensors; returning
  ``bytes`` would make pickling through the worker pipe the bottleneck
  of every loader alike.
- ``dlfs``: `dlfs.torch.DLFSDataset` over the network: the data path over
  loopback TCP (``client_options={"data_path": "tcp"}``), one get_batch
  per batch.
- ``dlfs-direct``: the same with ``direct=True`` (co-located: the worker
  maps the extent files the daemon passed it; metadata from the daemon).
- ``dlfs-first``: the README's first DataLoader example as written,
  ``DLFSDataset(address, name)`` with no client options (on the daemon's
  host, its extents: `DLFSDataset.reads`) in ``DataLoader(ds,
  batch_size=None, sampler=ReadAhead(sampler, ds, batch_size=B))``: what a
  user gets without knowing the options.
- ``dlfs-workers``: the README's example with a transform in DataLoader
  workers, ``DLFSDataset(address, name, transform=to_tensor)`` with no
  client options in ``DataLoader(num_workers=W, batch_size=B)``: the
  ImageFolder loop with DLFSDataset in ImageFolder's place.
- ``dlfs-batches``: `DLFSDataset` without a transform, whole batches as
  items: ``DataLoader(ds, batch_size=None, sampler=BatchSampler(sampler,
  B), num_workers=W)``.  Each worker receives a batch straight into one
  shared-memory ``[B, L]`` tensor (no per-sample tensors, no collate
  copy); the labels come as one tensor.
- ``dlfs-readahead`` / ``dlfs-readahead-direct``: `DLFSDataset` without a
  transform in a DataLoader with ``num_workers=0``, ``batch_size=None`` and
  ``sampler=dlfs.torch.ReadAhead(sampler, ds, batch_size=B, batches=4)``:
  one helper process reads each batch ahead of need into a reused
  shared-memory buffer that becomes the ``[B, L]`` uint8 tensor (no worker
  processes, no buffer allocated or pickled per batch).

and, without a DataLoader, DLFS's own in-process loader:

- ``dlfs-pipeline`` / ``dlfs-pipeline-direct``: `dlfs.training.pipeline.iter_rows`
  (``prefetch`` batches in flight on threads of the training process), each
  batch received straight into a ``[B, L]`` array that ``torch.from_numpy``
  makes the batch tensor, with its labels, same order; no worker
  processes, so no batch crosses a process boundary.

``--first-example`` runs only ``ext4-folder``, ``dlfs-first`` and
``dlfs-workers``, the way issue 59 measured them: 20,000 samples, batches
of 256 (``DataLoader(num_workers=2, batch_size=256)`` for the loops with
workers), a true shuffle, no compute (samples/s of the loader alone), a
cold then a warm epoch each; the table gives each DLFS loop over ext4, the
README's first against the target of 1.2x.  `python -m bench` runs it as
its ``dataloader`` workload (bench/results/dataloader.md).

Reported per epoch: accelerator utilisation = compute time / wall time
(wall from ``iter(loader)``, so worker start-up counts, as in DLIO) and
samples/s.  A second table measures clairvoyant prefetch on cold epochs:
the same loader with and without hints (`dlfs.torch.PrefetchHints`; and the
`dlfs.training.pipeline.iter_rows` with ``hint_ahead``).  With
``--trace-dir`` each run also writes a `dlfs.training.profile` timeline.

Data: N files of 110 KiB random bytes in 10 class folders under
``--data-dir`` (generated once, reused), ingested into a daemon started
here on its own data dir.  Results: markdown on stdout, JSON beside it
(``--out``), with the machine and git revision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from bench import processes

SAMPLE_BYTES = 110 * 1024
CLASSES = 10
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Plan:
    samples: int
    batch_size: int
    workers: int
    compute_ms: tuple[float, ...]
    hint_compute_ms: float
    hint_ahead_batches: int
    pipeline_prefetch: int = 4
    loaders: tuple[str, ...] = ("no-io", "ext4-folder", "dlfs", "dlfs-direct", "dlfs-batches",
                                "dlfs-readahead", "dlfs-readahead-direct", "dlfs-pipeline",
                                "dlfs-pipeline-direct", "dlfs-first", "dlfs-workers")


FULL = Plan(samples=16384, batch_size=64, workers=4, compute_ms=(6.0, 8.0, 10.0, 15.0, 30.0),
            hint_compute_ms=4.0, hint_ahead_batches=16)
QUICK = Plan(samples=1536, batch_size=64, workers=4, compute_ms=(8.0, 30.0),
             hint_compute_ms=4.0, hint_ahead_batches=8)
# The README's first DataLoader example against the same loop over ext4 files.
FIRST_EXAMPLE = Plan(samples=20_000, batch_size=256, workers=2, compute_ms=(0.0,),
                     hint_compute_ms=0.0, hint_ahead_batches=0,
                     loaders=("ext4-folder", "dlfs-first", "dlfs-workers"))
FIRST_EXAMPLE_QUICK = dataclasses.replace(FIRST_EXAMPLE, samples=1536)
# What the README's DataLoader over DLFS must reach, warm and cold, over ext4 (issue 59).
FIRST_EXAMPLE_TARGET = 1.2
# The loaders named without "direct" read as a remote node would: the data path over
# loopback TCP (not the Unix socket a client on the daemon's host would pick).
NETWORK = {"data_path": "tcp"}

DATALOADER_KINDS = ("no-io", "ext4-folder", "dlfs", "dlfs-direct", "dlfs-batches", "dlfs-readahead",
                    "dlfs-readahead-direct", "dlfs-first", "dlfs-workers")
# The DataLoaders without workers whose batches a ReadAhead helper reads.
READ_AHEAD_KINDS = ("dlfs-readahead", "dlfs-readahead-direct", "dlfs-first")
# The README's DataLoader examples, as the report names them (each against ext4).
FIRST_EXAMPLE_KINDS = ("dlfs-first", "dlfs-workers")
# make_cold checks this many of the ext4 tree's files (beside every extent): opening
# all 20,000 after each eviction would take longer than the cold epoch.
COLD_CHECKED_FILES = 200


# --- data ---------------------------------------------------------------------------

def prepare_files(root: str, samples: int) -> str:
    """`samples` files of SAMPLE_BYTES random bytes in class folders; reused when present."""
    tree = os.path.join(root, f"files-{samples}x{SAMPLE_BYTES}")
    marker = os.path.join(tree, ".ready")
    if os.path.exists(marker):
        return tree
    rng = np.random.default_rng(5)
    for i in range(samples):
        folder = os.path.join(tree, f"class{i % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:07d}.jpg"), "wb") as f:
            f.write(rng.bytes(SAMPLE_BYTES))
    os.sync()
    with open(marker, "w") as f:
        f.write("ok\n")
    return tree


def ensure_dataset(address: str, tree: str, name: str, samples: int) -> None:
    from dlfs import Client, NotFound

    with Client(address) as client:
        try:
            if len(client.dataset(name)) == samples:
                return
        except NotFound:
            pass
        client.ingest(tree, name, replace=True, progress=False)


class CacheDropper:
    """Empties the page cache of the benchmark's files before a cold epoch, and proves it
    (`bench.measure.CacheControl.make_cold`): every extent of the daemon (pages a
    process maps survive drop_caches: a ReadAhead helper or a worker that maps them,
    the daemon's own sends) and `COLD_CHECKED_FILES` of the tree's files must have
    left it, else RuntimeError."""

    def __init__(self, tree: str, dlfs_dir: str):
        from bench.measure import CacheControl

        self.tree, self.dlfs_dir = tree, dlfs_dir
        self.control = CacheControl()
        self.method = ("sync; echo 3 > /proc/sys/vm/drop_caches" if self.control.root
                       else "posix_fadvise(DONTNEED) on every data file (not root)") + \
            ", checked against the page cache"

    def drop(self) -> None:
        files = _files_below(self.tree)
        extents = _files_below(os.path.join(self.dlfs_dir, "extents"))
        step = max(1, len(files) // COLD_CHECKED_FILES)
        self.control.make_cold(files + extents, extents + files[::step])


def _files_below(root: str) -> list[str]:
    return sorted(os.path.join(folder, name) for folder, _dirs, names in os.walk(root)
                  for name in names if not name.startswith("."))


# --- loaders ------------------------------------------------------------------------

def folder_dataset_class():
    from torch.utils.data import Dataset

    from dlfs.torch import to_tensor

    class FolderDataset(Dataset):
        """ImageFolder's file listing and labels, one open+read+close per sample."""

        def __init__(self, root: str):
            self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                            for f in sorted(os.listdir(os.path.join(root, c)))]

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, index: int):
            path, label = self.samples[index]
            with open(path, "rb") as f:
                return to_tensor(f.read()), label

    return FolderDataset


def no_io_dataset_class():
    import torch
    from torch.utils.data import Dataset

    class NoIODataset(Dataset):
        """Items as the other loaders give them, (uint8 tensor, label), read from nowhere."""

        def __init__(self, items: int, size: int):
            self.items, self.size = items, size

        def __len__(self) -> int:
            return self.items

        def __getitem__(self, index: int):
            return torch.empty(self.size, dtype=torch.uint8), index % 10

    return NoIODataset


def make_dataset(kind: str, tree: str, address: str, name: str):
    """The loader's dataset; every one yields (uint8 tensor, label) through `to_tensor`."""
    from dlfs.torch import DLFSDataset, to_tensor

    if kind == "no-io":
        return no_io_dataset_class()(len(folder_dataset_class()(tree)), SAMPLE_BYTES)
    if kind == "ext4-folder":
        return folder_dataset_class()(tree)
    if kind == "dlfs":
        return DLFSDataset(address, name, transform=to_tensor, client_options=NETWORK)
    if kind == "dlfs-direct":
        return DLFSDataset(address, name, transform=to_tensor, client_options={"direct": True})
    if kind == "dlfs-first":
        return DLFSDataset(address, name)
    if kind == "dlfs-workers":
        return DLFSDataset(address, name, transform=to_tensor)
    if kind in ("dlfs-readahead", "dlfs-batches"):
        return DLFSDataset(address, name, client_options=NETWORK)
    if kind == "dlfs-readahead-direct":
        return DLFSDataset(address, name, client_options={"direct": True})
    raise ValueError(f"{kind} is not a DataLoader kind")


@dataclasses.dataclass
class EpochResult:
    loader: str
    cache: str
    compute_ms: float
    samples: int
    wall_s: float
    compute_s: float
    variant: str = ""

    @property
    def utilisation(self) -> float:
        return self.compute_s / self.wall_s

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s

    def row(self) -> dict:
        return dataclasses.asdict(self) | {"utilisation": self.utilisation,
                                           "samples_per_s": self.samples_per_s}


def train_epoch(batches_factory, compute_s: float, trace_path: str | None = None
                ) -> tuple[int, float, float]:
    """Run one emulated epoch; returns (samples, wall s, compute s).

    Wall time runs from before ``iter()`` (worker start-up counts) to the end of
    the last step; compute time is the measured sleeps.
    """
    from dlfs.training.profile import Timeline

    with Timeline(trace_path, print_summary=False) as tl:
        started = time.perf_counter()
        source = batches_factory()
        for _batch in tl.wrap(source):
            with tl.step():
                time.sleep(compute_s)
        wall = time.perf_counter() - started
    summary = tl.summary()
    return summary["samples"], wall, summary["step_s"]


def dataloader_epochs(kind: str, plan: Plan, compute_ms: float, epoch0: int, env: dict,
                      caches: list[str], hints: bool = False) -> list[EpochResult]:
    from torch.utils.data import BatchSampler, DataLoader

    from dlfs.torch import PrefetchHints, ReadAhead, ShuffleShardSampler

    dataset = make_dataset(kind, env["tree"], env["address"], env["name"])
    if kind in FIRST_EXAMPLE_KINDS:
        env["reads"] = dataset.reads  # what the default chose, for the report
    sampler = ShuffleShardSampler(len(dataset), seed=17)
    order_source = sampler
    if hints:
        order_source = PrefetchHints(sampler, dataset, ahead=plan.hint_ahead_batches
                                     * plan.batch_size, chunk=plan.batch_size)
    read_ahead = None
    if kind in READ_AHEAD_KINDS:
        # One per loader, like the dataset: its helper process lives across epochs (its
        # start-up counts in the first epoch, as worker start-up does for the others).
        read_ahead = ReadAhead(order_source, dataset, batch_size=plan.batch_size,
                               batches=plan.pipeline_prefetch)
    results = []
    for offset, cache in enumerate(caches):
        sampler.set_epoch(epoch0 + offset)
        if cache == "cold":
            env["dropper"].drop()

        def factory():
            # The loader itself (not an iterator): Timeline.wrap then tells a DLFSDataset to
            # record its fetches before iter() starts the workers.
            if read_ahead is not None:
                return DataLoader(dataset, batch_size=None, sampler=read_ahead)
            if kind == "dlfs-batches":
                return DataLoader(dataset, batch_size=None, num_workers=plan.workers,
                                  sampler=BatchSampler(order_source, plan.batch_size,
                                                       drop_last=False), timeout=120)
            return DataLoader(dataset, batch_size=plan.batch_size, sampler=order_source,
                              num_workers=plan.workers, timeout=120)

        trace = _trace_path(env, f"{kind}{'-hints' if hints else ''}-{cache}-{compute_ms:g}ms")
        samples, wall, compute = train_epoch(factory, compute_ms / 1000, trace)
        results.append(EpochResult(kind, cache, compute_ms, samples, wall, compute,
                                   "hints" if hints else ""))
        env["progress"](f"train_bench: {kind:<20} {cache} {compute_ms:>5g} ms/batch "
                        f"{'hints' if hints else '':<26} util {results[-1].utilisation:6.1%} "
                        f"{results[-1].samples_per_s:8.0f} samples/s")
    if read_ahead is not None:
        read_ahead.close()
    return results


class PipelineLoader:
    """An epoch of `dlfs.training.pipeline.iter_rows` as (uint8 batch tensor, labels) pairs."""

    def __init__(self, env: dict, plan: Plan, order: list[int], direct: bool, hint_ahead: int,
                 prefetch: int):
        from dlfs.torch import DLFSDataset

        self.meta = env["meta"] if "meta" in env else DLFSDataset(env["address"], env["name"])
        env["meta"] = self.meta
        self.env, self.plan, self.order = env, plan, order
        self.direct, self.hint_ahead, self.prefetch = direct, hint_ahead, prefetch
        self.stats = None

    def __iter__(self):
        import torch

        from dlfs import Client
        from dlfs.training.pipeline import iter_rows

        order = np.asarray(self.order, dtype=np.int64)
        options = {"direct": True} if self.direct else NETWORK
        sizes = np.zeros(int(self.meta.ids.max()) + 1, dtype=np.int64)
        sizes[self.meta.ids] = self.meta.sizes
        with Client(self.env["address"], **options) as client:
            ds = client.dataset(self.env["name"])
            # Each batch is received straight into its [B, L] array: no stack to copy.
            batches = iter_rows(ds, self.meta.ids[order], self.plan.batch_size,
                                prefetch=self.prefetch, sizes=sizes,
                                hint_ahead=self.hint_ahead)
            with batches:
                for start, (_ids, rows) in zip(range(0, len(order), self.plan.batch_size),
                                               batches):
                    labels = torch.from_numpy(
                        self.meta.targets[order[start:start + self.plan.batch_size]])
                    yield torch.from_numpy(rows), labels
            self.stats = batches.stats


def pipeline_epochs(kind: str, plan: Plan, compute_ms: float, epoch0: int, env: dict,
                    caches: list[str], hint_ahead: int = 0, prefetch: int | None = None
                    ) -> list[EpochResult]:
    from dlfs.torch import ShuffleShardSampler

    prefetch = prefetch or plan.pipeline_prefetch
    sampler = ShuffleShardSampler(plan.samples, seed=17)  # the DataLoaders' order
    results = []
    for offset, cache in enumerate(caches):
        if cache == "cold":
            env["dropper"].drop()
        loader = PipelineLoader(env, plan, sampler.indices(epoch0 + offset),
                                kind.endswith("direct"), hint_ahead, prefetch)
        trace = _trace_path(env, f"{kind}-hint{hint_ahead}-{cache}-{compute_ms:g}ms")
        samples, wall, compute = train_epoch(lambda: loader, compute_ms / 1000, trace)
        variant = f"prefetch={prefetch} hint_ahead={hint_ahead}" if hint_ahead or \
            prefetch != plan.pipeline_prefetch else ""
        results.append(EpochResult(kind, cache, compute_ms, samples, wall, compute, variant))
        env["progress"](f"train_bench: {kind:<20} {cache} {compute_ms:>5g} ms/batch "
                        f"{variant:<26} util {results[-1].utilisation:6.1%} "
                        f"{results[-1].samples_per_s:8.0f} samples/s")
    return results


def _trace_path(env: dict, label: str) -> str | None:
    if not env.get("trace_dir"):
        return None
    os.makedirs(env["trace_dir"], exist_ok=True)
    return os.path.join(env["trace_dir"], f"{label}.json")


# --- report ---------------------------------------------------------------------------

LOADER_TITLES = {
    "no-io": "DataLoader, no I/O (ceiling)",
    "ext4-folder": "ext4 ImageFolder-like, DataLoader",
    "dlfs": "DLFSDataset, DataLoader",
    "dlfs-direct": "DLFSDataset direct, DataLoader",
    "dlfs-batches": "DLFSDataset batches, DataLoader",
    "dlfs-readahead": "DLFSDataset, ReadAhead",
    "dlfs-readahead-direct": "DLFSDataset direct, ReadAhead",
    "dlfs-pipeline": "iter_rows (network)",
    "dlfs-pipeline-direct": "iter_rows direct",
    "dlfs-first": "README's first: DLFSDataset, ReadAhead",
    "dlfs-workers": "README's DLFSDataset with a transform, DataLoader workers",
}


def _reclaim_note() -> list[str]:
    from bench.report import proactive_reclaim

    note = proactive_reclaim()
    return [note] if note else []


def markdown(results: list[EpochResult], plan: Plan, env: dict) -> str:
    """Two tables: utilisation and samples/s per compute time; hint gain on cold epochs."""
    lines = [f"Emulated training: {plan.samples} samples of {SAMPLE_BYTES // 1024} KiB, "
             f"batch {plan.batch_size}, DataLoader num_workers={plan.workers}, iter_rows "
             f"prefetch={plan.pipeline_prefetch}; cold = {env['dropper'].method}. "
             "Cells: accelerator utilisation / samples/s.", *_reclaim_note(), "",
             "| compute ms/batch (100% = samples/s) | epoch | " + " | ".join(
                 LOADER_TITLES[k] for k in plan.loaders) + " |",
             "| --- | --- |" + " ---: |" * len(plan.loaders)]
    table = {(r.loader, r.cache, r.compute_ms): r for r in results
             if r.compute_ms in plan.compute_ms and not r.variant}
    for compute_ms in plan.compute_ms:
        ideal = plan.batch_size / (compute_ms / 1000)
        for cache in ("cold", "warm"):
            cells = []
            for kind in plan.loaders:
                r = table.get((kind, cache, compute_ms))
                cells.append(f"{r.utilisation:.0%} / {r.samples_per_s:,.0f}" if r else "-")
            lines.append(f"| {compute_ms:g} ({ideal:,.0f}) | {cache} | " + " | ".join(cells)
                         + " |")
    c = plan.hint_compute_ms
    lines += ["", f"Clairvoyant prefetch: cold epoch, {c:g} ms/batch, hints "
              f"{plan.hint_ahead_batches} batches ahead (iter_rows with prefetch=2; "
              f"DataLoader: PrefetchHints ahead {plan.hint_ahead_batches} batches):", "",
              "| loader | no hints | hints | gain in samples/s |", "| --- | ---: | ---: | ---: |"]
    rows = [r for r in results if r.compute_ms == c and r.cache == "cold"]
    for kind in ("dlfs-pipeline", "dlfs-pipeline-direct", "dlfs"):
        mine = [r for r in rows if r.loader == kind]
        base = [r for r in mine if r.variant in ("", "prefetch=2 hint_ahead=0")]
        hinted = [r for r in mine if r not in base]
        if base and hinted:
            b, h = base[0], hinted[0]
            lines.append(f"| {LOADER_TITLES[kind]} | {b.utilisation:.0%} / "
                         f"{b.samples_per_s:,.0f} | {h.utilisation:.0%} / "
                         f"{h.samples_per_s:,.0f} | {h.samples_per_s / b.samples_per_s - 1:+.0%} |")
    return "\n".join(lines)


def first_example_markdown(results: list[EpochResult], plan: Plan, env: dict) -> str:
    """The README's DataLoader examples over DLFS against ext4: samples/s per epoch, the
    first example's ratio against `FIRST_EXAMPLE_TARGET`, then the one with a
    transform in workers."""
    by = {(r.loader, r.cache): r for r in results}
    lines = [f"# The README's DataLoaders against ext4 (python -m bench.train_bench "
             f"--first-example), {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, git "
             f"{machine()['git']}, {os.cpu_count()} CPUs", "",
             f"The README's first DataLoader example (`DataLoader(ds, batch_size=None, "
             f"sampler=ReadAhead(sampler, ds, batch_size={plan.batch_size}))` over "
             f"`DLFSDataset(address, name)`, no client options; reads: "
             f"{env.get('reads', '?')}) against an ImageFolder-like reader of the same files "
             f"on ext4 in DataLoader(num_workers={plan.workers}, batch_size="
             f"{plan.batch_size}): {plan.samples:,} samples of {SAMPLE_BYTES // 1024} KiB, "
             f"a true shuffle, no compute; cold = {env['dropper'].method}.",
             *_reclaim_note(), "",
             "| epoch | ext4 samples/s | DLFS samples/s | DLFS / ext4 | target |",
             "| --- | ---: | ---: | ---: | --- |"]
    lines += _ratio_rows(by, "dlfs-first", target=True)
    workers = _ratio_rows(by, "dlfs-workers", target=False)
    if workers:
        lines += ["", f"The README's example with a transform in DataLoader workers "
                  f"(`DLFSDataset(address, name, transform=to_tensor)` in DataLoader("
                  f"num_workers={plan.workers}, batch_size={plan.batch_size})), against the "
                  "same ext4 epochs:", "",
                  "| epoch | ext4 samples/s | DLFS samples/s | DLFS / ext4 |",
                  "| --- | ---: | ---: | ---: |", *workers]
    load = env.get("load_average")
    if load:
        lines += ["", f"Load average before / after the run: {load[0]} / {load[1]} "
                  f"(on {os.cpu_count()} CPUs)."]
    return "\n".join(lines)


def _ratio_rows(by: dict, kind: str, *, target: bool) -> list[str]:
    """One table row per epoch (cold, warm) of loader `kind` against ext4's, with the
    verdict against `FIRST_EXAMPLE_TARGET` when `target`."""
    rows = []
    for cache in ("cold", "warm"):
        ext4, dlfs = by.get(("ext4-folder", cache)), by.get((kind, cache))
        if ext4 is None or dlfs is None:
            continue
        ratio = dlfs.samples_per_s / ext4.samples_per_s
        row = f"| {cache} | {ext4.samples_per_s:,.0f} | {dlfs.samples_per_s:,.0f} | {ratio:.2f}x |"
        if target:
            verdict = "met" if ratio >= FIRST_EXAMPLE_TARGET else "missed"
            row += f" >= {FIRST_EXAMPLE_TARGET}x: {verdict} |"
        rows.append(row)
    return rows


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages (`os.getloadavg`, as bench.ingest_bench
    records them), "" where the system keeps none."""
    try:
        return " ".join(f"{load:.2f}" for load in os.getloadavg())
    except OSError:
        return ""


def machine() -> dict:
    try:
        revision = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        revision = ""
    import torch

    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "git": revision,
            "kernel": platform.release()}


# --- main -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-train-bench",
                        help="generated files, the daemon's data dir and logs (reused)")
    parser.add_argument("--out", default="", help="write results JSON here")
    parser.add_argument("--trace-dir", default="", help="write a dlfs.training.profile trace per "
                        "epoch")
    parser.add_argument("--compute-ms", default="",
                        help="comma-separated compute times per batch (default: the plan's)")
    parser.add_argument("--workers", type=int, help="DataLoader num_workers (default 4)")
    parser.add_argument("--samples", type=int, help="number of samples (default 16384 / 1536)")
    parser.add_argument("--loaders", default="",
                        help="comma-separated subset of " + ",".join(FULL.loaders))
    parser.add_argument("--first-example", action="store_true",
                        help="only the README's DataLoader against ext4 (see above)")
    args = parser.parse_args(argv)
    if args.first_example:
        plan = FIRST_EXAMPLE_QUICK if args.quick else FIRST_EXAMPLE
    else:
        plan = QUICK if args.quick else FULL
    if args.compute_ms:
        plan = dataclasses.replace(plan, compute_ms=tuple(
            float(x) for x in args.compute_ms.split(",")))
    if args.workers:
        plan = dataclasses.replace(plan, workers=args.workers)
    if args.samples:
        plan = dataclasses.replace(plan, samples=args.samples)
    if args.loaders:
        unknown = set(args.loaders.split(",")) - set(FULL.loaders)
        if unknown:
            parser.error(f"unknown loaders {', '.join(sorted(unknown))}")
        plan = dataclasses.replace(plan, loaders=tuple(args.loaders.split(",")))

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    load_before = _load_average()
    os.makedirs(args.data_dir, exist_ok=True)
    tree = prepare_files(args.data_dir, plan.samples)
    progress(f"train_bench: {plan.samples} files ready in {time.monotonic() - started:.0f} s")
    dlfs_dir = os.path.join(args.data_dir, "dlfs")
    with processes.daemon(dlfs_dir, os.path.join(args.data_dir, "daemon.log")) as daemon:
        name = f"train-{plan.samples}"
        ensure_dataset(daemon.address, tree, name, plan.samples)
        progress(f"train_bench: dataset {name} ingested ({time.monotonic() - started:.0f} s)")
        env = {"tree": tree, "address": daemon.address, "name": name, "progress": progress,
               "dropper": CacheDropper(tree, dlfs_dir), "trace_dir": args.trace_dir}
        results: list[EpochResult] = []
        for compute_ms in plan.compute_ms:
            for kind in plan.loaders:
                run = dataloader_epochs if kind in DATALOADER_KINDS else pipeline_epochs
                results += run(kind, plan, compute_ms, 0, env, ["cold", "warm"])
        if not args.first_example:
            # Clairvoyant prefetch on cold epochs where I/O matters (short compute, few
            # batches in flight), each with and without hints on the same epoch order.
            c, ahead = plan.hint_compute_ms, plan.hint_ahead_batches
            for kind in ("dlfs-pipeline", "dlfs-pipeline-direct"):
                for hint_ahead in (0, ahead):
                    results += pipeline_epochs(kind, plan, c, 0, env, ["cold"], hint_ahead,
                                               prefetch=2)
            for hints in (False, True):
                results += dataloader_epochs("dlfs", plan, c, 0, env, ["cold"], hints=hints)
        env["load_average"] = (load_before, _load_average())
    report = (first_example_markdown if args.first_example else markdown)(results, plan, env)
    print(report)
    elapsed = time.monotonic() - started
    progress(f"train_bench: done in {elapsed:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"plan": dataclasses.asdict(plan), "machine": machine(),
                       "cache_drop": env["dropper"].method, "elapsed_s": elapsed,
                       "load_average": env.get("load_average"),
                       "results": [r.row() for r in results], "markdown": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
