"""`ReadAhead`: a batch sampler whose batches a helper process has already read (`dlfs.ring`).

The sampler side cuts the order into batches and starts the ring's epoch;
the dataset side is a `dlfs.torch.torch_dataset.BatchSource` attached to the
`DLFSDataset`, so ``ds[indices]`` takes each batch from the ring instead of
fetching it.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from dlfs import limits
from dlfs.training.checks import check_int
from dlfs.errors import InvalidArgument
from dlfs.training.pipeline import batch_count
from dlfs.ring import BatchRing
from dlfs.torch.torch_dataset import DLFSDataset


class ReadAhead(Sampler[list[int]]):
    """Batches read ahead by a helper process: a DataLoader without workers that keeps up.

    ``DataLoader(ds, batch_size=None, sampler=ReadAhead(sampler, ds, batch_size=256))``
    cuts `sampler`'s order into batches of `batch_size` (the last one shorter
    unless `drop_last`) and yields them as index lists; the DataLoader hands
    each to ``ds[indices]``, which returns ``(samples, targets)`` with
    ``samples`` one ``torch.uint8`` tensor ``[B, L]`` (see
    `DLFSDataset.__getitem__`), or with ``stack=False`` a list of B 1-D
    ``torch.uint8`` tensors, one per sample, of any sizes (say, JPEG files
    for ``torchvision.io.decode_jpeg(samples, device="cuda")``).  Meanwhile
    one helper process (a
    `dlfs.ring.BatchRing`, started at the first epoch and kept until
    `close`) reads the next `batches` batches with its own DLFS client (as
    the dataset's `client_options` say) straight into shared buffers that
    the tensors then use: over the data path each batch is received into
    its buffer with no copy at all; no per-batch allocation, no pickling,
    and none of the read or checksum work competes for the training
    process's GIL.

    For raw samples: the dataset has no transform (a transform belongs in
    DataLoader workers, ``DataLoader(ds, batch_size=B, num_workers=W)``).
    With ``stack=True`` every sample of a batch must have the same size
    (InvalidArgument at the first batch that does not).  A batch's memory
    is reused once the batch and every view of it are dropped; to keep one,
    copy it (``tensor.clone()``).

    Needs ``num_workers=0``: workers fetch for themselves, which is detected
    at the second batch (InvalidArgument).  `hint_ahead` > 0 also sends
    clairvoyant prefetch hints that many batches beyond those in flight
    (opt-in, as in `dlfs.training.pipeline.iter_batches`).  Leaving an epoch early
    (``break``, an exception, dropping the loader's iterator) stops its
    reads; `close()` (or garbage collection, or interpreter exit) stops the
    helper.  `multiprocessing_context` picks its start method (default: the
    platform's, as for DataLoader workers).  Memory: ``(batches + 2) x
    batch_size x`` the largest sample, shared.  Cost per epoch: the order is
    materialised once (O(n)).
    """

    def __init__(self, sampler: Sampler, dataset: DLFSDataset, *, batch_size: int,
                 batches: int = 4, drop_last: bool = False, hint_ahead: int = 0,
                 stack: bool = True, multiprocessing_context: str | None = None):
        check_int("batch_size", batch_size, 1, limits.pipeline_batch_size_max)
        check_int("batches", batches, 1, limits.pipeline_prefetch_batches_max)
        check_int("hint_ahead", hint_ahead, 0, limits.pipeline_hint_ahead_batches_max)
        if not isinstance(dataset, DLFSDataset):
            raise InvalidArgument(f"ReadAhead reads through a DLFSDataset, not {dataset!r}")
        if dataset.transform is not None:
            raise InvalidArgument(
                "ReadAhead hands out raw batches ([batch, size] uint8 tensors), so the dataset "
                "must have no transform; decode in the training step, or run the transform in "
                "DataLoader workers: DataLoader(ds, batch_size=B, num_workers=W)")
        self.sampler = sampler
        self.dataset = dataset
        self.batch_size = batch_size
        self.batches = batches
        self.drop_last = drop_last
        self.hint_ahead = hint_ahead
        self.stack = stack
        self.multiprocessing_context = multiprocessing_context
        self._ring: BatchRing | None = None

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return batch_count(len(self.sampler), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        dataset = self.dataset
        positions = dataset.positions(np.fromiter(iter(self.sampler), dtype=np.int64))
        count = batch_count(len(positions), self.batch_size, self.drop_last)
        ring = self._started_ring()
        ring.start_epoch(dataset.ids[positions], batch_size=self.batch_size,
                         drop_last=self.drop_last, prefetch=self.batches,
                         hint_ahead=self.hint_ahead, verify=dataset.verify,
                         trace_dir=dataset.trace_dir)
        epoch = _ReadAheadEpoch(dataset, ring, positions, self.batch_size, count, self.stack)
        dataset.attach_batch_source(epoch)
        try:
            for number in range(count):
                if epoch.taken != number:
                    raise InvalidArgument(
                        f"ReadAhead reads batches for the training process itself, but the "
                        f"DataLoader asked for batch {number} before taking batch {epoch.taken}: "
                        "it has worker processes, which fetch for themselves.  Use "
                        "DataLoader(ds, batch_size=None, sampler=ReadAhead(...)) with "
                        "num_workers=0, or sampler=BatchSampler(...) with workers")
                yield epoch.batches[number]
        finally:
            if epoch.taken < count:
                ring.cancel_epoch()
            dataset.detach_batch_source(epoch)

    def close(self) -> None:
        """Stop the helper process (a later epoch starts a new one).  Idempotent."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _started_ring(self) -> BatchRing:
        if self._ring is None or self._ring.closed:
            dataset = self.dataset
            largest = max(int(dataset.sizes.max(initial=0)), 1)
            self._ring = BatchRing(dataset.ticket, slot_bytes=self.batch_size * largest,
                                   slots=self.batches + 2,
                                   context=self.multiprocessing_context)
        return self._ring


class _ReadAheadEpoch:
    """One `ReadAhead` epoch as its dataset sees it (a `BatchSource`): batches are taken in order.

    The training thread's share of a batch is a list comparison, a pipe
    message and a slice: positions were checked and targets gathered once
    per epoch.
    """

    def __init__(self, dataset: DLFSDataset, ring: BatchRing, positions: np.ndarray,
                 batch_size: int, count: int, stack: bool):
        self.stack = stack
        self.dataset = dataset
        self.ring = ring
        self.batch_size = batch_size
        self.batches = [positions[n * batch_size:(n + 1) * batch_size].tolist()
                        for n in range(count)]
        self.targets = (torch.from_numpy(dataset.targets[positions])
                        if dataset.targets is not None and dataset.target is not None else None)
        self.taken = 0

    def take(self, index):
        """The next batch if it is items `index`, else None (the caller fetches them itself)."""
        number = self.taken
        expected = self.batches[number] if number < len(self.batches) else None
        if index is not expected and (expected is None or list(index) != expected):
            return None
        batch = self.ring.next_batch()
        if self.stack:
            samples = torch.from_numpy(batch.rows())
        else:
            data = torch.from_numpy(batch.data)
            sizes = batch.sizes().tolist()
            samples = [data[end - size:end]
                       for end, size in zip(itertools.accumulate(sizes), sizes)]
        self.taken += 1
        if self.targets is not None:
            start = number * self.batch_size
            return samples, self.targets[start:start + len(expected)]
        return self.dataset.with_targets(np.asarray(expected, dtype=np.int64), samples)
