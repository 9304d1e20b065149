"""Ingest over the data path: the client side of `dlfs/proto/datapath.md`, "Ingest".

The same stream as the gRPC Ingest call (files in order, each file's CRC32C
on its last piece, counts at the end), in the data path's frames: the
pieces' headers and the file bytes go out in one `sendmsg` per megabyte or
so, no protobuf and no copy in Python: a fraction of the CPU per GB that
Python gRPC cost on each side (docs/DESIGN.md, "Staging and ingest").  Used by
`dlfs.client.ingest_upload.upload` whenever the daemon has a data path (not with
TLS), over its Unix socket on the same host, else TCP.
"""

from __future__ import annotations

from dlfs import limits, logs
from dlfs.formats import datapath_frames as frames
from dlfs.types import DatasetInfo

# Bytes of frames handed to one sendmsg, and how often to look for an ERROR.
_SEND_BYTES = 1024 * 1024
_BUFFERS_MAX = 512
_SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def send(data_path, name: str, chunks, *, replace: bool, resumable: bool,
         resume_from: int | None, dirs=()) -> DatasetInfo:
    """Ingest `chunks` ((file, data, last, crc) from `ingest.ordered_files`) as `name`,
    after the dataset's empty directories `dirs` (paths).

    Raises the daemon's typed errors, Unavailable when the connection breaks,
    and whatever `chunks` raises (the frames of the files before it are sent
    first, then the daemon sees the stream break off: a resumable ingest parks
    with them).
    """
    connection = data_path.dedicated()
    try:
        connection.start_ingest(
            frames.ingest_start(name, replace=replace, resumable=resumable,
                                resume_from=resume_from, request_id=logs.current_request_id()),
            limits.metadata_timeout_s_default)
        # With the default 208 KiB, a 1 MiB send waits for the daemon several times,
        # which capped an ingest on a loaded 2-core VM (log-ingest.md).
        connection.widen_send_buffer(_SOCKET_BUFFER_BYTES)
        buffers: list = []
        pending = files = data_bytes = 0
        for path in dirs:
            buffers.append(frames.piece(path.encode(), 0, first=True, last=False,
                                          directory=True))
            files += 1
        for file, data, last, crc in _flushed_on_error(chunks, connection, buffers):
            if file is not None:
                files += 1
                buffers.append(frames.piece(file.path.encode(), len(data), first=True,
                                              last=last, size=file.size, mode=file.mode,
                                              mtime_ns=file.mtime_ns, crc=crc if last else 0))
            else:
                buffers.append(frames.piece(b"", len(data), first=False, last=last,
                                              crc=crc if last else 0))
            if data:
                buffers.append(data)
            data_bytes += len(data)
            pending += len(data) + 64
            if pending >= _SEND_BYTES or len(buffers) >= _BUFFERS_MAX:
                connection.send_frames(buffers)
                connection.raise_pending()
                buffers.clear()
                pending = 0
        buffers.append(frames.ingest_end(files, data_bytes))
        connection.send_frames(buffers)
        name, generation, samples, size, created_ns, extents = connection.finish_ingest(
            limits.ingest_timeout_s_default)
    finally:
        connection.close()
    return DatasetInfo(name, samples, size, True, created_ns, extents, generation=generation)


def _flushed_on_error(chunks, connection, buffers: list):
    """`chunks`; when it raises (a source file cannot be read, Ctrl-C), the frames not
    sent yet in `buffers` go out first, so the daemon holds every file read before the
    failure.  The source's error is the one raised, whatever the send does."""
    iterator = iter(chunks)
    while True:
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        except BaseException:
            try:
                if buffers:
                    connection.send_frames(buffers)
            except Exception:  # noqa: BLE001 - the connection broke too: the source's error
                pass
            raise
        yield chunk
