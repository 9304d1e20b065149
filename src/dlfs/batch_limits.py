"""The batch limits: how many samples and bytes one read request may ask for.

One `BatchLimits` per daemon, built by the Store from --batch-ids-max and
--batch-bytes-max (`Store.batch_limits`).  Both front doors go through it:
gRPC via the planning functions (`batch_planning.plan_request`,
`range_planning.plan_range`), which take it as a parameter, and the data
path's replies, which call it directly.  The daemon tells its limits to
data path clients at WELCOME (`datapath_frames.DaemonLimits`), and the
client checks a request against them before it sends a byte.  So a request
over a limit gets the same InvalidArgument with the same message whichever
way it came in, and whichever side refused it.  Shared vocabulary: nothing
here imports grpc, the daemon or the client.
"""

from __future__ import annotations

import dataclasses

from dlfs import limits
from dlfs.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class BatchLimits:
    """`ids_max` samples and `bytes_max` payload bytes per request (both at least 1).

    Each check is O(1) and raises InvalidArgument naming the request, the
    limit, the daemon option that sets it, and what to do.
    """

    ids_max: int = limits.batch_ids_max_default
    bytes_max: int = limits.batch_bytes_max_default

    def __post_init__(self):
        if self.ids_max < 1 or self.bytes_max < 1:
            raise ValueError("batch limits must be at least 1")

    def check_count(self, count: int) -> None:
        """A batch of `count` samples (ids or paths, duplicates counted)."""
        if count > self.ids_max:
            raise InvalidArgument(
                f"batch of {count} samples exceeds the limit of {self.ids_max} "
                "(--batch-ids-max); split it into smaller batches")

    def check_payload(self, count: int, payload_bytes: int) -> None:
        """A batch of `count` samples whose reply carries `payload_bytes` bytes."""
        if payload_bytes > self.bytes_max:
            raise InvalidArgument(
                f"batch of {count} samples holds {payload_bytes} bytes, over the limit of "
                f"{self.bytes_max} (--batch-bytes-max); split it into smaller batches")

    def check_range(self, range_bytes: int) -> None:
        """A byte range of one sample, `range_bytes` long."""
        if range_bytes > self.bytes_max:
            raise InvalidArgument(
                f"a range of {range_bytes} bytes is over the limit of {self.bytes_max} "
                "(--batch-bytes-max); read it in parts")
