"""DLFS client: `Client(address)`, `Dataset`, `DatasetTicket`, value types."""

from dlfs.client.client import Client, Dataset
from dlfs.client.transport.grpc_types import DatasetInfo, Entry
from dlfs.client.ticket import DatasetTicket

__all__ = ["Client", "Dataset", "DatasetInfo", "DatasetTicket", "Entry"]
