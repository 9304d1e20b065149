"""Scrub: verify every stored sample of a dataset against its CRC32C.

Runs through the same read engine as batches, so it shares the reader
threads and the byte budget with them.  Nothing here imports grpc.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dlfs.errors import DataCorruption
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.read.batch_planning import plan_batch
from dlfs.server.read.read_engine import ReadEngine

# Samples verified per step (per progress report).
CHUNK_SAMPLES = 4096


def scrub(engine: ReadEngine, dataset: DatasetIndex, chunk_samples: int = CHUNK_SAMPLES
          ) -> Iterator[tuple[int, int, list[tuple[int, str]]]]:
    """Verify every sample's CRC32C; yield (samples checked, bytes checked, newly bad).

    Reads the dataset in storage order, `chunk_samples` at a time.  A
    damaged sample is reported and the scrub goes on; a truncated extent
    reports the samples of its chunk.  Samples of a striped dataset that
    other members store are theirs to check.
    """
    local = np.flatnonzero(dataset.extent != NO_EXTENT)
    order = local[np.lexsort((dataset.offset[local], dataset.extent[local]))]
    checked = checked_bytes = 0
    for start in range(0, len(dataset), chunk_samples):
        ids = order[start:start + chunk_samples]
        plan = plan_batch(ids, dataset.extent, dataset.offset, dataset.length, dataset.crc)
        bad: list[tuple[int, str]] = []
        try:
            for _offset, _window in engine.stream(dataset.dataset_id, plan, verify=True,
                                                  describe=dataset.describe, bad=bad):
                pass
        except DataCorruption as exc:  # truncated or missing extent: the whole chunk is suspect
            bad.extend((int(i), str(exc)) for i in ids)
        checked += ids.size
        checked_bytes += int(dataset.length[ids].sum())
        yield checked, checked_bytes, bad
