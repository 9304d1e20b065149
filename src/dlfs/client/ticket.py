"""`DatasetTicket`: what another process needs to read a dataset without asking first.

A DataLoader worker or a read-ahead helper reads the dataset its parent
opened.  Opening it again would cost gRPC calls in the child (GetDataset,
GetDataPath), and gRPC after `fork` is fragile.  The parent takes a ticket
(`DatasetTicket.of(dataset)`: picklable plain data), the child `open()`s it: a new
client that knows the dataset's summary and where each daemon's data path
listens, so its reads go straight to the data path and it opens a gRPC
channel only if it makes a metadata call.
"""

from __future__ import annotations

import dataclasses

from dlfs.client.client import Client
from dlfs.client.dataset import Dataset
from dlfs.types import DatasetInfo


@dataclasses.dataclass(frozen=True)
class DatasetTicket:
    """A dataset and how its client was made (addresses, options, data path hints)."""

    addresses: tuple
    options: dict  # Client keyword arguments
    info: DatasetInfo
    data_path_hints: dict  # address -> datatransport.DataPathHint

    @classmethod
    def of(cls, dataset: Dataset) -> "DatasetTicket":
        """The ticket of `dataset` (asks each daemon where its data path listens, once)."""
        client = dataset.client
        return cls(client.addresses, dict(client.options), dataset.info,
                   client.transport.data_path_hints())

    def open(self) -> Dataset:
        """The dataset, on a new client of this process; no call to a daemon yet."""
        client = Client(list(self.addresses), data_path_hints=self.data_path_hints,
                        **self.options)
        return Dataset(client, self.info)
