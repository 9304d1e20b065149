"""Reply buffers that are reused once nothing references them.

A batch received without a caller-owned `out` buffer needs memory that
lives as long as any of its samples does.  A fresh allocation per batch
costs more than receiving it: a new 28 MB buffer is faulted in page by
page, which costs more CPU than the socket copy.  The pool
hands out buffers whose pages were faulted in by an earlier batch.

Ownership: `take(n)` returns a numpy uint8 array of `n` bytes whose base is
a lease; every view, memoryview or tensor made from it keeps the lease
alive, and a `weakref.finalize` on the lease returns the buffer to the pool
when the last of them is gone.  Nothing is ever reused while reachable.
The pool keeps at most `idle_bytes_max` of returned buffers; beyond that
they are freed.  Thread-safe.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from dlfs import limits
from dlfs.errors import InvalidArgument

_PAGE_BYTES = 4096


class _Lease:
    """The owner of one reply's bytes, as numpy sees it (see the module docstring)."""

    __slots__ = ("__array_interface__", "_buffer", "__weakref__")

    def __init__(self, buffer: np.ndarray, size: int):
        self._buffer = buffer
        self.__array_interface__ = {"data": (buffer.ctypes.data, False), "shape": (size,),
                                    "typestr": "|u1", "version": 3}


class BufferPool:
    """Recycled reply buffers, in power-of-two size classes from `limits.reply_buffer_bytes_min`."""

    def __init__(self, idle_bytes_max: int = limits.reply_buffer_pool_bytes_max):
        self.idle_bytes_max = idle_bytes_max
        self._lock = threading.Lock()
        self._idle: dict[int, list[np.ndarray]] = {}
        self._idle_bytes = 0
        self.allocations = 0  # buffers made because none of the class was idle

    def take(self, size: int) -> np.ndarray:
        """A writable uint8 array of `size` bytes, owned by a lease (contents undefined).

        O(1); allocates only when no returned buffer of the size class is idle.
        """
        capacity = _size_class(size)
        with self._lock:
            free = self._idle.get(capacity)
            buffer = free.pop() if free else None
            if buffer is not None:
                self._idle_bytes -= capacity
        if buffer is None:
            buffer = np.empty(capacity, dtype=np.uint8)
            self.allocations += 1
        lease = _Lease(buffer, size)
        weakref.finalize(lease, self._give_back, buffer)
        return np.asarray(lease)

    def reserve(self, size: int, count: int) -> int:
        """Fault in `count` idle buffers of `size`'s class now, within
        `idle_bytes_max`; returns how many were added.

        For a long-lived reader that knows its reply sizes (the mount's
        runs): its first replies then land in memory already mapped instead
        of faulting pages in while the reader waits.
        """
        capacity = _size_class(size)
        added = 0
        while added < count and self._idle_bytes + capacity <= self.idle_bytes_max:
            buffer = np.empty(capacity, dtype=np.uint8)
            buffer[::_PAGE_BYTES] = 0  # one write per page maps it
            if not self._give_back(buffer):
                break
            added += 1
        return added

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    def _give_back(self, buffer: np.ndarray) -> bool:
        """Keep `buffer` for reuse; False if that would pass `idle_bytes_max`."""
        with self._lock:
            if self._idle_bytes + buffer.size > self.idle_bytes_max:
                return False  # dropped: freed when this reference goes
            self._idle.setdefault(buffer.size, []).append(buffer)
            self._idle_bytes += buffer.size
            return True

    def clear(self) -> None:
        """Free every idle buffer (leased ones return later and are kept, up to the bound)."""
        with self._lock:
            self._idle.clear()
            self._idle_bytes = 0


def _size_class(size: int) -> int:
    return max(limits.reply_buffer_bytes_min, 1 << max(size - 1, 0).bit_length())


def out_array(out, size: int) -> np.ndarray:
    """The first `size` bytes of the caller's buffer `out`, as a uint8 array (no copy).

    `out` is anything writable and contiguous with the buffer protocol (a
    bytearray, a numpy array, a tensor's `.numpy()`, a memoryview of shared
    memory).  Raises InvalidArgument when it is not, or holds fewer bytes.
    """
    try:
        target = out.reshape(-1).view(np.uint8) if isinstance(out, np.ndarray) \
            else np.frombuffer(out, dtype=np.uint8)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"out must be a writable, contiguous buffer ({exc})") from None
    if not target.flags.writeable or not target.flags.c_contiguous:
        raise InvalidArgument("out must be a writable, contiguous buffer")
    if target.size < size:
        raise InvalidArgument(f"out holds {target.size} bytes; the batch needs {size}")
    return target[:size]


def copy_into(out, samples: list) -> list[memoryview]:
    """`samples` written back to back into `out`; views of `out` in the same order.

    For transports that cannot receive into `out` directly (gRPC, several
    daemons, co-located mappings): one copy per sample, in C.
    """
    sizes = [len(s) for s in samples]
    target = out_array(out, sum(sizes))
    view = memoryview(target)
    result, at = [], 0
    for sample, size in zip(samples, sizes):
        target[at:at + size] = np.frombuffer(sample, dtype=np.uint8)
        result.append(view[at:at + size])
        at += size
    return result
