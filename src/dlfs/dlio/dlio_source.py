"""Where DLIO's files live in DLFS, and how DLIO's readers decode them.  No DLIO import.

`DlfsSource` maps the absolute file names DLIO works with to sample paths
of one dataset and fetches them, with a client per process (created on
first use and again after a fork, noticed by pid).  `decode` does to a
fetched sample what DLIO's reader of that format does to a file.
"""

from __future__ import annotations

import io
import os
from typing import Sequence

import numpy as np

from dlfs.client import Client
from dlfs.errors import InvalidArgument

ENV_SERVER = "DLFS_SERVER"
ENV_DATASET = "DLFS_DATASET"
ENV_DATA_ROOT = "DLFS_DATA_ROOT"
DEFAULT_SERVER = "127.0.0.1:7010"


class DlfsSource:
    """One DLFS dataset standing in for a directory tree `data_root`.  Picklable."""

    def __init__(self, server: str, dataset: str, data_root: str):
        self.server = server
        self.dataset = dataset
        self.data_root = os.path.abspath(data_root)
        self._pid = -1
        self._client: Client | None = None
        self._ds = None

    @classmethod
    def from_env(cls, data_folder: str) -> "DlfsSource":
        """From DLFS_SERVER, DLFS_DATASET and DLFS_DATA_ROOT (default `data_folder`)."""
        dataset = os.environ.get(ENV_DATASET, "")
        if not dataset:
            raise InvalidArgument(
                f"set {ENV_DATASET} to the DLFS dataset holding DLIO's data folder "
                f"(ingest it first: dlfs ingest {data_folder} NAME)")
        return cls(os.environ.get(ENV_SERVER, DEFAULT_SERVER), dataset,
                   os.environ.get(ENV_DATA_ROOT, data_folder))

    def path_of(self, filename: str) -> str:
        """The sample path of DLIO file `filename`.  Raises InvalidArgument outside data_root."""
        relative = os.path.relpath(os.path.abspath(filename), self.data_root)
        if relative == "." or relative.startswith(".." + os.sep) or relative == "..":
            raise InvalidArgument(
                f"DLIO file {filename!r} is not below {self.data_root!r}, the directory "
                f"ingested as dataset {self.dataset!r}; set {ENV_DATA_ROOT}")
        return relative.replace(os.sep, "/")

    def fetch(self, filenames: Sequence[str]) -> list[memoryview]:
        """The files' bytes in order (duplicates allowed): one get_batch round trip."""
        return self._remote().get_batch([self.path_of(f) for f in filenames])

    def close(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = self._ds = None
        self._pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_client=None, _ds=None, _pid=-1)
        return state

    def _remote(self):
        if self._pid != os.getpid():
            # An inherited client belongs to the parent process: leave it alone.
            self._client = Client(self.server)
            self._ds = self._client.dataset(self.dataset)
            self._pid = os.getpid()
        return self._ds


def decode(format_name: str, data) -> object:
    """What DLIO's reader for `format_name` makes of a file's bytes.

    jpeg/png: ``np.asarray(PIL.Image.open(...))``; npz: ``np.load(...)["x"]``;
    npy: ``np.load(...)``; any other format: the bytes, untouched (DLIO
    would need its own reader for it; the read itself is what is measured).
    """
    name = str(format_name).lower()
    if name in ("jpeg", "png"):
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(data)))
    if name == "npz":
        return np.load(io.BytesIO(data), allow_pickle=True)["x"]
    if name == "npy":
        return np.load(io.BytesIO(data))
    return data
