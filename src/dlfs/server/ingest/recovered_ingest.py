"""Prepared ingests found at restart, and what discarding an unpublished dataset means.

`RecoveredIngest` stands for a two-phase ingest that the catalog's replay
found prepared: no stream, no writer, only what it needs to be committed
or discarded.  `discard_dataset` is the one way an unpublished dataset
goes away on disk (a DELETE record, then its extents), for it and for an
`IngestSession` alike.  Nothing here imports grpc.
"""

from __future__ import annotations

import logging

from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.core.extents import ExtentStore
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)


class RecoveredIngest:
    """A two-phase ingest that a restart found prepared in the catalog.

    Its data and records are durable; the IngestMachine registers it PREPARED with
    the index replay built, and it then waits for the decision in etcd (the
    daemon's cluster member applies it), as a prepared `IngestSession` does.  `name`, `dataset_id`, `created_ns`, `replace` and
    `cluster` as there.
    """

    last_path = ""  # no stream: nothing arrived since the restart
    # A prepared ingest is never resumed (it voted yes; its commit ends it), whether
    # or not its stream was resumable: `IngestMachine.resume` refuses it as prepared.
    resumable = False

    def __init__(self, index: DatasetIndex, replace: bool, catalog: cat.Catalog,
                 extents: ExtentStore):
        self.name = index.name
        self.dataset_id = index.dataset_id
        self.created_ns = index.created_ns
        self.replace = replace
        self.cluster = index.cluster
        self._samples = len(index)
        self._bytes = index.total_bytes
        self._catalog = catalog
        self._extents = extents

    def summary(self) -> DatasetInfo:
        return DatasetInfo(self.name, self._samples, self._bytes, False, self.created_ns, 0)

    def discard(self) -> None:
        """A DELETE record, then the extents.  Never raises (see `discard_dataset`)."""
        discard_dataset(self._catalog, lambda: self._extents.remove_dataset(self.dataset_id),
                        self.name, self.dataset_id)


def discard_dataset(catalog: cat.Catalog, remove_extents, name: str, dataset_id: int,
                    sync: bool = False) -> None:
    """Record that an unpublished dataset is gone (`sync`: durably), then remove its
    extents.  Never raises.

    The extents stay when the catalog has failed (see Catalog.append): a
    SEAL of this dataset may have reached the disk, and only the restart's
    replay can tell; it removes them if not.  Extents that cannot be removed
    now are removed by that replay too.
    """
    try:
        catalog.append(records.RecordType.DELETE, records.encode_delete(dataset_id), sync=sync)
    except Exception:  # noqa: BLE001 - replay discards an unsealed dataset anyway
        log.exception("could not record the abort of dataset %r", name)
    if catalog.failed:
        log.warning("keeping the extents of dataset %r for the restart to decide: %s",
                    name, catalog.failed)
        return
    try:
        remove_extents()
    except OSError as exc:
        log.warning("could not remove the extents of the aborted ingest of %r (%s); "
                    "the next start removes them", name, exc)
