"""Batches read ahead by a helper process into a ring of shared-memory slots.

    ticket = DatasetTicket.of(Client("127.0.0.1:7010").dataset("demo"))
    ring = BatchRing(ticket, slot_bytes=256 * 110 * 1024, slots=6)
    ring.start_epoch(order_ids, batch_size=256, prefetch=4)
    for _ in range(batches):
        batch = ring.next_batch()           # Packed: the samples back to back in one slot
        images = batch.rows()               # [256, size] when they have one size
        ...                                 # the slot is reused once data (and every
                                            # view or tensor of it) is dropped
    ring.close()

Why a process: read-ahead threads in the training process fetch just as
fast, but they share its GIL.  Each get_batch, checksum and copy on such a
thread delays the training thread's next hand-off of the GIL, an order of
magnitude more per batch than when a helper process does the same work
(docs/DESIGN.md, "Training side").  Why a
ring: a fresh shared-memory buffer per batch (what DataLoader workers use)
costs its allocation and a page fault per 4 KiB page, more than the copy;
slots are mapped once and reused.

Modules, one side each:

- `batch_ring`: `BatchRing`, the training process's side (memory, slots,
  the helper's lifetime, batches handed out);
- `helper`: `serve`, the helper process's side (a DLFS client running
  `dlfs.training.pipeline.iter_batches`, each batch received into a free slot);
- `protocol`: the pipe messages between the two, and how errors travel;
- `packing`: samples back to back in a flat buffer (`pack_into`,
  `stack_into`, `Packed`), numpy only.
"""

from dlfs.ring.batch_ring import BatchRing
from dlfs.training.packing import Packed, one_size, pack_into, stack_into

__all__ = ["BatchRing", "Packed", "one_size", "pack_into", "stack_into"]
