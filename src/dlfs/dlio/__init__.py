"""DLIO benchmark integration: a DLIO data loader and a DLIO reader that fetch from DLFS.

DLIO (``dlio_benchmark``, tested with 2.0.0) lists its data files in its
``data_folder`` and reads them with a format reader.  Two ways to run a
DLIO workload on DLFS:

1. Unchanged, through the FUSE mount: ``dlfs-mount ADDR /mnt/dlfs`` and
   ``++workload.dataset.data_folder=/mnt/dlfs/NAME``.  Every sample is one
   open/read/close on the mount.
2. Through get_batch, by naming a class of this package in the workload:

   - ``reader.data_loader_classname: dlfs.dlio.data_loader.DLFSDataLoader``
     with ``reader.data_loader_sampler: index`` — a torch DataLoader whose
     workers fetch each whole batch with ONE get_batch round trip (same
     sampler, batch size, workers and drop_last as DLIO's own pytorch loader).
   - ``reader.reader_classname: dlfs.dlio.reader.DLFSFormatReader`` — keeps DLIO's
     own data loader and swaps the file reader: the pytorch loader asks for
     one sample at a time (one round trip each); iterator-based loaders get
     one get_batch per batch.

   Both decode what they fetch the way DLIO's readers decode the files
   (Pillow for jpeg/png, numpy for npy/npz), run DLIO's per-sample
   preprocess delay, and hand DLIO the same placeholder arrays its readers
   do, so compute emulation and statistics are DLIO's.

Which daemon and dataset: environment variables (DLIO's configuration has
no place for them): ``DLFS_SERVER`` (default 127.0.0.1:7010),
``DLFS_DATASET`` (required), ``DLFS_DATA_ROOT`` (the directory that was
ingested as that dataset; default DLIO's ``data_folder``).  A file DLIO
lists as ``DATA_ROOT/train/img_1.jpeg`` is read as sample
``train/img_1.jpeg``.  DLIO still lists ``data_folder`` itself, so it must
exist there (the original tree, or the FUSE mount).

These modules import ``dlio_benchmark`` and are only for use inside it;
`dlfs.dlio.dlio_source` holds the DLIO-free part.
"""
