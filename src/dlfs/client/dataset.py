"""`Dataset`: one dataset on a daemon (or striped over several), as the client sees it."""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from dlfs.client import metadata
from dlfs.client.transport.read_requests import SampleKey, prefetch_request
from dlfs.errors import StaleGeneration
from dlfs.types import DatasetInfo, Entry


class Dataset:
    """One sealed version of a dataset.  `len(ds)` samples with ids 0..len-1.

    `client` is the `Client` it was opened with; every call goes through
    that client's transport (one daemon, several, or co-located).  Reads
    name the version (`info.generation`) the ids refer to, so a batch never
    mixes versions.  When the dataset was replaced since it was opened,
    `get_batch` and `read` switch to the current version (`info` is updated)
    and ask once more: the whole batch then comes from the new version.
    A read that names a `generation` itself is pinned to it instead
    (StaleGeneration once it is replaced; 0: whatever is current).
    """

    def __init__(self, client, info: DatasetInfo):
        self.client = client
        self.info = info
        self.name = info.name

    @property
    def _transport(self):
        return self.client.transport

    def __len__(self) -> int:
        return self.info.samples

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, samples={len(self)}, bytes={self.info.bytes})"

    def get_batch(self, keys: Iterable[SampleKey], *, verify: bool = True,
                  prefetch: Iterable[int] = (), out=None,
                  generation: int | None = None) -> list[memoryview]:
        """Samples by ids or by paths, in request order, duplicates allowed.

        One round trip.  Samples are read-only memoryviews of one reply
        buffer; with `out` (a writable contiguous buffer: a bytearray, a
        numpy array, a tensor's ``.numpy()``) they are written back to back
        into it in request order (received straight into it over the data
        path) and the views are of `out`.  `prefetch` optionally names
        sample ids wanted next: the daemon starts reading them into its
        page cache with this call (as `prefetch` does).  Raises
        InvalidArgument (bad id, mixed ids and paths, batch over the
        daemon's limit, `out` too small), NotFound (unknown path),
        DataCorruption (stored or received bytes fail their checksum),
        StaleGeneration (replaced again while it was being read, or the
        `generation` asked for is no longer served).
        """
        def read(version: int) -> list[memoryview]:
            return self.client.get_batch(keys, dataset=self.name, verify=verify,
                                         prefetch=prefetch, out=out, generation=version)

        return read(generation) if generation is not None else self._current(read)

    def refresh(self) -> DatasetInfo:
        """Ask the daemon for the dataset's current version and read that one from now on."""
        self.info = self._transport.dataset_info(self.name, self.info)
        return self.info

    def _current(self, read):
        """`read(generation)`, once more with the current version if this one was replaced."""
        try:
            return read(self.info.generation)
        except StaleGeneration:
            self.refresh()
            return read(self.info.generation)

    def prepare(self) -> None:
        """Set up reading now rather than at the first batch (optional).

        With ``direct=True`` that is fetching the location index and opening
        the extent files; over gRPC there is nothing to do.  Raises what the
        first get_batch would (FailedPrecondition when direct reads are
        impossible here).
        """
        self._transport.prepare(self.name)

    def get(self, key: SampleKey, *, verify: bool = True) -> memoryview:
        """One sample by id or path."""
        return self.get_batch([key], verify=verify)[0]

    def prefetch(self, keys: Iterable[SampleKey], *, wait: bool = False) -> bool:
        """Hint that samples `keys` will be read soon; the daemon starts reading them
        into its page cache and this call returns at once.

        Returns False when the daemon's prefetch queue is full (the hint was
        dropped: only speed is lost), as far as known when the call returns:
        a hint by ids on the data path is sent without waiting for the
        daemon's answer (one `sendmsg`; the daemon plans it while the caller
        goes on), and True then means sent.  With `wait`, the call waits for
        the answer, so that False reliably means dropped: for a thread that
        sends hints in the background (the pipelines' do), where the round
        trip delays nobody.  Raises as get_batch does for bad keys (ids
        outside this version's range are asked of the daemon and waited
        for, so that it decides).
        """
        request = prefetch_request(self.name, keys)
        if not request.size:
            return True
        # Ids this version holds go without waiting; others are the daemon's to judge.
        ids = request.ids if request.ids is not None else np.empty(0, np.int64)
        known = ids.size > 0 and 0 <= ids.min() and ids.max() < len(self)
        return self._transport.prefetch(request, wait=wait or not known)

    def read(self, key: SampleKey, offset: int = 0, length: int = 0, *, verify: bool = True,
             generation: int | None = None) -> memoryview:
        """`length` bytes (0: to the end) at `offset` of one sample, clipped to its size.

        One round trip.  With `verify`, every byte returned was checked: the
        whole sample against its CRC32C, a part against the CRC32Cs of the
        1 MiB blocks it touches (dlfs.formats.block_crcs; at most a block more is read
        on each side).  Parts of samples over 1 MiB of datasets ingested
        before block CRCs cannot be checked.  Raises DataCorruption naming
        the sample (and block); `generation` as for get_batch.
        """
        def read(version: int) -> memoryview:
            return self.client.read(self.name, key, offset, length, verify=verify,
                                    generation=version)

        return read(generation) if generation is not None else self._current(read)

    def read_chunks(self, key: SampleKey, offset: int = 0, length: int = 0, *,
                    verify: bool = True, generation: int | None = None
                    ) -> Iterator[tuple[int, memoryview]]:
        """Like `read`, but hands out the reply's pieces as they arrive.

        Yields (position from `offset`, bytes) in order; one round trip, no
        reply-sized buffer, so a large range reaches the caller piece by
        piece.  With `verify`, the daemon checks each piece before it sends
        it (the blocks it touches, as `read`); a damaged block ends the
        stream with DataCorruption.  UNAVAILABLE before the first piece is
        retried as every read is; a stream that breaks later raises
        Unavailable.  Reads the version opened (or `generation`), without
        switching: StaleGeneration when it was replaced.
        """
        yield from self.client.read_chunks(
            self.name, key, offset, length, verify=verify,
            generation=self.info.generation if generation is None else generation)

    def path(self, sample_id: int) -> str:
        """Path of sample `sample_id`."""
        return self.lookup([sample_id])[0].path

    def index(self, path: str) -> int:
        """Sample id of `path`."""
        return self.lookup([path])[0].id

    def lookup(self, keys: Sequence[SampleKey]) -> list[Entry]:
        """Entries of samples by ids or paths (at most limits.lookup_items_max)."""
        return metadata.lookup(self._transport, self.name, keys)

    def paths(self) -> list[str]:
        """Every sample path, in id order.  One Lookup per 65,536 samples."""
        return self.listing()[0]

    def listing(self) -> tuple[list[str], np.ndarray]:
        """Every sample's path and size in bytes (an int64 array), in id order.

        One Lookup per 65,536 samples.
        """
        entries = metadata.all_entries(self._transport, self.name, len(self))
        return ([e.path for e in entries],
                np.fromiter((e.size for e in entries), dtype=np.int64, count=len(entries)))

    def stat(self, path: str = "") -> Entry:
        return metadata.stat(self._transport, self.name, path)

    def listdir(self, path: str = "", **kwargs) -> Iterator[Entry]:
        return metadata.listdir(self._transport, self.name, path, **kwargs)
