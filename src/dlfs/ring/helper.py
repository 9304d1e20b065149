"""The helper process of a `BatchRing`: reads the epoch's batches into free ring slots.

`serve` is the process's whole life: a plain DLFS client (direct or gRPC)
running `dlfs.pipeline.iter_batches` for the epoch's order and copying each
batch into a free slot, the samples back to back (`pack_into`), then telling
the parent where it is (`dlfs.ring.protocol`).  Nothing here runs in the
training process.
"""

from __future__ import annotations

import collections
import mmap
import os
from multiprocessing import reduction

import numpy as np

from dlfs.client import Client
from dlfs.pipeline import iter_batches
from dlfs.profile import SpoolTimeline
from dlfs.ring.packing import pack_into
from dlfs.ring.protocol import report_error

# madvise(MADV_POPULATE_WRITE), Linux 5.14+ (the mmap module does not name it).
_MADV_POPULATE_WRITE = 23


def serve(conn, address: str, dataset: str, client_options: dict, slot_bytes: int,
          slots: int) -> None:
    """The helper process: fill free slots with the current epoch's batches, in order.

    Receives the ring's memfd first, then answers ``("ready",)`` or an
    error with number -1.  Returns when told to stop or when the pipe
    breaks; a failed batch is reported at its number and ends its epoch.
    """
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
            report_error(conn, 0, -1, exc)
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
                            timeline=SpoolTimeline(trace_dir) if trace_dir else None)
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
                report_error(conn, epoch, number, exc)
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


def _populate(mapping: mmap.mmap, start: int, length: int) -> None:
    """Map the pages of ``[start, start + length)`` for writing, in one call.

    Faulting them in one by one as a slot is first written costs several
    times more (about 10 ms per 7 MB slot on a small VM, against 3 ms).
    """
    try:
        mapping.madvise(_MADV_POPULATE_WRITE, start, length)
    except OSError:
        pass  # older kernel: the pages fault in as they are written
