"""Batches read ahead by a helper process into a ring of shared-memory slots.

    ring = BatchRing("127.0.0.1:7010", "demo", slot_bytes=256 * 110 * 1024, slots=6)
    ring.start_epoch(order_ids, batch_size=256, prefetch=4)
    for _ in range(batches):
        batch = ring.next_batch()           # Packed: the samples back to back in one slot
        images = batch.rows()               # [256, size] when they have one size
        ...                                 # the slot is reused once data (and every
                                            # view or tensor of it) is dropped
    ring.close()

Why a process: read-ahead threads in the training process fetch just as
fast, but they share its GIL.  Each get_batch, checksum and copy on such a
thread delays the training thread's next hand-off of the GIL; on 2 vCPUs
that cost about 1.3 ms per batch (85% utilisation at 8 ms of compute per
batch), against 0.1 ms when a helper process does the same work.  Why a
ring: a fresh shared-memory buffer per batch (what DataLoader workers use)
costs its allocation and a page fault per 4 KiB page, more than the copy;
slots are mapped once and reused.

The helper (`_serve`) is a plain DLFS client (direct or gRPC) running
`dlfs.pipeline.iter_batches` for the epoch's order and copying each batch
into a free slot, the samples back to back (`pack_into`); the parent gets
a `Packed` batch (its size per sample, or their lengths when they differ).
A slot comes back when the parent's last reference to its array is gone (a
`weakref.finalize` queues it; the next `next_batch` or `start_epoch` call
sends it), so nothing is overwritten while reachable.

Protocol over one duplex pipe (the ring itself is a memfd passed over it):
parent -> helper ``("epoch", n, ids, batch_size, drop_last, prefetch,
hint_ahead, verify, trace_dir)``, ``("free", slot)``, ``("cancel", n)``,
``("stop",)``; helper -> parent ``("ready",)``, ``("batch", n, number, slot,
count, size, ragged)`` (``ragged``: None when every sample has ``size``
bytes, else their int64 lengths as bytes), ``("error", n, number, kind,
message)``.  Messages of an
epoch the parent has left are dropped (their slots freed).  The helper
exits when told to, or when the pipe breaks (the parent is gone).
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
from typing import NamedTuple, Sequence

import numpy as np

from dlfs import errors, limits
from dlfs.errors import DlfsError, Internal, InvalidArgument, Unavailable
from dlfs.client import Client
from dlfs.pipeline import batch_count, iter_batches

log = logging.getLogger(__name__)

# How often a waiting parent checks that the helper is still alive.
_LIVENESS_POLL_S = 1.0
# madvise(MADV_POPULATE_WRITE), Linux 5.14+ (the mmap module does not name it).
_MADV_POPULATE_WRITE = 23


def _populate(mapping: mmap.mmap, start: int, length: int) -> None:
    """Map the pages of ``[start, start + length)`` for writing, in one call.

    Faulting them in one by one as a slot is first written costs several
    times more (about 10 ms per 7 MB slot on a small VM, against 3 ms).
    """
    try:
        mapping.madvise(_MADV_POPULATE_WRITE, start, length)
    except OSError:
        pass  # older kernel: the pages fault in as they are written


def pack_into(samples: Sequence, out: np.ndarray) -> np.ndarray:
    """Copy samples back to back into the flat uint8 array `out`; returns their lengths.

    Raises InvalidArgument when they do not fit.  Cost: O(total bytes),
    copied by numpy without the GIL.
    """
    lengths = _lengths(samples)
    _copy_back_to_back(samples, out, int(lengths.sum()))
    return lengths


class Packed(NamedTuple):
    """One batch from the ring: `count` samples back to back in `data` (flat uint8).

    `size` is every sample's size when they share one, else -1 and
    `lengths` holds each one's.  `data` (and every view of it) keeps the
    batch's slot; see `BatchRing.next_batch`.
    """

    data: np.ndarray
    count: int
    size: int
    lengths: np.ndarray | None = None

    def rows(self) -> np.ndarray:
        """The batch as a ``[count, size]`` view; InvalidArgument when the sizes differ."""
        size = self.size if self.lengths is None else _one_size(self.lengths)
        return self.data[:self.count * size].reshape(self.count, size)

    def sizes(self) -> np.ndarray:
        """Each sample's size (int64)."""
        if self.lengths is not None:
            return self.lengths
        return np.full(self.count, self.size, dtype=np.int64)


