"""Fault injection at the daemon's disk operations: a test hook, off unless asked for.

Every place the daemon changes its data dir calls `point(op)` just before
the system call, with `op` one of `OPS`.  With the environment variable
``DLFS_FAULT=OP:N:ACTION[:startup]`` set when the daemon starts, the N-th
call of OP (counting from 1; OP ``any`` counts every operation) does ACTION
instead of the call.  Calls are counted from the moment the daemon serves
(`serving()`), or, with ``:startup``, from the start of the process, which
reaches the catalog replay and its compaction.  ACTION is:

- an errno name (``EIO``, ``ENOSPC``, ``EMFILE``, ...): raise that OSError, as
  the kernel would;
- ``kill``: SIGKILL the daemon on the spot, a crash at exactly that step;
- ``stop``: SIGSTOP the daemon on the spot, then do the call once it gets
  SIGCONT: the daemon stands still at exactly that step (a client mid-ingest
  can be interrupted there), then carries on.

Only the first match fires, and it is logged (``fault injected: ...``) so a
test can count the faults that really happened.  Tests use it to drive
every failure path of seal, replace, delete, compaction and striped commits
and then check that a restart finds one whole version of every dataset.
Nothing here imports grpc.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

ENV_VAR = "DLFS_FAULT"

# create: a new file; mkdir: a new directory; write: file data (extents, catalog);
# fsync: a file or directory; truncate: cutting a file; rename; unlink: removing
# files or directories; seal: a step, not a system call: just before a SEAL
# record is appended (to crash a member exactly between prepare and commit).
OPS = ("create", "mkdir", "write", "fsync", "truncate", "rename", "unlink", "seal")


class FaultPlan:
    """Which call of which operation fails, and how (parsed from `DLFS_FAULT`)."""

    def __init__(self, op: str, nth: int, action: str, from_startup: bool = False):
        if op not in OPS and op != "any":
            raise ValueError(f"{ENV_VAR}: unknown operation {op!r}; use one of "
                             f"{', '.join(OPS)} or any")
        if nth < 1:
            raise ValueError(f"{ENV_VAR}: the call number must be at least 1, not {nth}")
        if action not in ("kill", "stop") and not isinstance(getattr(errno, action, None), int):
            raise ValueError(f"{ENV_VAR}: {action!r} is neither 'kill', 'stop' nor an errno "
                             "name such as EIO or ENOSPC")
        self.op, self.nth, self.action = op, nth, action
        self.counting = from_startup
        self._calls = 0
        self._lock = threading.Lock()
        self.fired = False

    @classmethod
    def parse(cls, spec: str) -> "FaultPlan":
        """``OP:N:ACTION[:startup]``, e.g. ``fsync:3:EIO``.  Raises ValueError naming
        what is wrong."""
        parts = spec.split(":")
        if (len(parts) not in (3, 4) or not parts[1].isdigit()
                or parts[3:] not in ([], ["startup"])):
            raise ValueError(f"{ENV_VAR}={spec!r}: expected OP:N:ACTION[:startup], "
                             "e.g. fsync:3:EIO")
        return cls(parts[0], int(parts[1]), parts[2], from_startup=len(parts) == 4)

    def check(self, op: str, where: str) -> None:
        if not self.counting or (self.op != "any" and op != self.op):
            return
        with self._lock:
            if self.fired:
                return
            self._calls += 1
            if self._calls != self.nth:
                return
            self.fired = True
        log.error("fault injected: %s #%d (%s) -> %s", op, self.nth, where, self.action)
        if self.action == "kill":
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "stop":
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
            return  # continued: the call goes ahead
        code = getattr(errno, self.action)
        raise OSError(code, f"{os.strerror(code)} (injected fault at {op} #{self.nth})", where)


_plan: FaultPlan | None = None


def install(spec: str | None) -> FaultPlan | None:
    """Arm the hook with `spec` (None or "" disarms it).  Raises ValueError on a bad spec."""
    global _plan
    _plan = FaultPlan.parse(spec) if spec else None
    if _plan is not None:
        log.warning("%s=%s: fault injection is armed (a test hook; never set it in production)",
                    ENV_VAR, spec)
    return _plan


def install_from_env() -> FaultPlan | None:
    """Arm the hook from the `DLFS_FAULT` environment variable, if set."""
    return install(os.environ.get(ENV_VAR))


def serving() -> None:
    """The daemon serves now: a plan without ``:startup`` starts counting calls."""
    if _plan is not None:
        _plan.counting = True


def point(op: str, where: str = "") -> None:
    """Called just before disk operation `op` (one of OPS) on `where`.

    A no-op unless a fault plan is armed and this is its call: then raises
    the planned OSError, or kills the process.
    """
    plan = _plan
    if plan is not None:
        plan.check(op, where)
