"""`DLFSFormatReader`: a DLIO format reader that reads files from DLFS instead of the file system.

Name it in a DLIO workload::

    reader:
      reader_classname: dlfs.dlio.reader.DLFSFormatReader

DLIO keeps its own data loader.  Its index-based (pytorch) loader asks the
reader for one sample at a time (`read_index`), so each sample is one
round trip (``ds.get``); the iterator-based path (`next`) fetches the
files of each batch with one get_batch.  Fetched bytes are decoded as
DLIO's reader for ``dataset.format`` would (`dlfs.dlio.dlio_source.decode`).
For whole-batch fetches under the pytorch loader use
`dlfs.dlio.data_loader.DLFSDataLoader` instead.
"""

from __future__ import annotations

import numpy as np

from dlio_benchmark.reader.reader_handler import FormatReader

from dlfs.dlio.dlio_source import DlfsSource, decode


class DLFSFormatReader(FormatReader):
    """DLIO reader over a DLFS dataset (see `dlfs.dlio` for the environment variables)."""

    def __init__(self, dataset_type, thread_index, epoch):
        super().__init__(dataset_type, thread_index)
        self.source = DlfsSource.from_env(self._args.data_folder)

    def open(self, filename):
        super().open(filename)
        return decode(self._args.format, self.source.fetch([filename])[0])

    def close(self, filename):
        super().close(filename)

    def get_sample(self, filename, sample_index):
        super().get_sample(filename, sample_index)

    def next(self):
        """Batches of this reader thread's share, each batch's files in one get_batch."""
        entries = list(self.file_map[self.thread_index])
        self.step = 1
        for start in range(0, len(entries), self.batch_size):
            chunk = entries[start:start + self.batch_size]
            files = list(dict.fromkeys(filename for _idx, filename, _sample in chunk))
            for data in self.source.fetch(files):
                decode(self._args.format, data)
            batch = []
            for global_sample_idx, _filename, _sample_index in chunk:
                self.image_idx = global_sample_idx
                self.preprocess()
                batch.append(self._args.resized_image)
            while len(batch) < self.batch_size:  # DLIO pads the last batch the same way
                batch.append(self._args.resized_image)
            self.step += 1
            yield np.array(batch)

    def read_index(self, global_sample_idx, step):
        return super().read_index(global_sample_idx, step)

    def finalize(self):
        self.source.close()
        return super().finalize()

    def is_index_based(self):
        return True

    def is_iterator_based(self):
        return True