def stack_into(samples: Sequence, out: np.ndarray) -> np.ndarray:
    """Samples of one size copied into the flat uint8 `out`, as a ``[batch, size]`` view of it.

    Checks the sizes before copying (InvalidArgument, as `rows`).
    """
    size = _one_size(_lengths(samples))
    _copy_back_to_back(samples, out, len(samples) * size)
    return out[:len(samples) * size].reshape(len(samples), size)


def _lengths(samples: Sequence) -> np.ndarray:
    return np.fromiter((len(sample) for sample in samples), dtype=np.int64, count=len(samples))


def _copy_back_to_back(samples: Sequence, out: np.ndarray, total: int) -> None:
    if total > len(out):
        raise InvalidArgument(f"a batch of {total} bytes does not fit its {len(out)}-byte buffer")
    if total:
        np.concatenate([np.frombuffer(sample, dtype=np.uint8) for sample in samples],
                       out=out[:total])


def _one_size(lengths: np.ndarray) -> int:
    size = int(lengths[0]) if len(lengths) else 0
    other = np.flatnonzero(lengths != size)
    if len(other):
        raise InvalidArgument(
            f"a batch of raw samples is one [batch, size] array, so its samples need one "
            f"size: sample {int(other[0])} of the batch has {int(lengths[other[0]])} bytes, "
            f"sample 0 has {size}; give the dataset a transform (each sample transformed, "
            "then default_collate), or ask for a list of samples (ReadAhead(..., stack=False))")
    return size


class BatchRing:
    """The parent's side: a helper process and `slots` shared buffers of `slot_bytes`.

    Not thread-safe: one consumer thread calls `start_epoch`/`next_batch`.
    Raises InvalidArgument for sizes over `limits.readahead_ring_bytes_max`,
    Unavailable when the helper cannot start or dies, and each batch's typed
    DLFS error at that batch.
    """

    def __init__(self, address: str, dataset: str, *, slot_bytes: int, slots: int,
                 client_options: dict | None = None, context: str | None = None):
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
        _import_helper_modules(client_options or {})
        fd = os.memfd_create("dlfs-readahead", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            self._memory = np.frombuffer(mmap.mmap(fd, total), dtype=np.uint8)
            ctx = multiprocessing.get_context(context)
            self._conn, child = ctx.Pipe()
            self._process = ctx.Process(
                target=_serve, name="dlfs-readahead", daemon=True,
                args=(child, address, dataset, dict(client_options or {}), slot_bytes, slots))
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
            _raise(message)

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
            if self._outstanding >= self.slots and not self._conn.poll(0):
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
                _raise(message)
            _kind, _epoch, number, slot, count, size, ragged = message
            if number != self._next_number:
                raise Internal(f"read-ahead process sent batch {number}, expected "
                               f"{self._next_number}")
            self._next_number += 1
            lengths = None if ragged is None else np.frombuffer(ragged, dtype=np.int64)
            total = count * size if lengths is None else int(lengths.sum())
            lease = _SlotLease(self._memory, slot * self.slot_bytes, total)
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
            self._conn.send(("stop",))
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
            self._conn.send(message)
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
        while not self._conn.poll(_LIVENESS_POLL_S):
            if not self._process.is_alive():
                self.close()
                raise Unavailable(f"the read-ahead process exited (code "
                                  f"{self._process.exitcode}); see its output above")
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise Unavailable(f"the read-ahead process did not start within {timeout:g} s")
        try:
            return self._conn.recv()
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

    def __init__(self, memory: np.ndarray, start: int, size: int):
        self._memory = memory
        self.__array_interface__ = {"data": (memory.ctypes.data + start, False),
                                    "shape": (size,), "typestr": "|u1", "version": 3}


def _import_helper_modules(client_options: dict) -> None:
    """Import what the helper runs lazily, so a forked helper starts without importing it."""
    if client_options.get("direct"):
        importlib.import_module("dlfs.client.direct")


def _raise(message) -> None:
    """Raise the error a helper reported as ``("error", epoch, number, kind, text)``."""
    kind, text = message[3], message[4]
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, DlfsError)):
        cls = Internal
    raise cls(text)


