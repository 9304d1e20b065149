"""`DLFSDataLoader`: DLIO's pytorch data loader with one get_batch per batch.

Name it in a DLIO workload::

    reader:
      data_loader: pytorch
      data_loader_classname: dlfs.dlio.data_loader.DLFSDataLoader
      data_loader_sampler: index

Everything but the fetch is DLIO 2.0.0's own pytorch loader
(`dlio_benchmark.data_loader.torch_data_loader.TorchDataLoader`): the same
`dlio_sampler` (contiguous share per rank, shuffled with DLIO's seed), batch
size, ``read_threads`` workers, prefetch factor, persistent workers,
multiprocessing context and ``drop_last=True``.  The difference: its
dataset has ``__getitems__``, so a worker fetches the distinct files of a
whole batch with one get_batch round trip instead of opening files one by
one; it then decodes each as DLIO's reader for the format would, applies
DLIO's per-sample preprocess delay, and returns DLIO's placeholder image
per sample.  See `dlfs.dlio` for DLFS_SERVER / DLFS_DATASET.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
from dlio_benchmark.data_loader.torch_data_loader import dlio_sampler

from dlfs.dlio.dlio_source import DlfsSource, decode


class DlfsBatchDataset(Dataset):
    """DLIO's global sample indices of one rank, fetched a batch per get_batch."""

    def __init__(self, source: DlfsSource, index_map: dict, format_name: str, num_samples: int,
                 preprocess_time_s: float, preprocess_time_stdev_s: float,
                 placeholder: np.ndarray):
        self.source = source
        self.index_map = index_map  # global sample index -> (absolute file name, index in file)
        self.format_name = format_name
        self.num_samples = num_samples
        self.preprocess_time_s = preprocess_time_s
        self.preprocess_time_stdev_s = preprocess_time_stdev_s
        self.placeholder = placeholder

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> list:
        files = [self.index_map[int(i)][0] for i in indices]
        distinct = list(dict.fromkeys(files))  # a file holding several samples is read once
        for data in self.source.fetch(distinct):
            decode(self.format_name, data)
        for _ in files:
            self._preprocess()
        return [self.placeholder] * len(files)

    def _preprocess(self) -> None:
        """DLIO's FormatReader.preprocess: a normally distributed delay per sample."""
        if self.preprocess_time_s or self.preprocess_time_stdev_s:
            delay = np.random.normal(self.preprocess_time_s, self.preprocess_time_stdev_s)
            time.sleep(max(delay, 0.0))


class DLFSDataLoader(BaseDataLoader):
    """A DLIO custom data loader (``reader.data_loader_classname``)."""

    def __init__(self, format_type, dataset_type, epoch_number):
        super().__init__(format_type, dataset_type, epoch_number, DataLoaderType.CUSTOM)
        self.source = DlfsSource.from_env(self._args.data_folder)
        self._loader = None

    def read(self) -> None:
        args = self._args
        train = self.dataset_type is DatasetType.TRAIN
        index_map = args.train_global_index_map if train else args.val_global_index_map
        dataset = DlfsBatchDataset(self.source, dict(index_map), str(self.format_type),
                                   self.num_samples, args.preprocess_time,
                                   args.preprocess_time_stdev, args.resized_image)
        sampler = dlio_sampler(args.my_rank, args.comm_size, self.num_samples,
                               args.sample_shuffle, args.epochs, args.seed)
        kwargs = {}
        if args.read_threads > 0:
            prefetch_factor = math.ceil(args.prefetch_size / args.read_threads) \
                if args.prefetch_size > 0 else 2
            kwargs = {"multiprocessing_context": args.multiprocessing_context,
                      "prefetch_factor": prefetch_factor, "persistent_workers": True}
        self._loader = DataLoader(dataset, batch_size=self.batch_size, sampler=sampler,
                                  num_workers=args.read_threads,
                                  pin_memory=torch.cuda.is_available(), drop_last=True,
                                  **kwargs)

    def next(self):
        super().next()
        for batch in self._loader:
            yield batch
        self.epoch_number += 1

    def finalize(self) -> None:
        """End of an epoch.  DLIO calls `read` once and this after every epoch, so the
        loader (and its persistent workers) stays for the next epoch, as in DLIO's own."""
