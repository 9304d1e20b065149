"""The data-dir lock: one daemon per data dir.

DATA_DIR/LOCK is `flock`ed for as long as the daemon runs and holds its
pid, so a second daemon on the same data dir fails at start naming the
first.  The kernel drops the lock when the process dies, even by `kill -9`.
Nothing here imports grpc.
"""

from __future__ import annotations

import fcntl
import os

from dlfs.formats.disk_layout import LOCK_FILE


class DataDirLock:
    """An exclusive lock on a data dir; `acquire` it, `release` when done."""

    def __init__(self, fd: int):
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: str) -> "DataDirLock":
        """Lock `data_dir` (which must exist) without waiting.

        Raises a RuntimeError naming the data dir and the holder's pid when
        another process holds it.
        """
        fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RuntimeError(
                f"data dir {data_dir} is in use by another dlfs-server (pid {holder}); stop it or "
                "choose another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd)

    def release(self) -> None:
        """Unlock (closing the descriptor drops the flock)."""
        os.close(self._fd)
