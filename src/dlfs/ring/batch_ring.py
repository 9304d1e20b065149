"""`BatchRing`: the training process's side of the read-ahead ring.

It owns the shared memory (one memfd mapped once, cut into page-aligned
slots) and the helper process (`dlfs.ring.helper.serve`), and hands out
each batch as a `Packed` view of its slot.  A slot comes back when the
parent's last reference to its array is gone (a `weakref.finalize` queues
it; the next `next_batch` or `start_epoch` call sends it), so nothing is
overwritten while reachable.
"""

from __future__ import annotations

import collections
import gc
import importlib
import logging
import mmap
import multiprocessing
import os
import time
import weakref
from multiprocessing import reduction

import numpy as np

from dlfs import limits
from dlfs.errors import Internal, InvalidArgument, Unavailable
from dlfs.training.pipeline import batch_count
from dlfs.ring.helper import serve
from dlfs.training.packing import Packed
from dlfs.ring.ring_channel import Channel, raise_error

log = logging.getLogger(__name__)

# How often a waiting parent checks that the helper is still alive.
_LIVENESS_POLL_S = 1.0


class BatchRing:
    """The parent's side: a helper process and `slots` shared buffers of `slot_bytes`.

    Not thread-safe: one consumer thread calls `start_epoch`/`next_batch`.
    Raises InvalidArgument for sizes over `limits.readahead_ring_bytes_max`,
    Unavailable when the helper cannot start or dies, and each batch's typed
    DLFS error at that batch.
    """

    # Rings of this process, for `region_of`.
    _live: "weakref.WeakSet[BatchRing]" = weakref.WeakSet()

    def __init__(self, ticket, *, slot_bytes: int, slots: int, context: str | None = None):
        if slots < 2 or slot_bytes < 1:
            raise InvalidArgument(f"a read-ahead ring needs at least 2 slots of at least 1 byte "
                                  f"(got {slots} of {slot_bytes})")
        slot_bytes = -(-slot_bytes // mmap.PAGESIZE) * mmap.PAGESIZE  # slots start on a page
        total = slot_bytes * slots
        if total > limits.readahead_ring_bytes_max:
            raise InvalidArgument(
                f"read-ahead buffers of {slots} x {slot_bytes} bytes exceed "
                f"{limits.readahead_ring_bytes_max} bytes; use smaller batches or fewer "
                "batches ahead")
        self.slot_bytes = slot_bytes
        self.slots = slots
        self._closed = True
        _import_helper_modules(ticket.options)
        fd = os.memfd_create("dlfs-readahead", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            self._memory = np.frombuffer(mmap.mmap(fd, total), dtype=np.uint8)
            self._address = self._memory.ctypes.data  # asked once: numpy's ctypes is slow
            BatchRing._live.add(self)
            ctx = multiprocessing.get_context(context)
            self._conn, child = ctx.Pipe()
            self._channel = Channel(self._conn)
            self._process = ctx.Process(
                target=serve, name="dlfs-readahead", daemon=True,
                args=(child, ticket, slot_bytes, slots))
            self._process.start()
            child.close()
            self._closed = False
            reduction.send_handle(self._conn, fd, self._process.pid)
        finally:
            os.close(fd)
        self._freed: collections.deque[int] = collections.deque()
        self._outstanding = 0  # slots handed out and not yet sent back
        self._epoch = 0
        self._next_number = self._batches = 0
        message = self._receive(limits.readahead_start_timeout_s)
        if message[0] != "ready":
            self.close()
            raise_error(message)

    def start_epoch(self, ids: np.ndarray, *, batch_size: int, drop_last: bool = False,
                    prefetch: int = 4, hint_ahead: int = 0, verify: bool = True,
                    trace_dir: str | None = None) -> None:
        """Begin reading `ids` in batches of `batch_size`; a running epoch is abandoned."""
        self._check_open()
        self._epoch += 1
        self._next_number = 0
        self._batches = batch_count(len(ids), batch_size, drop_last)
        self._send_freed()
        self._send(("epoch", self._epoch, np.asarray(ids, dtype=np.int64), batch_size,
                    drop_last, prefetch, hint_ahead, verify, trace_dir))

    def next_batch(self) -> Packed:
        """The epoch's next batch, its `data` a view of the batch's slot.

        The slot is reused once nothing refers to `data` or to any array or
        tensor made from it.  Raises InvalidArgument when every slot is
        still referenced by earlier batches (nothing could be read: keep a
        copy, ``data.copy()``, not the batch), and the batch's own error if
        its fetch failed.
        """
        self._check_open()
        if self._next_number >= self._batches:
            raise InvalidArgument(f"the read-ahead epoch has only {self._batches} batches")
        while True:
            self._send_freed()
            if self._outstanding >= self.slots and not self._channel.poll(0):
                gc.collect()  # a batch in a reference cycle is free only after a collection
                self._send_freed()
                if self._outstanding >= self.slots:
                    raise InvalidArgument(
                        f"all {self.slots} read-ahead buffers are still referenced by earlier "
                        "batches, so no batch can be read: a batch's memory is reused once it "
                        "is dropped; keep a copy (batch.copy(), tensor.clone()) instead")
            message = self._receive(None)
            if message[1] != self._epoch:  # left over from an abandoned epoch
                if message[0] == "batch":
                    self._send(("free", message[3]))
                continue
            if message[0] == "error":
                raise_error(message)
            _kind, _epoch, number, slot, count, size, ragged = message
            if number != self._next_number:
                raise Internal(f"read-ahead process sent batch {number}, expected "
                               f"{self._next_number}")
            self._next_number += 1
            lengths = None if ragged is None else np.frombuffer(ragged, dtype=np.int64)
            total = count * size if lengths is None else int(lengths.sum())
            lease = _SlotLease(self._memory, self._address + slot * self.slot_bytes, total)
            self._outstanding += 1
            weakref.finalize(lease, self._freed.append, slot)
            return Packed(np.asarray(lease), count, size, lengths)

    def cancel_epoch(self) -> None:
        """Stop reading the current epoch (its batches not yet taken are dropped)."""
        if not self._closed:
            self._epoch += 1
            try:
                self._send(("cancel", self._epoch - 1))
            except Unavailable:
                pass  # no helper, nothing to cancel

    def close(self) -> None:
        """Stop the helper (idempotent).  Batches handed out stay valid."""
        if self._closed:
            return
        self._closed = True
        try:
            self._channel.send(("stop",))
        except OSError:
            pass
        self._process.join(limits.readahead_stop_timeout_s)
        if self._process.is_alive():
            log.warning("read-ahead process %d did not stop within %g s; killing it",
                        self._process.pid, limits.readahead_stop_timeout_s)
            self._process.kill()
            self._process.join()
        self._conn.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    @classmethod
    def region_of(cls, address: int) -> tuple[int, int, np.ndarray] | None:
        """The ring memory holding byte `address` of this process: (start, end, array).

        The array maps the whole ring (keep it to keep the mapping, which
        outlives a closed ring while referenced), so a caller can register
        the ring once with a device driver (CUDA's page-locking) and use
        every batch in place.  None when no ring of this process holds it.
        Cost: O(rings).
        """
        for ring in list(cls._live):
            memory = getattr(ring, "_memory", None)
            if memory is not None and ring._address <= address < ring._address + memory.size:
                return ring._address, ring._address + memory.size, memory
        return None

    @property
    def closed(self) -> bool:
        """Whether the helper is stopped (closed, or found gone)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("the read-ahead ring is closed")

    def _send_freed(self) -> None:
        while self._freed:
            slot = self._freed.popleft()
            self._outstanding -= 1
            self._send(("free", slot))

    def _send(self, message) -> None:
        try:
            self._channel.send(message)
        except OSError:
            raise self._ended() from None

    def _ended(self) -> Unavailable:
        """Close after the helper went away; the error to raise for it."""
        self.close()
        return Unavailable(f"the read-ahead process ended (exit code "
                           f"{self._process.exitcode}); see its output above")

    def _receive(self, timeout: float | None):
        """The helper's next message; Unavailable if it dies or (with `timeout`) stays silent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._channel.poll(_LIVENESS_POLL_S):
            if not self._process.is_alive():
                self.close()
                raise Unavailable(f"the read-ahead process exited (code "
                                  f"{self._process.exitcode}); see its output above")
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise Unavailable(f"the read-ahead process did not start within {timeout:g} s")
        try:
            return self._channel.recv()
        except (EOFError, OSError):
            raise self._ended() from None


class _SlotLease:
    """The owner of one batch's bytes in the ring, as numpy sees it.

    ``np.asarray(lease)`` is the batch; every array, view or tensor made from
    it keeps the lease alive (a plain slice of the ring's array would keep
    only the whole ring alive), so the finalizer that returns the slot runs
    only when nothing can reach the batch's bytes any more.  The lease keeps
    the mapping alive too.
    """

    __slots__ = ("__array_interface__", "_memory", "__weakref__")

    def __init__(self, memory: np.ndarray, address: int, size: int):
        """`size` bytes at `address`, inside `memory` (which the lease keeps mapped)."""
        self._memory = memory
        self.__array_interface__ = {"data": (address, False),
                                    "shape": (size,), "typestr": "|u1", "version": 3}


def _import_helper_modules(client_options: dict) -> None:
    """Import what the helper runs lazily, so a forked helper starts without importing it."""
    importlib.import_module("dlfs.client.transport.datapath_transport")
    if client_options.get("direct"):
        importlib.import_module("dlfs.client.transport.direct_transport")
