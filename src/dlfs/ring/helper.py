"""The helper process of a `BatchRing`: reads the epoch's batches into free ring slots.

`serve` is the process's whole life: a DLFS client of its own (opened from
the parent's `DatasetTicket`, so it starts without a gRPC call) running
`dlfs.training.pipeline.iter_batches` for the epoch's order, each batch received
straight into a free slot, the samples back to back (`get_batch(out=)`:
over the data path no byte is copied in Python), then telling the parent
where it is (`dlfs.ring.ring_channel`).  Nothing here runs in the training
process.
"""

from __future__ import annotations

import collections
import mmap
import os
from multiprocessing import reduction

import numpy as np

from dlfs.training.pipeline import iter_batches
from dlfs.training.profile import SpoolTimeline
from dlfs.ring.ring_channel import Channel, report_error

# madvise(MADV_POPULATE_WRITE), Linux 5.14+ (the mmap module does not name it).
_MADV_POPULATE_WRITE = 23


class _Interrupted(Exception):
    """A message other than "free" arrived while waiting for a free slot."""


class _Slots:
    """The helper's view of the ring: which slots are free, and which batch fills which.

    `take(number, wait)` is the pipeline's `out`: it picks a free slot for
    batch `number` and returns the slot's memory, which the batch is
    received into.  With none free it reads the "free" messages the parent
    sent; without `wait` (other batches are in flight, whose delivery the
    parent may be waiting for) it then gives up (None), with `wait` it
    blocks for one.  Any other message that arrives meanwhile is kept for
    the main loop and ends the current pipeline (`_Interrupted`).
    """

    def __init__(self, channel: Channel, memory: np.ndarray, mapping: mmap.mmap,
                 slot_bytes: int, slots: int):
        self.channel = channel
        self.memory = memory
        self.mapping = mapping
        self.slot_bytes = slot_bytes
        self.free = collections.deque(range(slots))
        self.unused = set(range(slots))  # slots whose pages are not mapped yet
        self.filling: dict[int, int] = {}  # batch number -> slot, until delivered
        self.pending: collections.deque = collections.deque()  # messages for the main loop

    def take(self, number: int, wait: bool) -> np.ndarray | None:
        while not self.free:
            if not wait and not self.channel.poll(0):
                return None
            message = self.channel.recv()
            if message[0] != "free":
                self.pending.append(message)
                raise _Interrupted()
            self.free.append(message[1])
        slot = self.free.popleft()
        self.filling[number] = slot
        if slot in self.unused:
            self.unused.discard(slot)
            _populate(self.mapping, slot * self.slot_bytes, self.slot_bytes)
        return self.memory[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def delivered(self, number: int) -> int:
        """The slot batch `number` was received into; it is the parent's until freed."""
        return self.filling.pop(number)

    def abandon(self) -> None:
        """Batches of a closed pipeline will not be delivered: their slots are free again."""
        self.free.extend(self.filling.values())
        self.filling.clear()


def serve(conn, ticket, slot_bytes: int, slots: int) -> None:
    """The helper process: fill free slots with the current epoch's batches, in order.

    `ticket` is the parent's `DatasetTicket`: the helper reads with a
    client of its own that needs no gRPC call to start (the data path is
    known), and each batch is received straight into its slot.  Receives
    the ring's memfd first, then answers ``("ready",)`` or an error with
    number -1.  Returns when told to stop or when the pipe breaks; a failed
    batch is reported at its number and ends its epoch.
    """
    ds = pipeline = None
    channel = Channel(conn)
    try:
        try:
            fd = reduction.recv_handle(conn)
            mapping = mmap.mmap(fd, slot_bytes * slots)
            memory = np.frombuffer(mapping, dtype=np.uint8)
            os.close(fd)
            ds = ticket.open()
            ds.prepare()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            report_error(channel, 0, -1, exc)
            return
        channel.send(("ready",))
        ring = _Slots(channel, memory, mapping, slot_bytes, slots)
        epoch = number = 0
        while True:
            while pipeline is None or ring.pending or channel.poll(0):
                message = ring.pending.popleft() if ring.pending else channel.recv()
                if message[0] == "free":
                    ring.free.append(message[1])
                elif message[0] == "stop":
                    return
                elif message[0] in ("epoch", "cancel"):
                    if pipeline is not None:
                        pipeline.close()
                        pipeline = None
                        ring.abandon()
                    if message[0] == "epoch":
                        (_, epoch, ids, batch_size, drop_last, prefetch, hint_ahead, verify,
                         trace_dir) = message
                        number = 0
                        pipeline = iter_batches(
                            ds, ids, batch_size, prefetch=prefetch, hint_ahead=hint_ahead,
                            drop_last=drop_last, verify=verify, out=ring.take,
                            timeline=SpoolTimeline(trace_dir) if trace_dir else None)
            try:
                batch = next(pipeline)
            except StopIteration:
                pipeline = None
                continue
            except _Interrupted:
                pipeline.close()
                pipeline = None
                ring.abandon()
                continue
            except Exception as exc:  # noqa: BLE001 - the parent raises it at this batch
                report_error(channel, epoch, number, exc)
                pipeline.close()
                pipeline = None
                ring.abandon()
                continue
            slot = ring.delivered(number)
            lengths = np.fromiter((len(s) for s in batch.samples), dtype=np.int64,
                                  count=len(batch.samples))
            size = int(lengths[0]) if len(lengths) else 0
            ragged = None if (lengths == size).all() else lengths.tobytes()
            channel.send(("batch", epoch, number, slot, len(lengths), -1 if ragged else size,
                          ragged))
            number += 1
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent is gone or stopping: nothing to report to
    finally:
        if pipeline is not None:
            pipeline.close()
        if ds is not None:
            ds.client.close()


def _populate(mapping: mmap.mmap, start: int, length: int) -> None:
    """Map the pages of ``[start, start + length)`` for writing, in one call.

    Faulting them in one by one as a slot is first written costs several
    times more (log-train.md).
    """
    try:
        mapping.madvise(_MADV_POPULATE_WRITE, start, length)
    except OSError:
        pass  # older kernel: the pages fault in as they are written
