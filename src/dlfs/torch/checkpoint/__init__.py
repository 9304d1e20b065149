"""torch.distributed.checkpoint (DCP) into DLFS checkpoint spaces, over the data path.

    import torch.distributed.checkpoint as dcp
    from dlfs.torch.checkpoint import DLFSReader, DLFSWriter

    step = "dlfs://127.0.0.1:7010/ckpt/run1/step100"   # daemon / space / directory
    dcp.save(state_dict, storage_writer=DLFSWriter(step))
    dcp.load(state_dict, storage_reader=DLFSReader(step))

The contract:

- **When a checkpoint is visible.**  Each rank's data files
  (`__{rank}_{n}.distcp`) are written and closed before the coordinator's
  `finish`; `finish` writes `.metadata.tmp`, closes it and renames it to
  `.metadata`.  A checkpoint exists from that rename on, whole: a reader
  sees step N entirely or not at all, and a save that died before its
  finish leaves no `.metadata` (`DLFSReader` raises NotFound, naming the
  directory).  Overwriting a directory removes its old `.metadata` before
  any new data file is written.
- **What is durable when `dcp.save` returns.**  Everything: each file's
  close returns once its bytes and its entry are on the daemon's disk
  (fsynced), and so does the rename.  A crash of the daemon after that
  loses nothing of the checkpoint; a crash before it loses at most the
  files not yet closed (so no `.metadata`: no checkpoint).
- **`dcp.async_save`** (thread or process executor) returns once the state
  dict is staged in CPU memory; the same holds when its future is done.
- **Restores** read each rank's items sorted by file and offset, joined into
  large ranges, several at once (`DLFSReader.last_read` tells how many).

Ids: `dlfs://HOST:PORT/SPACE/DIR`, or `dlfs:///SPACE/DIR` for $DLFS_SERVER
(else 127.0.0.1:7010); `validate_checkpoint_id` accepts exactly these.  The
space and directories are created by the first save.  The files are DCP's
own format: DCP's `FileSystemReader` reads them through a mount as well.

Modules: `checkpoint_ids` (ids, per-process clients), `dcp_writer`
(`DLFSWriter`), `dcp_reader` (`DLFSReader`), `read_runs` (how a restore's
reads are sorted, joined and cut).
"""

from dlfs.torch.checkpoint.checkpoint_ids import (CheckpointLocation, is_checkpoint_id,
                                                  parse_checkpoint_id)
from dlfs.torch.checkpoint.dcp_reader import DLFSReader, ReadStats
from dlfs.torch.checkpoint.dcp_writer import DLFSWriter

__all__ = ["CheckpointLocation", "DLFSReader", "DLFSWriter", "ReadStats", "is_checkpoint_id",
           "parse_checkpoint_id"]
