"""`ReadAhead`: a batch sampler whose batches a helper process has already read (`dlfs.ring`).

The sampler side cuts the order into batches and starts the ring's epoch;
the dataset side is a `dlfs.torch.torch_dataset.BatchSource` attached to the
`DLFSDataset`, so ``ds[indices]`` takes each batch from the ring instead of
fetching it.
"""

from __future__ import annotations

import inspect
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

    Resuming mid-epoch: `state_dict` / `load_state_dict` (torchdata's
    ``Stateful``; ``StatefulDataLoader(ds, batch_size=None, sampler=ra)``
    saves and restores it).  The state counts the batches handed to the
    loader, not those read ahead.  With a sampler that takes
    ``state_dict(consumed=)`` (`ShuffleShardSampler`) it is the sampler's
    state after those samples, so it resumes at another batch size too;
    with any other sampler it is the number of samples done, and the
    resumed iteration skips that many of the sampler's order (which must
    then be the same order again, as a seeded sampler's is).
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
        self._positional = _takes_consumed(sampler)
        self._skip_pending = 0  # samples to skip (sampler without a positional state)
        self._pass: dict | None = None  # the current iteration: skipped, samples, batches taken

    @property
    def ring(self) -> BatchRing | None:
        """The helper's ring while it runs (its `memory` is what a batch's tensors view)."""
        return self._ring

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return batch_count(len(self.sampler), self.batch_size, self.drop_last)

    def state_dict(self) -> dict:
        """How far the current epoch has got: after the batches handed to the loader."""
        current = self._pass
        if current is None:  # not iterated since constructed or loaded
            if self._positional:
                return {"sampler": self.sampler.state_dict()}
            return {"samples_done": self._skip_pending}
        samples = len(current["positions"])
        # Through its last batch, the iteration is through its order (a cut tail included).
        done = samples if current["taken"] == batch_count(samples, self.batch_size,
                                                           self.drop_last) \
            else current["taken"] * self.batch_size
        if self._positional:
            return {"sampler": self.sampler.state_dict(consumed=done)}
        return {"samples_done": current["skipped"] + done}

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration start after the batches `state` counts as done.

        Raises InvalidArgument for a state of the other kind (see the class
        doc) or one the sampler refuses.
        """
        if self._positional and "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        elif not self._positional and "samples_done" in state:
            self._skip_pending = check_int("samples_done", state["samples_done"], 0,
                                           limits.shuffle_samples_max)
        else:
            raise InvalidArgument(
                f"not a state of this ReadAhead (its sampler {type(self.sampler).__name__} "
                f"{'has' if self._positional else 'has no'} positional state): {state!r:.200}")
        self._pass = None

    def __iter__(self) -> Iterator[list[int]]:
        """The epoch's batches as index lists.

        The sampler's order is drawn here, not at the first batch, so the
        position (a loaded state's included) is fixed when `iter` is called.
        """
        order = np.fromiter(iter(self.sampler), dtype=np.int64)
        skipped, self._skip_pending = self._skip_pending, 0
        self._pass = {"skipped": skipped, "positions": self.dataset.positions(order[skipped:]),
                      "taken": 0}
        return self._batches_of(self._pass)

    def _batches_of(self, current: dict) -> Iterator[list[int]]:
        dataset = self.dataset
        positions = current["positions"]
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
                current["taken"] = number + 1
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


def _takes_consumed(sampler) -> bool:
    """Whether `sampler` has ``state_dict(consumed=)``: a state at any position of its order."""
    method = getattr(sampler, "state_dict", None)
    if method is None or not hasattr(sampler, "load_state_dict"):
        return False
    try:
        return "consumed" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


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
