"""gRPC and forked DataLoader workers: whether it is safe, and a warning when it is not.

DataLoader workers are forked (the default start method) from a process
that has used gRPC.  Unless gRPC's fork support is on
(``GRPC_ENABLE_FORK_SUPPORT=true`` in the environment before grpc is first
imported), a forked worker can deadlock inside gRPC's core while creating
its own channel (seen in this package's tests: 4 of 8 runs hung).
`fork_support_enabled` tells; `DLFSDataset` warns once when it is off.  The
other way out is ``DataLoader(..., multiprocessing_context="forkserver")``
(or "spawn"): workers then start without the parent's gRPC state.
"""

from __future__ import annotations

import warnings

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"


def fork_support_enabled() -> bool:
    """Whether this process's gRPC was imported with fork support on (read at grpc import)."""
    from grpc._cython import cygrpc  # the flag is only exposed there

    return bool(cygrpc.is_fork_support_enabled())


def warn_without_fork_support() -> None:
    """Warn (RuntimeWarning, once per process) when gRPC fork support is off.

    The warning points at the caller's caller (the code constructing a
    `DLFSDataset`).
    """
    global _fork_warning_given
    if _fork_warning_given or fork_support_enabled():
        return
    _fork_warning_given = True
    warnings.warn(
        f"gRPC fork support is off in this process: DataLoader workers started by fork can "
        f"deadlock creating their DLFS channel.  Set {FORK_SUPPORT_ENV}=true in the environment "
        "before Python starts (or before anything imports grpc), or pass "
        "multiprocessing_context='forkserver' to the DataLoader.", RuntimeWarning, stacklevel=3)


_fork_warning_given = False
