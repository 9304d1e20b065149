"""`DatasetTicket`: what another process needs to read a dataset without asking first.

A DataLoader worker or a read-ahead helper reads the dataset its parent
opened.  Opening it again would cost gRPC calls in the child (GetDataset,
GetDataPath), and gRPC after `fork` is fragile.  The parent takes a ticket
(`DatasetTicket.of(dataset)`: picklable plain data), the child `open()`s it: a new
client that knows the dataset's summary and where each daemon's data path
listens (and, for a striped dataset, which members hold each sample), so
its reads go straight to the data path and it opens a gRPC channel only if
it makes a metadata call.
"""

from __future__ import annotations

import dataclasses

from dlfs.client import process_state
from dlfs.client.client import Client
from dlfs.client.cluster.router import ClusterRouter
from dlfs.client.dataset import Dataset
from dlfs.types import DatasetInfo


@dataclasses.dataclass(frozen=True)
class DatasetTicket:
    """A dataset and how its client was made (address or etcd in `options`, data path
    hints)."""

    addresses: tuple
    options: dict  # Client keyword arguments
    info: DatasetInfo
    data_path_hints: dict  # address -> datapath_transport.DataPathHint
    placement: object = None  # cluster.Placement of a dataset read through several daemons

    @classmethod
    def of(cls, dataset: Dataset) -> "DatasetTicket":
        """The ticket of `dataset` (asks each daemon where its data path listens, once;
        through several daemons, the dataset's placement too)."""
        client = dataset.client
        transport = client.transport
        placement = None
        if isinstance(transport, ClusterRouter):
            placement = transport.placement(dataset.name)
            for address in placement.members:
                transport.member(address)  # so that its data path hint is taken too
        return cls(client.addresses, dict(client.options), dataset.info,
                   transport.data_path_hints(), placement)

    def open(self) -> Dataset:
        """The dataset, on a new client of this process; no call to a daemon yet.  Its
        daemons count as reached (`process_state.reached`): the ticket's process
        reached them, so a refused connection is a daemon restarting, waited for as
        the call policy says, also in a process started afresh (not forked)."""
        process_state.reached.update(self.addresses)
        client = Client(list(self.addresses) or None, data_path_hints=self.data_path_hints,
                        **self.options)
        if self.placement is not None:
            client.transport.adopt(self.info.name, self.placement)
        return Dataset(client, self.info)
