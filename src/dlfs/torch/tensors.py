"""Samples as ``torch.uint8`` tensors: one per sample (`to_tensor`) or one per batch (`stack_samples`)."""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from dlfs.ring import stack_into


def to_tensor(sample) -> torch.Tensor:
    """A sample's bytes as a 1-D ``torch.uint8`` tensor, without copying (a `transform`).

    The tensor shares the sample's read-only buffer: do not write to it in
    place.  The default collate stacks such tensors into one new batch
    tensor (in shared memory inside a DataLoader worker, so the batch
    reaches the training process without pickling its bytes through a
    pipe, which is what bounds a loader that returns ``bytes``).
    Cost: O(1) per sample; the stack is one copy of the batch.
    """
    global _frombuffer_warned
    if _frombuffer_warned:
        return torch.frombuffer(sample, dtype=torch.uint8)
    with warnings.catch_warnings():
        # torch warns (once per process) that the buffer is read-only; that is the point.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        tensor = torch.frombuffer(sample, dtype=torch.uint8)
    _frombuffer_warned = True
    return tensor


_frombuffer_warned = False


def stack_samples(samples: Sequence) -> torch.Tensor:
    """Samples of one size L (bytes-like) as one ``torch.uint8`` tensor of shape ``[B, L]``.

    One copy of each sample into the new tensor (`batch_tensor`: in shared
    memory inside a DataLoader worker).  Raises InvalidArgument when the
    sizes differ.  Cost: O(total bytes), copied by numpy without the GIL.
    """
    out = batch_tensor(len(samples), len(samples[0]) if len(samples) else 0)
    stack_into(samples, out.numpy().reshape(-1))
    return out


def batch_tensor(count: int, size: int) -> torch.Tensor:
    """A new ``torch.uint8`` tensor of shape ``[count, size]`` to receive a batch into.

    Inside a DataLoader worker it is allocated in shared memory (as torch's
    default collate does), so it reaches the training process without
    another copy.  Contents undefined.
    """
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None and count * size:
        storage = torch.UntypedStorage._new_shared(count * size)
        return torch.empty(0, dtype=torch.uint8).set_(storage).view(count, size)
    return torch.empty((count, size), dtype=torch.uint8)
