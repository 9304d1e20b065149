"""DLFS client: `Client(address)`, `Dataset`, value types."""

from dlfs.client.client import Client, Dataset
from dlfs.client.convert import DatasetInfo, Entry

__all__ = ["Client", "Dataset", "DatasetInfo", "Entry"]
