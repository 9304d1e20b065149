"""DLFS client: `Client(address)` or `Client(etcd=URL)`, `Dataset`, `DatasetTicket`, and what their callers
need besides (value types, reply buffers, co-located extent readers).

Training code and the adapters (`dlfs.torch`, `dlfs.fuse`, `dlfs.cli`, ...)
import from here only, never from a module inside the package.
"""

from dlfs.client.addresses import daemon_addresses
from dlfs.client.client import Client, Dataset
from dlfs.client.cluster.rebalance import RebalanceReport
from dlfs.coord.cluster_keys import MemberRecord
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.scrub_report import ScrubReport
from dlfs.client.spaces import Space, SpaceFile, SpaceReader, open_writer
from dlfs.client.ticket import DatasetTicket
from dlfs.client.transport.checksum_errors import named_checksum_error
from dlfs.client.transport.datapath_writer import FileState, FileWriter
from dlfs.client.transport.direct_reader import DirectReader
from dlfs.client.transport.grpc_channel import FORK_SUPPORT_ENV, fork_support_enabled
from dlfs.client.transport.read_requests import SampleKey
from dlfs.types import DaemonStatus, DatasetInfo, Entry, WarmInfo

__all__ = ["FORK_SUPPORT_ENV", "BufferPool", "Client", "DaemonStatus", "Dataset",
           "DatasetInfo", "DatasetTicket", "DirectReader", "Entry", "FileState", "FileWriter",
           "RebalanceReport",
           "MemberRecord", "SampleKey", "ScrubReport", "Space", "SpaceFile", "SpaceReader",
           "WarmInfo", "daemon_addresses", "open_writer", "fork_support_enabled", "named_checksum_error"]
