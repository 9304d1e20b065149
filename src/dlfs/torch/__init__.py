"""PyTorch integration: a map-style dataset, a shuffle-and-shard sampler, prefetch hints.

    from torch.utils.data import DataLoader
    from dlfs.torch import DLFSDataset, ShuffleShardSampler

    ds = DLFSDataset("127.0.0.1:7010", "demo", root="train", transform=decode)
    sampler = ShuffleShardSampler(len(ds), seed=1)      # rank/world size from torch.distributed
    loader = DataLoader(ds, batch_size=256, sampler=sampler, num_workers=4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            ...

Needs the optional extra ``torch`` (``pip install '.[torch]'`` in a checkout; the CPU
build is enough); without
torch, importing this package raises ModuleNotFoundError naming that extra.

Modules, one job each (everything public is importable from here):

- `dataset`: `DLFSDataset`, the samples of a DLFS dataset as torch items and batches;
- `samplers`: `ShuffleShardSampler` (DistributedSampler's order) and
  `PrefetchHints` (clairvoyant hints to the daemon);
- `readahead`: `ReadAhead`, batches read ahead by a helper process (`dlfs.ring`);
- `decoded_batches`: `DecodedBatches`, encoded batches decoded and augmented on
  the GPU (or the CPU) one thread ahead of the training step;
- `image_decode`: `ImageDecoder`, a batch of JPEGs in one nvJPEG (or DALI)
  call, other formats by Pillow;
- `image_augment`: crop, resize, flip and normalise a batch in one pass;
- `tensors`: samples as uint8 tensors (`to_tensor`, `stack_samples`);
- `folders`: which samples lie below a root, and ImageFolder-style labels;
- `checkpoint` (imported on its own: ``from dlfs.torch.checkpoint import
  DLFSWriter, DLFSReader``): torch.distributed.checkpoint into checkpoint
  spaces, over the data path;

Forked workers read over the data path only: gRPC is unusable after a fork
(`dlfs.client.transport.grpc_channel.check_grpc_usable`; `fork_support_enabled` tells
whether gRPC's own fork support was switched on).
"""

try:
    import torch as _torch  # noqa: F401 - only to say which extra is missing
except ModuleNotFoundError as _missing:
    if _missing.name != "torch":
        raise
    from dlfs.version import missing_extra as _missing_extra

    raise ModuleNotFoundError(_missing_extra("dlfs.torch", "torch", "PyTorch"),
                              name="torch") from None

from dlfs.client import FORK_SUPPORT_ENV, fork_support_enabled
from dlfs.torch.torch_dataset import TARGET_PARENT_DIR, BatchSource, DLFSDataset
from dlfs.torch.readahead import ReadAhead
from dlfs.torch.decoded_batches import DecodedBatches, DecodeStats
from dlfs.torch.image_decode import ImageDecoder
from dlfs.torch.samplers import PrefetchHints, ShuffleShardSampler, torch_permutation
from dlfs.torch.tensors import stack_samples, to_tensor

__all__ = [
    "BatchSource", "DLFSDataset", "DecodeStats", "DecodedBatches", "ImageDecoder", "FORK_SUPPORT_ENV", "PrefetchHints", "ReadAhead",
    "ShuffleShardSampler", "TARGET_PARENT_DIR", "fork_support_enabled", "stack_samples",
    "to_tensor", "torch_permutation",
]
