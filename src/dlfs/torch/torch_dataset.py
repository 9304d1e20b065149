"""`DLFSDataset`: the samples of a DLFS dataset as a map-style torch Dataset.

`DLFSDataset` has ``__getitems__``, so a DataLoader with automatic batching
fetches a whole batch with one get_batch round trip instead of one call per
sample.  Nothing gRPC-related crosses a fork: the dataset reads its
metadata with a short-lived client at construction and keeps a
`DatasetTicket`; each process (the main one, every DataLoader worker) opens
its own client from it on first use, noticed by its pid, and reads over
the data path without a gRPC call (gRPC cannot be used after a fork:
`dlfs.client.transport.grpc_channel.check_grpc_usable`).  It also pickles without a
client, so spawn and forkserver start methods work too.

Where the samples come from is decided once, at construction (`reads`): on
the daemon's host, unless `client_options` say otherwise, straight from the
extent files the daemon passes (``direct=True``: no sample byte crosses a
socket, docs/DESIGN.md "Co-located DataLoaders"), else over the daemon's
data path.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from dlfs import limits
from dlfs.training import profile
from dlfs.client import Client, DatasetTicket
from dlfs.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from dlfs.torch.folders import parent_dir_labels, samples_below
from dlfs.ring import one_size
from dlfs.torch.tensors import batch_tensor

TARGET_PARENT_DIR = "parent_dir"
# `DLFSDataset.reads`: from the extent files mapped here, or over the daemon's data path.
READS_EXTENTS, READS_DAEMON = "extents", "daemon"

log = logging.getLogger(__name__)


class BatchSource(Protocol):
    """What may already hold the batch ``ds[indices]`` asks for (a `ReadAhead` epoch is one)."""

    def take(self, indices):
        """The batch of items `indices` as `DLFSDataset.__getitem__` returns it, or None.

        None means "not mine": the dataset fetches the items itself.
        """


class DLFSDataset(Dataset):
    """Samples of a DLFS dataset as a map-style torch Dataset.

    ``DLFSDataset(address, name, transform=None, target="parent_dir", root="")``

    - `root`: a directory inside the dataset; only samples below it are
      items (``""``: all of them).  Item ``i`` is the i-th of those in path
      order.
    - `target`: ``"parent_dir"`` gives ImageFolder-style labels: the name
      of the folder holding the sample is its class, classes sorted by name
      get 0..C-1 (`classes`, `class_to_idx`, `targets`).  For the usual
      ``root/class/file`` layout this is exactly ImageFolder's labelling.
      A sample directly in `root` has no class folder: InvalidArgument,
      pick a deeper `root` or ``target=None``.  ``None``: items are samples
      alone.  A callable: ``target(path)`` per item.
    - `transform(sample)` gets a read-only memoryview of the sample (valid
      as long as it is referenced) and returns anything collatable and,
      with DataLoader workers, picklable.  Without a transform an item's
      sample is ``bytes`` (memoryviews cannot be pickled to the main
      process); the default collate gives a batch of them as a tuple.
    - `client_options`: keyword arguments of `dlfs.Client` (timeouts, a
      token; ``direct=False`` to read through the daemon on its host too).
      Without ``direct``, ``data_path`` or ``etcd`` in them, a dataset on
      this host's daemon is read
      from the extent files it passes (`reads` is "extents"), else through
      the daemon ("daemon", logged with why): decided once, here, with one
      OPEN_DATASET call (which counts as the dataset's first read, so a
      warm-up on first read starts).

    Items are ``(sample, target)`` pairs (or samples when ``target=None``);
    ``ds[[i, j, ...]]`` is a whole batch at once (see `__getitem__`), and
    `sizes` holds each item's sample size in bytes, `trace_dir` the spool
    directory fetches are recorded in (see `trace_to`; None: not traced).
    Construction costs one Lookup per 65,536 samples of the dataset (to
    list the paths and sizes); ``__getitems__`` one get_batch round trip.
    Raises
    NotFound for an unknown dataset or a `root` with no samples, and the
    client's typed errors when a fetch fails.
    """

    def __init__(self, address: str, name: str, transform: Callable | None = None,
                 target: str | Callable | None = TARGET_PARENT_DIR, *, root: str = "",
                 verify: bool = True, client_options: dict | None = None):
        if not (target is None or target == TARGET_PARENT_DIR or callable(target)):
            raise InvalidArgument(f"target must be {TARGET_PARENT_DIR!r}, None or a callable "
                                  f"path -> target, not {target!r}")
        self.address = address
        self.name = name
        self.transform = transform
        self.target = target
        self.root = root.strip("/")
        self.verify = verify
        self.client_options = dict(client_options or {})
        if not {"direct", "data_path", "etcd"} & self.client_options.keys():
            self.client_options["direct"] = _extents_here(address, name, self.client_options)
        self.reads = READS_EXTENTS if self.client_options.get("direct") else READS_DAEMON
        with Client(address, **self.client_options) as client:
            dataset = client.dataset(name)
            paths, sizes = dataset.listing()
            # What each process opens its own client from (no gRPC call needed to read).
            self.ticket = DatasetTicket.of(dataset)
        self.ids, selected = samples_below(paths, self.root, name)
        self.sizes = sizes[self.ids]  # bytes of each item's sample
        self.classes: list[str] = []
        self.class_to_idx: dict[str, int] = {}
        self.targets: np.ndarray | None = None
        self._paths: list[str] | None = None
        if target == TARGET_PARENT_DIR:
            self.classes, self.class_to_idx, self.targets = parent_dir_labels(
                selected, self.root, name)
        elif callable(target):
            self._paths = selected
        self._pid = -1
        self._client: Client | None = None
        self._dataset = None
        self.trace_dir: str | None = None
        self._batch_source: BatchSource | None = None
        self._batch_source_pid = -1

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"DLFSDataset({self.address!r}, {self.name!r}, root={self.root!r}, "
                f"samples={len(self)}, classes={len(self.classes)})")

    def __getitem__(self, index):
        """Item `index`; or, given a sequence of indices, that whole batch already collated.

        Batch form (``ds[[3, 9, 4]]``, what ``DataLoader(ds, batch_size=None,
        sampler=ReadAhead(...))`` or ``sampler=BatchSampler(...)`` asks for):
        ``(samples, targets)`` (``samples`` alone when ``target=None``) with
        one get_batch round trip.  Without a transform, ``samples`` is one
        ``torch.uint8`` tensor of shape ``[B, L]``: the samples are read
        straight into it (in shared memory inside a DataLoader worker), so
        no per-sample tensors are made or stacked; all samples of the batch
        must then have the same size L (fixed-size records), else
        InvalidArgument.  With a transform, each sample is transformed and
        the batch put together by torch's ``default_collate``.  Targets are
        an int64 tensor for ``"parent_dir"`` and collated likewise for a
        callable.  Inside a `ReadAhead` epoch the epoch's next batch comes from
        its helper process, already read (see `attach_batch_source`).
        """
        if isinstance(index, (int, np.integer)) or (
                isinstance(index, torch.Tensor) and index.dim() == 0):
            return self.__getitems__([int(index)])[0]
        source = self._batch_source
        if source is not None and self._batch_source_pid == os.getpid():
            batch = source.take(index)
            if batch is not None:
                return batch
        positions = self.positions(index)
        if self.transform is None:
            batch = self._fetch_rows(self.ids[positions], self.sizes[positions])
        else:
            batch = self._collate_transformed(self._fetch(self.ids[positions]))
        return self.with_targets(positions, batch)

    def __getitems__(self, indices: Sequence[int]) -> list:
        """Items `indices` with one get_batch round trip, in order, duplicates allowed."""
        positions = self.positions(indices)
        samples = self._fetch(self.ids[positions])
        transform = self.transform
        items = [transform(s) for s in samples] if transform else [bytes(s) for s in samples]
        if self.target is None:
            return items
        if self.targets is not None:
            return list(zip(items, self.targets[positions].tolist()))
        return [(item, self.target(self._paths[p])) for item, p in zip(items, positions.tolist())]

    def positions(self, indices) -> np.ndarray:
        """Item indices `indices` (an int, or a sequence or array of them) as a flat int64 array.

        Raises IndexError naming the first index outside ``[0, len(ds))``.
        Cost: O(len(indices)).
        """
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self.ids)):
            bad = positions[(positions < 0) | (positions >= len(self.ids))][0]
            raise IndexError(f"item {int(bad)} is out of range for {self!r} "
                             f"({len(self.ids)} items)")
        return positions

    def with_targets(self, positions: np.ndarray, batch):
        """The collated `batch` of items `positions` with their targets, as ``ds[positions]`` has it.

        ``(batch, targets)``: an int64 tensor for ``"parent_dir"``, the
        ``default_collate`` of ``target(path)`` per item for a callable;
        `batch` alone when ``target=None``.  `positions` must be valid
        (`positions`).  Cost: O(len(positions)), plus one `target` call
        per item for a callable.
        """
        if self.target is None:
            return batch
        if self.targets is not None:
            return batch, torch.from_numpy(self.targets[positions])
        from torch.utils.data import default_collate

        return batch, default_collate([self.target(self._paths[p]) for p in positions.tolist()])

    def hint(self, indices: Sequence[int], *, wait: bool = False) -> bool:
        """Ask the daemon to read items `indices` into its page cache soon (see `PrefetchHints`).

        Returns False when the daemon's hint queue is full (the hint is
        dropped), as `dlfs.Dataset.prefetch` does (`wait` as there).  One
        hint per `limits.pipeline_hint_ids_max` items.
        """
        ids = self.ids[self.positions(indices)]
        accepted = True
        for start in range(0, len(ids), limits.pipeline_hint_ids_max):
            accepted = self._remote().prefetch(ids[start:start + limits.pipeline_hint_ids_max],
                                               wait=wait) and accepted
        return accepted

    def path(self, index: int) -> str:
        """Path of item `index` inside the dataset (one Lookup round trip)."""
        return self._remote().path(int(self.ids[self.positions([index])[0]]))

    def trace_to(self, spool_dir: str | None) -> None:
        """Record each fetch as a span in `spool_dir` (see `dlfs.training.profile`); None stops it.

        Set it before the DataLoader starts its workers (``Timeline.wrap`` does).
        """
        self.trace_dir = spool_dir

    def attach_batch_source(self, source: BatchSource) -> None:
        """Let `source` answer this process's batch requests before the dataset fetches.

        While attached, ``ds[indices]`` (the batch form) returns
        ``source.take(indices)`` unless that is None.  Only in the process
        that attached it: a forked DataLoader worker fetches for itself, and
        pickling drops the source.  One source at a time; a new one replaces
        the old.  `ReadAhead` attaches each epoch.
        """
        self._batch_source = source
        self._batch_source_pid = os.getpid()

    def detach_batch_source(self, source: BatchSource) -> None:
        """Stop asking `source` (nothing happens when another source has replaced it)."""
        if self._batch_source is source:
            self._batch_source = None
            self._batch_source_pid = -1

    def close(self) -> None:
        """Close this process's client (a later fetch opens a new one)."""
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = self._dataset = None
        self._pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_client=None, _dataset=None, _pid=-1, _batch_source=None,
                     _batch_source_pid=-1)
        return state

    def _remote(self):
        """This process's `dlfs.Dataset`, opened on first use after a fork or unpickle.

        From the ticket taken at construction: a DataLoader worker reads over
        the data path without a gRPC call (and so without gRPC's fork hazards).
        """
        if self._pid != os.getpid():
            # A client inherited over fork belongs to the parent: never touch (or close) it.
            self._dataset = self.ticket.open()
            self._client = self._dataset.client
            self._pid = os.getpid()
        return self._dataset

    def _fetch(self, ids: np.ndarray, out=None) -> list:
        """Samples `ids`: one get_batch (into `out` if given), recorded as a span when
        tracing."""
        start = time.perf_counter_ns()
        samples = self._remote().get_batch(ids, verify=self.verify, out=out)
        if self.trace_dir is not None:
            profile.spool_span(self.trace_dir, "get_batch", start, time.perf_counter_ns(),
                               args={"samples": len(samples)})
        return samples

    def _fetch_rows(self, ids: np.ndarray, sizes: np.ndarray) -> torch.Tensor:
        """Samples `ids` of one size as a ``[B, L]`` uint8 tensor, received straight into
        it (`batch_tensor`: shared memory in a DataLoader worker), with no copy
        after the socket's.  InvalidArgument, before any read, when `sizes` differ."""
        out = batch_tensor(len(ids), one_size(sizes))
        if out.numel():
            self._fetch(ids, out=out.numpy().reshape(-1))
        return out

    def _collate_transformed(self, samples: list):
        """The default collate of each sample's transform."""
        from torch.utils.data import default_collate

        return default_collate([self.transform(s) for s in samples])


def _extents_here(address: str, name: str, options: dict) -> bool:
    """Whether this process may map dataset `name`'s extents (the daemon at `address`
    runs on this host and passes its descriptors to this user); why not is logged.
    Raises what opening the dataset raises otherwise (NotFound, Unavailable)."""
    with Client(address, direct=True, **options) as client:
        try:
            client.extent_reader(name)
        except (FailedPrecondition, PermissionDenied) as exc:
            log.info("dataset %r is read through the DLFS daemon at %s, not from its "
                     "extents: %s", name, address, exc.message)
            return False
    return True