def _report(conn, epoch: int, number: int, exc: BaseException) -> None:
    if isinstance(exc, DlfsError):
        conn.send(("error", epoch, number, type(exc).__name__, exc.message))
    else:
        conn.send(("error", epoch, number, "Internal",
                   f"read-ahead process failed: {type(exc).__name__}: {exc}"))


class _SpoolTimeline:
    """`dlfs.pipeline`'s timeline interface, writing spans to a `dlfs.profile` spool."""

    def __init__(self, spool_dir: str):
        self.spool_dir = spool_dir

    def record(self, name: str, start_ns: int, end_ns: int, *, cat: str = "io",
               args: dict | None = None) -> None:
        from dlfs import profile

        profile.spool_span(self.spool_dir, name, start_ns, end_ns, cat=cat, args=args)


def _serve(conn, address: str, dataset: str, client_options: dict, slot_bytes: int,
           slots: int) -> None:
    """The helper process: fill free slots with the current epoch's batches, in order."""
    client = pipeline = None
    try:
        try:
            fd = reduction.recv_handle(conn)
            mapping = mmap.mmap(fd, slot_bytes * slots)
            memory = np.frombuffer(mapping, dtype=np.uint8)
            os.close(fd)
            client = Client(address, **client_options)
            ds = client.dataset(dataset)
            ds.prepare()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            _report(conn, 0, -1, exc)
            return
        conn.send(("ready",))
        free = collections.deque(range(slots))
        unused = set(range(slots))  # slots whose pages are not mapped yet
        epoch = number = 0
        while True:
            while pipeline is None or not free or conn.poll(0):
                message = conn.recv()
                if message[0] == "free":
                    free.append(message[1])
                elif message[0] == "stop":
                    return
                elif message[0] in ("epoch", "cancel"):
                    if pipeline is not None:
                        pipeline.close()
                        pipeline = None
                    if message[0] == "epoch":
                        (_, epoch, ids, batch_size, drop_last, prefetch, hint_ahead, verify,
                         trace_dir) = message
                        number = 0
                        pipeline = iter_batches(
                            ds, ids, batch_size, prefetch=prefetch, hint_ahead=hint_ahead,
                            drop_last=drop_last, verify=verify,
                            timeline=_SpoolTimeline(trace_dir) if trace_dir else None)
            try:
                batch = next(pipeline)
                slot = free[0]
                if slot in unused:
                    unused.discard(slot)
                    _populate(mapping, slot * slot_bytes, slot_bytes)
                lengths = pack_into(batch.samples,
                                    memory[slot * slot_bytes:(slot + 1) * slot_bytes])
            except StopIteration:
                pipeline = None
                continue
            except Exception as exc:  # noqa: BLE001 - the parent raises it at this batch
                _report(conn, epoch, number, exc)
                pipeline.close()
                pipeline = None
                continue
            free.popleft()
            size = int(lengths[0]) if len(lengths) else 0
            ragged = None if (lengths == size).all() else lengths.tobytes()
            conn.send(("batch", epoch, number, slot, len(lengths), -1 if ragged else size,
                       ragged))
            number += 1
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent is gone or stopping: nothing to report to
    finally:
        if pipeline is not None:
            pipeline.close()
        if client is not None:
            client.close()
