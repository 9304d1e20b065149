"""Everything the client keeps per process rather than per `Client`: one module, so
that "what does a forked DataLoader worker inherit?" has one answer.

Each piece is here because a new `Client` of the same process (or of one forked
from it) must see it, and nothing else is kept at module level in
`dlfs.client`:

- `reached`: the daemons (addresses) a call of this process reached, or the
  process whose `DatasetTicket` it opened.  A daemon never reached gets the
  short first-contact bound of the read policy (`limits.first_contact_timeout_s`:
  most likely nothing runs there), and none at all for a refused connection;
  one reached before is waited for as long as the call allows (it is restarting).
  One entry per daemon ever talked to (a handful): never trimmed.
- `learnt_data_paths`: where each daemon's data path listens, as this process
  (or the one it was forked from) learnt it (`DataPathHint`).  A client made
  from scratch in a forked worker, where gRPC cannot be used, finds its
  daemon's data path here instead of asking.  One entry per daemon.
- `data_paths`: the live `DataPath` pools of this process (weakly held), so
  that a forked child forgets the connections it inherited (they are its
  parent's: `DataPath.forget_inherited`) before it uses them.
- `grpc`: which process opened gRPC's core, and the channels that hold that
  core up (`grpc_channel`): gRPC cannot be used after a fork from a process
  whose core ran, and must not shut its core down while a fork may happen.

Nothing here does I/O.  Thread-safe as far as its uses need: sets and dicts
updated by single operations under the GIL.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from typing import Any

reached: set[str] = set()

learnt_data_paths: dict[str, Any] = {}  # address -> datapath_transport.DataPathHint

data_paths: "weakref.WeakSet[Any]" = weakref.WeakSet()  # datapath_pool.DataPath


@dataclasses.dataclass
class GrpcCore:
    """gRPC's core in this process (see `grpc_channel.open_channel`)."""

    # The process that opened this process's first gRPC channel (0: none yet).  A
    # forked child inherits the value, so "nonzero and not my pid" means gRPC's
    # core ran in an ancestor and its threads did not come along.
    opened_by_pid: int = 0
    # Channels that hold the core up (never used, never closed), and the process
    # that opened them.
    holders: list = dataclasses.field(default_factory=list)
    holder_pid: int = 0


grpc = GrpcCore()


def _forget_inherited_connections() -> None:
    for path in list(data_paths):
        path.forget_inherited()


os.register_at_fork(after_in_child=_forget_inherited_connections)
